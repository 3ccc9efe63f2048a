"""The fp32 panel matmul on validation requests: which leaves count to ship with it (A/B, fp32 CPU).

Modes, interleaved per request with the order rotated each request (the machine's speed drifts):
ar1 (ar on oneDNN weights packed for 1 row: the fastest ar before the panels), ar (ar on the panels,
the default fp32 layout on AVX2), sync (the defaults: no leaves in fp32 on a CPU) and sync-leaves2.
Speculative outputs must equal ar's (the panels are row-invariant); tok/s include the prefill.

    PYTHONPATH=. python docs/results/panels/ab.py TARGET_DIR [N] > docs/results/panels/ab.txt
"""
import sys
import time

import d3d
from d3d.cpu import linear as cpu_linear
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
print(f"fp32 layout: {type(getattr(target.output_weight(), cpu_linear.ATTR)).__name__}", flush=True)


def run(name, prompt):
    if name == "ar1":
        with cpu_linear.one_row_layout():
            return d3d.generate(target, prompt, max_new_tokens=128, stop_ids=stops)
    if name == "ar":
        return d3d.generate(target, prompt, max_new_tokens=128, stop_ids=stops)
    return d3d.generate(target, prompt, max_new_tokens=128, stop_ids=stops, mode="sync", drafter=drafter,
                        leaves=2 if name == "sync-leaves2" else None)


MODES = ["ar1", "ar", "sync", "sync-leaves2"]
run("sync", [1, 2, 3])  # warm-up
run("ar1", [1, 2, 3])  # makes the 1-row copies
for explain in (False, True):
    name = "explain" if explain else "code"
    prompts = chat_prompts(tok, corpus, 0.05, N, "validation", seed=1234, templates=1, explain=explain)
    acc = {m: {"tokens": 0, "seconds": 0.0, "rounds": 0, "verified": 0, "leaf_hits": 0, "equal": 0, "equal1": 0}
           for m in MODES}
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
            a["verified"] += s.verified_drafts + s.verified_leaves
            a["leaf_hits"] += s.leaf_hits
        for m in MODES:
            acc[m]["equal"] += outs[m] == outs["ar"]
            acc[m]["equal1"] += outs[m] == outs["ar1"]
        print(f"{name} request {i + 1}/{N}: " + ", ".join(f"{m} {acc[m]['tokens'] / acc[m]['seconds']:.2f}"
                                                         for m in MODES), file=sys.stderr, flush=True)
    base = max(acc[m]["tokens"] / acc[m]["seconds"] for m in ("ar1", "ar"))
    print(f"## {name}: {N} validation requests x <= 128 tokens; x = over the faster of ar1 and ar")
    for m, a in acc.items():
        r = max(a["rounds"], 1)
        tps = a["tokens"] / a["seconds"]
        tau = (a["tokens"] - N) / r if a["rounds"] else float("nan")  # the prefill's token is no round's
        print(f"{m:13s} {tps:6.2f} tok/s {tps / base:5.2f}x  τ {tau:.2f}  rows verified/round {a['verified'] / r:.2f}"
              f"  leaf hits/round {a['leaf_hits'] / r:.2f}  outputs equal ar {a['equal']}/{N}, ar1 {a['equal1']}/{N}",
              flush=True)
