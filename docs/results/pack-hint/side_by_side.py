"""ar on each packing beside sync, interleaved per request (8 validation chat requests x 128 tokens, fp32).

ar16 / ar1: ar with the target packed for 16 rows (d3d's) / for 1 row; sync: the defaults on the
16-row packing. Prints tok/s (prefill included) of each, the ratios, and whether ar1's greedy tokens
equal sync's.

    python docs/results/pack-hint/side_by_side.py TARGET_DIR > docs/results/pack-hint/side_by_side.txt
    python docs/results/pack-hint/side_by_side.py TARGET_DIR --reversed > docs/results/pack-hint/side_by_side_reversed.txt

--reversed: the 1-row model loaded and run first (was the first run's 1.28x an order artifact?).
"""
import statistics
import sys
import time

import d3d
import d3d.cpu.linear as cl
from d3d.data.corpus import training_corpus
from d3d.model.tokenizer import load_tokenizer
from d3d.train.chat_data import chat_prompts

T = sys.argv[1]
tok = load_tokenizer(T)
prompts = chat_prompts(tok, training_corpus(T), 0.05, 8, "validation", seed=1234, templates=1)
stops = tok.stop_token_ids()
order = (1, 16) if "--reversed" in sys.argv[2:] else (16, 1)
models = {}
for hint in order:
    cl.BATCH_HINT = hint
    models[hint] = d3d.load_model(T, dtype="float32")
    d3d.generate(models[hint], prompts[0][:32], max_new_tokens=4, stop_ids=[])
drafter = d3d.load_drafter("models/d3d-drafter-qwen2.5-coder-0.5b", target=models[16])
runs = {f"ar{h}": (lambda p, h=h: d3d.generate(models[h], p, max_new_tokens=128, stop_ids=stops)) for h in order}
runs["sync"] = lambda p: d3d.generate(models[16], p, max_new_tokens=128, stop_ids=stops, mode="sync", drafter=drafter)
runs["sync"](prompts[0][:32])
tok_s = {k: [] for k in runs}
equal = 0
for i, p in enumerate(prompts):
    out = {}
    for name, run in runs.items():
        t = time.perf_counter()
        out[name] = run(p).tokens[0]
        tok_s[name].append(len(out[name]) / (time.perf_counter() - t))
    equal += out["ar1"] == out["sync"] == out["ar16"]
    print(f"request {i}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in tok_s.items()), flush=True)
mean = {k: statistics.mean(v) for k, v in tok_s.items()}
print("mean tok/s: " + ", ".join(f"{k} {v:.2f}" for k, v in mean.items()))
print(f"ar1 / ar16 {mean['ar1'] / mean['ar16']:.3f}; sync / ar16 {mean['sync'] / mean['ar16']:.2f}x, "
      f"sync / ar1 {mean['sync'] / mean['ar1']:.2f}x; outputs equal in all three: {equal}/{len(prompts)}")
