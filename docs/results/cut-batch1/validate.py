"""One sequence on a CPU: which drafts to verify. The default (``verify_min_prob=auto``: the measured row price
R * b as the cut, and the gate that takes plain steps while they measure faster than drafting rounds) against
the same cut with the gate off and fixed cuts, on validation chat requests: code to write, code to explain in
prose (the trainer's validation functions), and 8 MT-Bench questions kept for validation (indices 6-9, 61, 65,
71, 75; evaluation asks the first ones). 128 tokens, greedy; the runs of a request take turns (the order
reversed every other request); medians of tok/s and of per-request ratios over ar. Every output must equal ar.

    python docs/results/cut-batch1/validate.py MODEL N OUT.json [--runs ar sync "sync, no gate" ...]

Runs: ``ar``, any ``generate --spec`` string, "sync, no gate" (the defaults with ``PricedCut``'s gate off) and
"sync, gate before" (the defaults with the row price before the gate stopped counting the drafter's catch-up
passes: ``before.py`` reads it from git; run from the repository root). Default runs: ar, sync, sync with no
gate, and the fixed cuts 0.05, 0.1, 0.2 (``validation_*.json``).
"""
import sys
import time

import torch

sys.path.insert(0, "docs/results/cut-batch1")
from before import row_price_before  # noqa: E402

import d3d
from bench.common import machine, print_runs_over_ar, runs_over_ar, write_json
from d3d.data.corpus import training_corpus
from d3d.data.prompts import mtbench_prompts
from d3d.decode import row_price, speculative
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.train.chat_data import chat_prompts

MTBENCH_VALIDATION = [6, 7, 8, 9, 61, 65, 71, 75]
torch.set_grad_enabled(False)
name, n, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = (sys.argv[sys.argv.index("--runs") + 1:] if "--runs" in sys.argv else
        ["ar", "sync", "sync, no gate"] + [f"sync,verify_min_prob={c}" for c in (0.05, 0.1, 0.2)])
path = resolve_model(name)
target = d3d.load_model(path, weights="auto")
tok = d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
corpus = training_corpus(path)
questions = mtbench_prompts()
sets = {s: chat_prompts(tok, corpus, 0.05, n, "validation", seed=1234, templates=1, explain=s == "explain")
        for s in ("code", "explain")}
sets["mtbench"] = [tok.encode_chat([{"role": "user", "content": questions[i]}]) for i in MTBENCH_VALIDATION]
gated, price_now = row_price.PricedCut.drafts, speculative.RowPrice


def run(engine: str, prompt):
    """One generation of ``engine`` (the module docstring's runs)."""
    if engine == "sync, no gate":
        row_price.PricedCut.drafts = lambda self, price, rows: True
    if engine == "sync, gate before":
        speculative.RowPrice = row_price_before().RowPrice
    try:
        t = time.perf_counter()
        out = d3d.generate(target, prompt, max_new_tokens=128, spec=engine.split(",")[0] if "gate" in engine
                           else engine, drafter=drafter, stop_ids=tok.stop_token_ids())
        return out.tokens[0], len(out.tokens[0]) / (time.perf_counter() - t), out.stats.tau
    finally:
        row_price.PricedCut.drafts, speculative.RowPrice = gated, price_now


tok_s = {s: {r: [] for r in runs} for s in sets}
tau = {s: {r: [] for r in runs} for s in sets}
for s, prompts in sets.items():
    for i, p in enumerate(prompts):
        outs = {}
        for r in (runs if i % 2 == 0 else runs[::-1]):
            outs[r], speed, t = run(r, p)
            tok_s[s][r].append(speed)
            tau[s][r].append(t)
        if any(o != outs["ar"] for o in outs.values()):
            raise SystemExit(f"{s} request {i}: an output differs from ar's")
        print(f"{s} {i + 1}/{len(prompts)}", file=sys.stderr, flush=True)
summary = {s: runs_over_ar(tok_s[s], tau[s]) for s in sets}
for s in sets:
    print_runs_over_ar(s, summary[s])
write_json(out_path, {"bench": "cut and gate for one sequence", "machine": machine(), "model": name, "n": n,
                      "mtbench_validation": MTBENCH_VALIDATION, "new_tokens": 128, "summary": summary,
                      "tok_s": tok_s, "tau": tau})
