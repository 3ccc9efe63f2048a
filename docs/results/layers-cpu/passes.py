"""One T-row decoding pass after 200 cached tokens, the decoder layers run by Python modules (``cpu_layers = False``)
against one C++ call (``d3d.kernels.layers_cpu``), in one process, timed interleaved, medians of REPEATS rounds;
the target and the bundled drafter beside it (weights auto: the GGUF's blocks; the drafter's int8).

    python docs/results/layers-cpu/passes.py MODEL [REPEATS] [--out FILE]
"""
import argparse, statistics, sys, time
from pathlib import Path

import torch

import d3d
from bench.common import machine, write_json
from bench.passes import pass_runner
from d3d.doctor import read_bandwidth_gbs
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("model")
ap.add_argument("repeats", type=int, nargs="?", default=41)
ap.add_argument("--out")
args = ap.parse_args()
torch.set_num_threads(2)
target = d3d.load_model(str(resolve_model(args.model)), weights="auto")
drafter = pick_drafter(target, "sync")[1]
runs = {}
for who, model, Ts in (("target", target, [1, 2, 4, 8, 16]), ("drafter", drafter.model, [5, 16])):
    for T in Ts:
        runs[who, T] = (model, pass_runner(model, T, 200))
times = {(k, fused): [] for k in runs for fused in (False, True)}
for r in range(args.repeats):
    for k, (model, run) in runs.items():
        for fused in (False, True) if r % 2 else (True, False):
            model.cpu_layers = fused
            t = time.perf_counter()
            run()
            times[k, fused].append(time.perf_counter() - t)
    print(f"round {r + 1}/{args.repeats}", file=sys.stderr, flush=True)
assert target._cpu_layers and drafter.model._cpu_layers, "the one call did not apply"
rows = []
for (who, T) in runs:
    py, one = (statistics.median(times[(who, T), f]) * 1e3 for f in (False, True))
    rows.append(dict(model=who, T=T, python_ms=round(py, 3), one_call_ms=round(one, 3), ratio=round(one / py, 3)))
    print(f"{who:8s} T={T:2d}: Python layers {py:6.2f} ms, one call {one:6.2f} ms ({one / py:.3f}x)")
write_json(args.out, dict(model=args.model, weights=target.weights, drafter=str(drafter.model.source),
                          repeats=args.repeats, read_gb_s=round(read_bandwidth_gbs(), 1), machine=machine(), rows=rows))
