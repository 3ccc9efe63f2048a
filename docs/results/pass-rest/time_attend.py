"""attend_cpu over a verification pass's rows: T query rows of one sequence after 200 cached tokens, each
seeing the cache and the block's rows up to its own (the causal mask of a drafted block), with the real
models' heads. Medians of 2000 calls after 200; fp32 cache.

    python docs/results/pass-rest/time_attend.py
"""
import statistics
import time

import torch

from d3d.kernels.attention_cpu import _load

module = _load()[0]
CONTEXT = 200
for name, H, Hkv, D in (("0.5B heads", 14, 2, 64), ("1.5B heads", 12, 2, 128)):
    cells = []
    for T in (1, 8, 16):
        g = torch.Generator().manual_seed(T)
        q = torch.randn(T, H, D, generator=g)
        kc = torch.randn(1, Hkv, 512, D, generator=g)
        vc = torch.randn(1, Hkv, 512, D, generator=g)
        rows = torch.zeros(T, dtype=torch.long)
        nkeys = CONTEXT + 1 + torch.arange(T)
        first = torch.full((T,), CONTEXT, dtype=torch.long)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        call = lambda: module.attend(q, kc, vc, rows, nkeys, first, mask, D ** -0.5, 0)
        for _ in range(200):
            call()
        times = []
        for _ in range(2000):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        cells.append(f"T={T:2d} {statistics.median(times) * 1e6:6.1f} us")
    print(f"{name} ({H} x {D}, {Hkv} kv heads): " + " | ".join(cells))
