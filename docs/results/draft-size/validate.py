"""How many tokens a synchronous drafter pass should draft (``SpecConfig.draft_size``), chosen on validation chat
requests (code to write, and code to explain in prose): ar and sync with each draft size, engines taking turns
request by request (the order reversed every other request), 128 tokens, greedy; per-request tok/s over ar's,
medians. Every output must equal ar's. Copies still run to block_size - 1 whatever the draft size.

    python docs/results/draft-size/validate.py MODEL N OUT.json SIZES    # e.g. qwen2.5-coder-0.5b 16 out.json 15,8,4
"""
import statistics
import sys
import time

import torch

import d3d
from bench.common import machine, write_json
from d3d.data.corpus import training_corpus
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.train.chat_data import chat_prompts

torch.set_grad_enabled(False)
name, n, out_path, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3], [int(s) for s in sys.argv[4].split(",")]
path = resolve_model(name)
target = d3d.load_model(path, weights="auto")
tok = d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
corpus = training_corpus(path)
sets = {s: chat_prompts(tok, corpus, 0.05, n, "validation", seed=1234, templates=1, explain=s == "explain")
        for s in ("code", "explain")}
stops = tok.stop_token_ids()
modes = {"ar": "ar", **{f"sync,draft_size={k}": f"sync draft_size={k}" for k in sizes}}
tok_s = {s: {m: [] for m in modes} for s in sets}
tau = {s: {m: [] for m in modes} for s in sets}
for s, prompts in sets.items():
    for i, p in enumerate(prompts):
        outs = {}
        for m, spec in (list(modes.items()) if i % 2 == 0 else list(modes.items())[::-1]):
            t = time.perf_counter()
            out = d3d.generate(target, p, max_new_tokens=128, spec=spec, drafter=drafter, stop_ids=stops)
            tok_s[s][m].append(len(out.tokens[0]) / (time.perf_counter() - t))
            tau[s][m].append(out.stats.tau if m != "ar" else 1.0)
            outs[m] = out.tokens[0]
        if any(o != outs["ar"] for o in outs.values()):
            raise SystemExit(f"{s} request {i}: a speculative output differs from ar")
        print(f"{s} {i + 1}/{len(prompts)}", file=sys.stderr, flush=True)
summary = {s: {m: {"median_tok_s": statistics.median(tok_s[s][m]),
                   "median_vs_ar": statistics.median(a / b for a, b in zip(tok_s[s][m], tok_s[s]["ar"])),
                   "mean_tau": statistics.mean(tau[s][m])} for m in modes} for s in sets}
for s in sets:
    for m in modes:
        r = summary[s][m]
        print(f"{s:8} {m:22} {r['median_tok_s']:6.1f} tok/s  {r['median_vs_ar']:.3f}x ar (median of per-request ratios)  "
              f"τ {r['mean_tau']:.2f}")
write_json(out_path, {"bench": "draft-size validation", "machine": machine(), "model": name, "n": n, "new_tokens": 128,
                      "summary": summary, "tok_s": tok_s, "tau": tau})
