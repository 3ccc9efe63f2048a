"""sync's defaults with the last layer carrying every row past attention (``before``) and the wanted rows alone
(``now``, ``Transformer._last_layer_rows``), beside ar (which has it now): decoded tokens per second (prefill
excluded) over ar's, medians of per-request ratios, τ, the drafter's ms a pass, and each run's prefill ms; every
output must equal ar's. The runs of a request take turns, the order reversed every other request. Run from the
repository root:

    python docs/results/last-layer-rows/validate.py MODEL SETS OUT.json [--reps N]

SETS, comma-separated, as ``bench.common.request_sets`` names them (validation: code, explain, mtbench; evaluation,
reported only: humaneval, mtbench-eval, library).
"""
import statistics
import sys

import torch

import d3d
from bench.common import machine, print_runs_over_ar, request_done, request_sets, runs_over_ar, turns, write_json
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.model.transformer import Transformer

torch.set_grad_enabled(False)
name, wanted, out_path, *args = sys.argv[1:]
reps = int(args[args.index("--reps") + 1]) if "--reps" in args else 1
runs = ["ar", "before", "now"]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
sets = request_sets(tok, path, wanted.split(","))
now = Transformer._last_layer_rows
tok_s, tau, pass_ms, prefill_ms = ({s: {r: [] for r in runs} for s in sets} for _ in range(4))
for rep, s, i, p, order in turns(sets, runs, reps):
    outs = {}
    for r in order:
        Transformer._last_layer_rows = (lambda self, x, index, wanted: None) if r == "before" else now
        out = d3d.generate(target, p, max_new_tokens=128, spec="ar" if r == "ar" else "sync", drafter=drafter,
                           stop_ids=tok.stop_token_ids())
        outs[r], st = out.tokens[0], out.stats
        tok_s[s][r].append(st.total_generated / st.decode_seconds)
        tau[s][r].append(st.tau)
        prefill_ms[s][r].append(1e3 * st.prefill_seconds)
        if st.drafter_forwards:
            pass_ms[s][r].append(1e3 * st.draft_seconds / st.drafter_forwards)
    Transformer._last_layer_rows = now
    request_done(outs, tok_s[s], f"rep {rep + 1} {s} {i + 1}/{len(sets[s])}")
summary = {s: runs_over_ar(tok_s[s], tau[s]) for s in sets}
for s in sets:
    print_runs_over_ar(s, summary[s])
    over = [a / b for a, b in zip(tok_s[s]["now"], tok_s[s]["before"])]
    summary[s]["now"]["median_over_before"] = round(statistics.median(over), 3)
    for r in runs:
        summary[s][r]["median_prefill_ms"] = round(statistics.median(prefill_ms[s][r]), 1)
        summary[s][r]["median_pass_ms"] = round(statistics.median(pass_ms[s][r]), 3) if pass_ms[s][r] else None
    print(f"{s:9} now over before {summary[s]['now']['median_over_before']}; drafter ms a pass "
          f"{summary[s]['before']['median_pass_ms']} -> {summary[s]['now']['median_pass_ms']}; prefill ms "
          f"{summary[s]['before']['median_prefill_ms']} -> {summary[s]['now']['median_prefill_ms']}")
write_json(out_path, {"bench": "last layer: every row vs the wanted rows, one sequence", "machine": machine(),
                      "model": name, "sets": {s: len(p) for s, p in sets.items()}, "reps": reps, "new_tokens": 128,
                      "decode_only": True, "summary": summary, "tok_s": tok_s, "tau": tau, "pass_ms": pass_ms,
                      "prefill_ms": prefill_ms})
