"""End to end, the decoder layers as Python modules (``cpu_layers = False``) against one C++ call
(``d3d.kernels.layers_cpu``): ar and the defaults (sync) on validation chat requests (code to write, code to
explain in prose; with --windows, for the bundled target: 64-token windows of validation code),
128 tokens, greedy; the four runs of a request take turns (the order reversed every other request); tok/s
medians and medians of per-request ratios. Every output must equal ar's with the Python layers.

    python docs/results/layers-cpu/e2e.py MODEL N OUT.json [--windows]     # MODEL: a real model's name or a directory
"""
import statistics
import sys
import time

import torch

import d3d
from bench.common import machine, write_json
from d3d.data.corpus import training_corpus
from d3d.data.prompts import heldout_prompts
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.train.chat_data import chat_prompts

torch.set_grad_enabled(False)
name, n, out_path, windows = sys.argv[1], int(sys.argv[2]), sys.argv[3], "--windows" in sys.argv[4:]
path = resolve_model(name)
target = d3d.load_model(path, weights="auto")
tok = d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
corpus = training_corpus(path)
if not windows:
    sets = {s: chat_prompts(tok, corpus, 0.05, n, "validation", seed=1234, templates=1, explain=s == "explain")
            for s in ("code", "explain")}
    stops = tok.stop_token_ids()
else:
    sets, stops = {"code": heldout_prompts(tok, corpus, 0.05, n, 64, part="validation")}, []
runs = [(engine, fused) for engine in ("ar", "sync") for fused in (False, True)]
key = {r: f"{r[0]}, {'one call' if r[1] else 'Python layers'}" for r in runs}
tok_s = {s: {key[r]: [] for r in runs} for s in sets}
for s, prompts in sets.items():
    for i, p in enumerate(prompts):
        outs = {}
        for engine, fused in (runs if i % 2 == 0 else runs[::-1]):
            target.cpu_layers = drafter.model.cpu_layers = fused
            t = time.perf_counter()
            out = d3d.generate(target, p, max_new_tokens=128, spec=engine, drafter=drafter, stop_ids=stops)
            tok_s[s][key[engine, fused]].append(len(out.tokens[0]) / (time.perf_counter() - t))
            outs[engine, fused] = out.tokens[0]
        if any(o != outs["ar", False] for o in outs.values()):
            raise SystemExit(f"{s} request {i}: an output differs from ar's with the Python layers")
        print(f"{s} {i + 1}/{len(prompts)}", file=sys.stderr, flush=True)
base = {"ar": key["ar", False], "sync": key["sync", False]}
summary = {s: {key[r]: {"median_tok_s": round(statistics.median(tok_s[s][key[r]]), 2),
                        "median_vs_python_layers": round(statistics.median(
                            a / b for a, b in zip(tok_s[s][key[r]], tok_s[s][base[r[0]]])), 3),
                        "median_vs_ar_python_layers": round(statistics.median(
                            a / b for a, b in zip(tok_s[s][key[r]], tok_s[s][base["ar"]])), 3)} for r in runs}
           for s in sets}
for s in sets:
    for r in runs:
        v = summary[s][key[r]]
        print(f"{s:8} {key[r]:24} {v['median_tok_s']:6.1f} tok/s  {v['median_vs_python_layers']:.3f}x its Python layers  "
              f"{v['median_vs_ar_python_layers']:.3f}x ar before")
write_json(out_path, {"bench": "layers_cpu end to end", "machine": machine(), "model": name, "n": n,
                      "new_tokens": 128, "summary": summary, "tok_s": tok_s})
