"""The drafting gate (``RowPrice.draft``) before and after it stopped charging drafting for the drafter's
prefill and catch-ups (``Round.caught_up``) and probed drafting for 3 rounds instead of 1: ar, the defaults
(sync) and the drafter alone (sync,lookup=0) each both ways, and each with the fixed cut 0.1, on validation
chat requests (code to write, code to explain in prose), 128 tokens, greedy. The runs of a request take
turns (the order reversed every other request); medians of tok/s and of per-request ratios over ar.
"Before" is the same code with the catch-up flag dropped and one-round probes. Every output must equal ar.

    python docs/results/gate-catchup/compare.py MODEL N OUT.json [--sets code explain]
"""
import statistics
import sys
import time

import torch

import d3d
import d3d.decode.speculative as spec_mod
from bench.common import machine, write_json
from d3d.data.corpus import training_corpus
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.train.chat_data import chat_prompts

torch.set_grad_enabled(False)
name, n, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
set_names = sys.argv[sys.argv.index("--sets") + 1:] if "--sets" in sys.argv else ["code", "explain"]
path = resolve_model(name)
target = d3d.load_model(path, weights="auto")
tok = d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
corpus = training_corpus(path)
sets = {s: chat_prompts(tok, corpus, 0.05, n, "validation", seed=1234, templates=1, explain=s == "explain")
        for s in set_names}

prepare, price_init = spec_mod.Drafting.prepare, spec_mod.RowPrice.__init__


def run(engine: str, before: bool, prompt):
    """One generation; ``before``: the gate as it was (every drafting round charged, one-round probes)."""
    if before:
        spec_mod.Drafting.prepare = lambda self, *a, **k: prepare(self, *a, **k)[:3] + (False,)
        spec_mod.RowPrice.__init__ = lambda self, *a, **k: price_init(self, *a, **{**k, "probe_rounds": 1})
    try:
        t = time.perf_counter()
        out = d3d.generate(target, prompt, max_new_tokens=128, spec=engine, drafter=drafter,
                           stop_ids=tok.stop_token_ids())
        return out.tokens[0], len(out.tokens[0]) / (time.perf_counter() - t), out.stats.tau
    finally:
        spec_mod.Drafting.prepare, spec_mod.RowPrice.__init__ = prepare, price_init


runs = [("ar", False), ("sync", True), ("sync", False), ("sync,verify_min_prob=0.1", False),
        ("sync,lookup=0", True), ("sync,lookup=0", False), ("sync,lookup=0,verify_min_prob=0.1", False)]
key = {r: r[0] + (", before" if r[1] else "") for r in runs}
tok_s = {s: {key[r]: [] for r in runs} for s in sets}
tau = {s: {key[r]: [] for r in runs} for s in sets}
for s, prompts in sets.items():
    for i, p in enumerate(prompts):
        outs = {}
        for r in (runs if i % 2 == 0 else runs[::-1]):
            outs[r], speed, t = run(*r, p)
            tok_s[s][key[r]].append(speed)
            tau[s][key[r]].append(t)
        if any(o != outs["ar", False] for o in outs.values()):
            raise SystemExit(f"{s} request {i}: an output differs from ar's")
        print(f"{s} {i + 1}/{len(prompts)}", file=sys.stderr, flush=True)
summary = {s: {key[r]: {"median_tok_s": round(statistics.median(tok_s[s][key[r]]), 2),
                        "median_tau": round(statistics.median(tau[s][key[r]]), 3) if r[0] != "ar" else None,
                        "median_vs_ar": round(statistics.median(
                            a / b for a, b in zip(tok_s[s][key[r]], tok_s[s]["ar"])), 3)} for r in runs}
           for s in sets}
for s in sets:
    for r in runs:
        v = summary[s][key[r]]
        print(f"{s:8} {key[r]:36} {v['median_tok_s']:6.1f} tok/s  tau {v['median_tau']}  {v['median_vs_ar']:.3f}x ar")
write_json(out_path, {"bench": "drafting gate before/after catch-up exclusion", "machine": machine(), "model": name,
                      "n": n, "new_tokens": 128, "summary": summary, "tok_s": tok_s, "tau": tau})
