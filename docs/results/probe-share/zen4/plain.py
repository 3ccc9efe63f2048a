"""Where sync's gain and loss on prose come from, one sequence: ar against sync's variants on the same requests,
the runs taking turns (the order reversed every other request), decoding tok/s over ar, medians; every output
checked equal to ar's. Run from the repository root:

    python docs/results/probe-share/zen4/plain.py MODEL SETS OUT.json [REPS] [RUNS]

SETS: names of ``bench.common.request_sets``. RUNS, comma-separated (default ar,now,plain): ``ar``; ``now`` (the
defaults); ``plain`` (the drafter never asked: plain steps and copies, ``RowPrice.draft`` held at False); ``bare``
(plain steps only: no drafter, ``lookup=0``); ``nolookup`` (the defaults with ``lookup=0``).
"""
import sys

import torch

import d3d
from bench.common import machine, print_runs_over_ar, request_done, request_sets, runs_over_ar, turns, write_json
from d3d.decode import row_price
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model

torch.set_grad_enabled(False)
name, wanted, out_path = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 1
runs = sys.argv[5].split(",") if len(sys.argv) > 5 else ["ar", "now", "plain"]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
sets = request_sets(tok, path, wanted)
draft_now = row_price.RowPrice.draft
SPECS = {"now": "sync", "plain": "sync", "bare": "sync lookup=0", "nolookup": "sync lookup=0"}


def run(engine: str, prompt):
    if engine in ("plain", "bare"):
        row_price.RowPrice.draft = lambda self, rows: False
    try:
        out = d3d.generate(target, prompt, max_new_tokens=128, spec=SPECS.get(engine, "ar"), drafter=drafter,
                           stop_ids=tok.stop_token_ids())
        return out.tokens[0], out.stats.total_generated / out.stats.decode_seconds, out.stats.tau
    finally:
        row_price.RowPrice.draft = draft_now


tok_s = {s: {r: [] for r in runs} for s in sets}
tau = {s: {r: [] for r in runs} for s in sets}
for rep, s, i, p, order in turns(sets, runs, reps):
    outs = {}
    for r in order:
        outs[r], speed, t = run(r, p)
        tok_s[s][r].append(speed)
        tau[s][r].append(t)
    request_done(outs, tok_s[s], f"rep {rep + 1} {s} {i + 1}/{len(sets[s])}")
summary = {s: runs_over_ar(tok_s[s], tau[s]) for s in sets}
for s in sets:
    print_runs_over_ar(s, summary[s])
write_json(out_path, {"bench": "sync's variants against ar, one sequence", "machine": machine(), "model": name,
                      "reps": reps, "new_tokens": 128, "decode_only": True, "summary": summary, "tok_s": tok_s,
                      "tau": tau})
