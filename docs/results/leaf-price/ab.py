"""Leaves priced like drafts under verify_min_prob="auto", on validation requests only (A/B, fp32 CPU).

Modes, interleaved per request with the order rotated each request (the machine's speed drifts):
ar1 (ar on weights packed for 1 row: the fastest ar), sync (defaults: auto also cuts leaves whose
estimated hit probability is below the round's threshold), sync-unpriced (the same with every leaf
verified, as before: ``Drafting.leaves`` patched to ignore the threshold) and sync-noleaves (leaves=0).
Every output must equal ar1's... or is reported; tok/s include the prefill.

    PYTHONPATH=. python docs/results/leaf-price/ab.py TARGET_DIR [N] > docs/results/leaf-price/ab.txt
"""
import statistics
import sys
import time

import d3d
from d3d.cpu import linear as cpu_linear
from d3d.decode import speculative
from d3d.data.corpus import training_corpus
from d3d.model.tokenizer import load_tokenizer
from d3d.train.chat_data import chat_prompts

T = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8
tok = load_tokenizer(T)
corpus = training_corpus(T)
stops = tok.stop_token_ids()
target = d3d.load_model(T, dtype="float32")
drafter = d3d.load_drafter("models/d3d-drafter-qwen2.5-coder-0.5b", target=target)
priced = speculative.Drafting.leaves


def unpriced(self, draft, n, min_score=0.0):
    return priced(self, draft, n, 0.0)


def run(name, prompt):
    if name == "ar1":
        with cpu_linear.one_row_layout():
            return d3d.generate(target, prompt, max_new_tokens=128, stop_ids=stops)
    speculative.Drafting.leaves = unpriced if name == "sync-unpriced" else priced
    try:
        return d3d.generate(target, prompt, max_new_tokens=128, stop_ids=stops, mode="sync", drafter=drafter,
                            leaves=0 if name == "sync-noleaves" else None)
    finally:
        speculative.Drafting.leaves = priced


MODES = ["ar1", "sync", "sync-unpriced", "sync-noleaves"]
run("sync", [1, 2, 3])  # warm-up
for explain in (False, True):
    name = "explain" if explain else "code"
    prompts = chat_prompts(tok, corpus, 0.05, N, "validation", seed=1234, templates=1, explain=explain)
    acc = {m: {"tokens": 0, "seconds": 0.0, "rounds": 0, "leaves": 0, "leaf_hits": 0, "equal": 0} for m in MODES}
    for i, p in enumerate(prompts):
        order = MODES[i % len(MODES):] + MODES[:i % len(MODES)]
        outs = {}
        for m in order:
            t = time.perf_counter()
            out = run(m, p)
            dt = time.perf_counter() - t
            outs[m], s, a = out.tokens, out.stats, acc[m]
            a["tokens"] += s.total_generated
            a["seconds"] += dt
            a["rounds"] += s.rounds
            a["leaves"] += s.verified_leaves
            a["leaf_hits"] += s.leaf_hits
        for m in MODES:
            acc[m]["equal"] += outs[m] == outs["ar1"]
        print(f"{name} request {i + 1}/{N}: " + ", ".join(f"{m} {acc[m]['tokens'] / acc[m]['seconds']:.2f}"
                                                         for m in MODES), file=sys.stderr, flush=True)
    base = acc["ar1"]["tokens"] / acc["ar1"]["seconds"]
    print(f"## {name}: {N} validation requests x <= 128 tokens")
    for m, a in acc.items():
        r = max(a["rounds"], 1)
        tps = a["tokens"] / a["seconds"]
        tau = (a["tokens"] - N) / r if a["rounds"] else float("nan")  # the prefill's token is no round's
        print(f"{m:14s} {tps:6.2f} tok/s {tps / base:5.2f}x  τ {tau:.2f}"
              f"  leaves/round {a['leaves'] / r:.2f}  leaf hits/round {a['leaf_hits'] / r:.2f}"
              f"  outputs equal ar1 {a['equal']}/{N}", flush=True)
