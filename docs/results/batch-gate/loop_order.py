"""The int8-activation kernels past 16 rows: each thread now reads a panel front to back, every row tile taking
each k block from L1 (the working tree), against the loop before (k blocks across a thread's 4 panels at a time,
commit ad9175a, built from git under another name). Every int8-activation matrix of MODEL (``weights="auto"``;
the AVX2 kernel: those with one-level scales), one call each, T rows of random activations; the two builds take
turns, median of 7; the outputs must be bit-identical. Run from the repository root:

    python docs/results/batch-gate/loop_order.py MODEL vnni|maddubs 1,16,17,24,32,64 OUT.json
"""
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import d3d
from bench.common import machine, write_json
from d3d.cpu.quant import QuantWeight
from d3d.fetch import resolve_model
from d3d.kernels import quant as kq
from d3d.kernels.cpp import AVX2, AVX2_FLAGS, build

BEFORE = "ad9175a"
torch.set_grad_enabled(False)
name, kind, sizes, out_path = sys.argv[1], sys.argv[2], [int(v) for v in sys.argv[3].split(",")], sys.argv[4]
source = {"vnni": "quant_vnni.cpp", "maddubs": "quant_maddubs.cpp"}[kind]
where = Path.home() / ".cache/d3d-runs/loop-order" / BEFORE
where.mkdir(parents=True, exist_ok=True)
for f in (source, "quant_int8.h", "quant_panels.h"):
    text = subprocess.run(["git", "show", f"{BEFORE}:d3d/kernels/{f}"], check=True, capture_output=True,
                          text=True).stdout
    (where / (f.replace(".cpp", "_before.cpp"))).write_text(text)
needs = AVX2 | (kq.VNNI_FLAGS if kind == "vnni" else {"f16c"})
before, why = build(f"d3d_{kind}_before_{BEFORE}", where / source.replace(".cpp", "_before.cpp"), AVX2_FLAGS, needs=needs)
if before is None:
    raise SystemExit(f"cannot build the kernel before: {why}")
now = (kq._load_vnni if kind == "vnni" else kq._load_maddubs)()[0]
target = d3d.load_model(resolve_model(name), weights="auto")
weights = [m.weight for m in target.modules() if isinstance(getattr(m, "weight", None), QuantWeight)
           and m.weight.int8_activations and (kind == "vnni" or m.weight.kernel_args()["sd"] is None)]


def call(module, w, x):
    a = w.kernel_args()
    return kq._int8_matmul((module, None), kind, x, a["q"], a["s"], a["m"], a["n"], a["bits"], a["h"], a["sd"], a["md"])


rows = []
for T in sizes:
    xs = [torch.randn(T, w.in_features) for w in weights]
    if not all(torch.equal(call(before, w, x), call(now, w, x)) for w, x in zip(weights, xs)):
        raise SystemExit(f"T={T}: the two loops' outputs differ")
    ms = {"before": [], "now": []}
    for rep in range(7):
        for k, module in [("before", before), ("now", now)][::1 if rep % 2 == 0 else -1]:
            t0 = time.perf_counter()
            for w, x in zip(weights, xs):
                call(module, w, x)
            ms[k].append((time.perf_counter() - t0) * 1e3)
    row = {"T": T, **{k: round(statistics.median(v), 2) for k, v in ms.items()}}
    row["now / before"] = round(row["now"] / row["before"], 3)
    rows.append(row)
    print(row, file=sys.stderr, flush=True)
write_json(out_path, {"bench": "int8-activation kernels, loop order past 16 rows", "machine": machine(),
                      "model": name, "kernel": source, "before": BEFORE, "matrices": len(weights), "rows": rows})
