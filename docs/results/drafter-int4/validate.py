"""The drafter's matrices in int4 (groups of 32, requantized from the stored int8 at load) against int8, beside the
real quantized target: sync's defaults over ar, decoded tokens per second (prefill excluded), medians of per-request
ratios, τ, and the drafter's seconds a pass; every output must equal ar's. The runs of a request take turns, the
order reversed every other request. Run from the repository root:

    python docs/results/drafter-int4/validate.py MODEL SETS OUT.json [--reps N] [--runs RUN ...]

SETS, comma-separated. Validation: ``code``, ``explain`` (8 validation requests each, as cut-batch1/validate.py),
``mtbench`` (its 8 validation questions). Evaluation, reported only: ``humaneval`` (8 chat requests),
``mtbench-eval`` (questions 0-5, 10, 11), ``library`` (8 requests about held-out library functions).
RUN: ``ar``, ``int8`` (the drafter's matrices int8), ``int4`` (all int4), ``int4-body`` (its layers int4, the head
int8).
"""
import statistics
import sys

import torch

import d3d
from bench.common import machine, print_runs_over_ar, request_done, request_sets, runs_over_ar, turns, write_json
from d3d.assets import models_dir
from d3d.cpu.quant import quantize
from d3d.draft.drafter import load_drafter
from d3d.fetch import resolve_model
from d3d.model.transformer import QuantLinear

torch.set_grad_enabled(False)
name, wanted, out_path, *args = sys.argv[1:]
reps = int(args[args.index("--reps") + 1]) if "--reps" in args else 1
runs = [r for r in args[args.index("--runs") + 1:] if r != "--reps" and not r.isdigit()] if "--runs" in args \
    else ["ar", "int8", "int4"]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
sets = request_sets(tok, path, wanted.split(","))


def drafter(how: str):
    d = load_drafter(models_dir() / "d3d-drafter-qwen2.5-coder-0.5b", target=target, weights="int8")
    for n, mod in list(d.model.named_modules()):
        if how != "int8" and isinstance(mod, QuantLinear) and (n.startswith("layers")
                                                               or how == "int4" and n == "lm_head"):
            d.model.set_weight(n + ".weight", quantize(mod.weight.dequantize(), "int4"))
    return d


drafters = {r: drafter(r) for r in runs if r != "ar"}
tok_s = {s: {r: [] for r in runs} for s in sets}
tau = {s: {r: [] for r in runs} for s in sets}
pass_ms = {s: {r: [] for r in drafters} for s in sets}
for rep, s, i, p, order in turns(sets, runs, reps):
    outs = {}
    for r in order:
        out = d3d.generate(target, p, max_new_tokens=128, spec="ar" if r == "ar" else "sync", drafter=drafters.get(r),
                           stop_ids=tok.stop_token_ids())
        outs[r], st = out.tokens[0], out.stats
        tok_s[s][r].append(st.total_generated / st.decode_seconds)
        tau[s][r].append(st.tau)
        if r in drafters and st.drafter_forwards:
            pass_ms[s][r].append(1e3 * st.draft_seconds / st.drafter_forwards)
    request_done(outs, tok_s[s], f"rep {rep + 1} {s} {i + 1}/{len(sets[s])}")
summary = {s: runs_over_ar(tok_s[s], tau[s]) for s in sets}
for s in sets:
    print_runs_over_ar(s, summary[s])
    for r in drafters:
        pr = [a / b for a, b in zip(tok_s[s][r], tok_s[s]["int8"])] if "int8" in drafters else []
        summary[s][r]["median_pass_ms"] = round(statistics.median(pass_ms[s][r]), 3) if pass_ms[s][r] else None
        summary[s][r]["median_over_int8"] = round(statistics.median(pr), 3) if pr else None
        print(f"{s:9} {r:9} drafter pass {summary[s][r]['median_pass_ms']} ms, over int8 "
              f"{summary[s][r]['median_over_int8']}")
write_json(out_path, {"bench": "drafter int4 vs int8, one sequence", "machine": machine(), "model": name,
                      "sets": {s: len(p) for s, p in sets.items()}, "reps": reps, "new_tokens": 128,
                      "decode_only": True, "summary": summary, "tok_s": tok_s, "tau": tau, "pass_ms": pass_ms})
