"""ar and sync's defaults with a prompt's prefill on the int8 kernels and on AMX's bf16 tiles, one sequence: end-to-end
tokens per second (prefill included, as ``bench llamacpp`` counts them), medians of per-request ratios tiles/int8.
The four runs of a request take turns, the order reversed every other request. Each setting's sync output must equal
its ar's; the two settings' outputs may part where the tiles' numerics flip a near-tie (counted). Run from the
repository root:

    python docs/results/prefill-tiles/validate.py MODEL SETS OUT.json [--reps N]

SETS, comma-separated, as ``bench.common.request_sets`` names them (validation: code, explain, mtbench, mtbench-free).
"""
import os
import statistics
import sys

import torch

import d3d
from bench.common import machine, request_sets, turns, write_json
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model

RUNS = ["ar int8", "ar tiles", "sync int8", "sync tiles"]
torch.set_grad_enabled(False)
name, wanted, out_path, *args = sys.argv[1:]
reps = int(args[args.index("--reps") + 1]) if "--reps" in args else 1
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
sets = request_sets(tok, path, wanted.split(","))
tok_s = {s: {r: [] for r in RUNS} for s in sets}
prefill_ms = {s: {r: [] for r in RUNS} for s in sets}
parted = {s: 0 for s in sets}
for rep, s, i, p, order in turns(sets, RUNS, reps):
    outs = {}
    for r in order:
        engine, setting = r.split()
        os.environ["D3D_PREFILL_TILES"] = "off" if setting == "int8" else "on"
        out = d3d.generate(target, p, max_new_tokens=128, spec=engine, drafter=drafter, stop_ids=tok.stop_token_ids())
        outs[r] = out.tokens[0]
        tok_s[s][r].append(out.stats.total_generated / (out.stats.prefill_seconds + out.stats.decode_seconds))
        prefill_ms[s][r].append(out.stats.prefill_seconds * 1e3)
    for setting in ("int8", "tiles"):
        if outs[f"sync {setting}"] != outs[f"ar {setting}"]:
            raise SystemExit(f"rep {rep + 1} {s} {i + 1}: sync's output differs from ar's with the {setting} prefill")
    parted[s] += outs["ar tiles"] != outs["ar int8"]
    print(f"rep {rep + 1} {s} {i + 1}/{len(sets[s])} ({len(p)} prompt tokens):",
          {r: round(v[-1], 1) for r, v in tok_s[s].items()}, file=sys.stderr, flush=True)
summary = {}
for s in sets:
    ratio = {e: [b / a for a, b in zip(tok_s[s][f"{e} int8"], tok_s[s][f"{e} tiles"])] for e in ("ar", "sync")}
    summary[s] = {"median_tiles_over_int8": {e: statistics.median(v) for e, v in ratio.items()},
                  "worst_tiles_over_int8": {e: min(v) for e, v in ratio.items()},
                  "median_tok_s": {r: statistics.median(v) for r, v in tok_s[s].items()},
                  "median_prefill_ms": {r: statistics.median(v) for r, v in prefill_ms[s].items()},
                  "sync_over_ar": {st: statistics.median(b / a for a, b in zip(tok_s[s][f"ar {st}"],
                                                                                tok_s[s][f"sync {st}"]))
                                   for st in ("int8", "tiles")},
                  "outputs_parted": parted[s], "requests": len(sets[s]) * reps}
    m = summary[s]
    gain = m["median_tiles_over_int8"]
    print(f"{s:12} tiles/int8: ar {gain['ar']:.3f}x, sync {gain['sync']:.3f}x;"
          f" prefill ms (ar) {m['median_prefill_ms']['ar int8']:.0f} -> {m['median_prefill_ms']['ar tiles']:.0f};"
          f" sync/ar {m['sync_over_ar']['int8']:.3f} -> {m['sync_over_ar']['tiles']:.3f};"
          f" outputs parted {parted[s]}/{len(sets[s]) * reps}")
write_json(out_path, {"bench": "a prompt's prefill on the int8 kernels and on AMX's bf16 tiles, one sequence",
                      "machine": machine(), "model": name, "sets": {s: len(p) for s, p in sets.items()}, "reps": reps,
                      "new_tokens": 128, "end_to_end": True, "summary": summary, "tok_s": tok_s,
                      "prefill_ms": prefill_ms})
