"""How fast can Qwen2.5-Coder-0.5B-Instruct label drafter training data on this CPU (issue 16)?

Side by side in one process, in the dtype policy's choice: (a) batched greedy generation of chat
answers (labels = generated tokens, one per row per pass), (b) teacher forcing (one pass over a
window labels every position). Prints labels per second and hours per 10M labels.

    python docs/results/real-drafter/labelling_throughput.py DIR [--out FILE]
"""
import argparse, json, sys, time

import torch

import d3d
from d3d.train.chat_data import chat_prompts
from d3d.train.drafter import teacher_labels

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--out")
args = ap.parse_args()
sys.path.insert(0, ".")
from bench.common import machine  # noqa: E402

torch.set_grad_enabled(False)
model, tok = d3d.load_model(args.model), d3d.load_tokenizer(args.model)
res = {"dtype": str(model.dtype), "machine": machine()}
for batch in (16, 64):
    prompts = chat_prompts(tok, None, 0.05, batch, "train", seed=batch)
    t = time.perf_counter()
    out = d3d.generate(model, prompts, max_new_tokens=24, stop_ids=[])
    dt = time.perf_counter() - t
    res[f"generate_batch{batch}"] = out.stats.total_generated / dt
windows = torch.randint(0, 150000, (8, 257))
for rows in (1, 4):
    t = time.perf_counter()
    teacher_labels(model, windows[:rows], batch=rows)
    res[f"teacher_{rows}x256"] = rows * 256 / (time.perf_counter() - t)
for k, v in res.items():
    if isinstance(v, float):
        print(f"{k:22s} {v:8.0f} labels/s   {1e7 / v / 3600:6.1f} h per 10M")
if args.out:
    json.dump(res, open(args.out, "w"), indent=2)
