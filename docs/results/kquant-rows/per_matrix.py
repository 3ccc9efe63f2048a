"""The VNNI kernel's time on each kind of matrix of one pass of a real model (weights from memory, each matrix
timed alone, medians of 9), summed over the pass by shape and format, at 1, 8 and 16 rows; and its rate of
multiply-adds at 8 and 16 rows (the machine's: d3d doctor's integer line).

    python docs/results/kquant-rows/per_matrix.py qwen2.5-coder-0.5b > docs/results/kquant-rows/per_matrix_0.5b.txt
"""
import collections
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vnni-streams"))
from sweep import kernel_args, matrices  # noqa: E402

from d3d.fetch import resolve_model  # noqa: E402
from d3d.hardware import cpu_flags  # noqa: E402
from d3d.kernels import quant as K  # noqa: E402
from d3d.model.checkpoint import load_model  # noqa: E402

ROWS = (1, 8, 16)


def main():
    torch.set_grad_enabled(False)
    ws = matrices(load_model(resolve_model(sys.argv[1]), weights="auto"))
    calls = [kernel_args(w) for w in ws]
    kern = K._load_vnni()[0]
    xs = {r: {k: torch.randn(r, k) for k in {w.in_features for w in ws}} for r in ROWS}
    t = collections.defaultdict(list)
    for _ in range(9):
        for r in ROWS:
            for i, (w, a) in enumerate(zip(ws, calls)):
                s = time.perf_counter()
                kern.matmul(xs[r][w.in_features], *a)
                t[i, r].append(time.perf_counter() - s)
    ms, count = collections.defaultdict(float), collections.Counter()
    for i, w in enumerate(ws):
        key = (w.out_features, w.in_features, 6 if w.six else w.bits, "two-level" if w.scale_d is not None else "one")
        count[key] += 1
        for r in ROWS:
            ms[key, r] += statistics.median(t[i, r]) * 1e3
    print(f"{sys.argv[1]}; cpu flags", " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))))
    print("(N, K, bits, scales): matrices, ms at 1 / 8 / 16 rows summed over the pass, G multiply-adds/s at 8 / 16")
    for key in sorted(count):
        n, k = key[0], key[1]
        rate = [r * n * k * count[key] / ms[key, r] / 1e6 for r in ROWS[1:]]
        print(f"{key}: x{count[key]:3d}  " + " / ".join(f"{ms[key, r]:6.2f}" for r in ROWS)
              + "  " + " / ".join(f"{x:6.1f}" for x in rate))
    print("all: " + " / ".join(f"{sum(ms[key, r] for key in count):.2f}" for r in ROWS) + " ms")


if __name__ == "__main__":
    main()
