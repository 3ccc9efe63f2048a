"""glue_cpu.rope_write over T rows of the 0.5B's and the 1.5B's heads (q, k rotated, k and v written to the
cache). Medians of 2000 calls after 200.

    python docs/results/pass-rest/time_rope.py
"""
import statistics
import time

import torch

from d3d.kernels import glue_cpu

for name, H, Hkv, D in (("0.5B heads", 14, 2, 64), ("1.5B heads", 12, 2, 128)):
    cells = []
    for T in (1, 8, 16):
        qkv, cos, sin = torch.randn(T, (H + 2 * Hkv) * D), torch.randn(T, D), torch.randn(T, D)
        kc = torch.zeros(1, Hkv, 512, D)
        vc = torch.zeros_like(kc)
        rows, slots = torch.zeros(T, dtype=torch.long), torch.arange(T) + 200
        call = lambda: glue_cpu.rope_write(qkv, cos, sin, kc, vc, rows, slots, H, Hkv)
        for _ in range(200):
            call()
        times = []
        for _ in range(2000):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        cells.append(f"T={T:2d} {statistics.median(times) * 1e6:5.1f} us")
    print(f"{name} ({H} x {D}, {Hkv} kv heads): " + " | ".join(cells))
