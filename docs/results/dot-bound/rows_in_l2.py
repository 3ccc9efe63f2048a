"""The VNNI kernel's rate of integer dot products on matrices that stay in L2 (no memory stalls), against the
machine's rate on independent chains (quant.int8_macs_per_second): how far a pass of many rows is from the
instruction bound. 1 and 2 threads; int8, int5 and int4 random matrices; medians of interleaved repeats.

    python docs/results/dot-bound/rows_in_l2.py > docs/results/dot-bound/rows_in_l2.txt
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from test_quant import random_format  # noqa: E402  (the tests' random matrices)

from d3d.hardware import cpu_flags  # noqa: E402
from d3d.kernels import quant as kernel  # noqa: E402

N, K = 1024, 896
print(f"cpu flags: {' '.join(sorted(f for f in cpu_flags() if f.startswith('avx512')))}")
g = torch.Generator().manual_seed(0)
for threads in (1, 2):
    torch.set_num_threads(threads)
    rate = kernel.int8_macs_per_second() / 64
    for bits in (8, 5, 4):
        q, s, m, h = random_format(bits, N, K, 32, g, half=True)
        args = (kernel.to_panels(q), kernel.to_panels(s), None if m is None else kernel.to_panels(m), N, bits,
                None if h is None else kernel.bits_to_panels(h, N))
        line = []
        for M in (1, 8, 16):
            x = torch.randn(M, K, generator=g)
            ts = []
            for _ in range(7):
                t = time.perf_counter()
                for _ in range(200):
                    kernel.matmul_vnni(x, *args)
                ts.append((time.perf_counter() - t) / 200)
            dt = statistics.median(ts)
            line.append(f"M={M:2d} {dt * 1e6:6.1f} us {M * N * K / 64 / dt / 1e9:5.2f} G/s")
        print(f"{threads} thread(s), int{bits} {N}x{K}: " + " | ".join(line) + f"  (chains: {rate / 1e9:.1f} G vpdpbusd/s)")
