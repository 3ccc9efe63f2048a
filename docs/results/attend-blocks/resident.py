"""attend_cpu on one thread with one layer's cache resident: this checkout against another revision's kernel (built
side by side from git), one sequence's T rows over 2,048 keys, the kernels taking turns, medians of 40; the outputs
checked equal first. GFLOP/s counts the scores' and the values' multiply-adds (4 T H L D).

    python docs/results/attend-blocks/resident.py [REV] > resident.txt
"""
import statistics
import sys
import time

import torch

from compare import build_at  # the kernel at a revision, built beside this one (compare.py)
from d3d.kernels.attention_cpu import _load

rev = sys.argv[1] if len(sys.argv) > 1 else "638299c"
torch.set_num_threads(1)
new, old = _load()[0], build_at(rev)
for name, H, Hkv, D in (("0.5B", 14, 2, 64), ("1.5B", 12, 2, 128)):
    for L, T in ((2048, 1), (2048, 2), (2048, 8)):
        g = torch.Generator().manual_seed(0)
        kc, vc = torch.randn(1, Hkv, L + 16, D, generator=g), torch.randn(1, Hkv, L + 16, D, generator=g)
        q = torch.randn(T, H, D, generator=g)
        rows, nkeys = torch.zeros(T, dtype=torch.long), torch.arange(L - T + 1, L + 1)
        a = (q, kc, vc, rows, nkeys, nkeys - 1, torch.ones(T, 1, dtype=torch.bool), D ** -0.5, 0)
        fs = {"this checkout": lambda: new.attend(*a, 0), rev: lambda: old.attend(*a)}
        assert torch.equal(fs["this checkout"](), fs[rev]())
        ts = {k: [] for k in fs}
        for _ in range(40):
            for k, f in fs.items():
                t = time.perf_counter()
                f()
                ts[k].append(time.perf_counter() - t)
        m = {k: statistics.median(v) for k, v in ts.items()}
        print(f"{name} L={L} T={T}: " + "  ".join(f"{k} {v * 1e6:5.0f} us ({4 * T * H * L * D / v / 1e9:3.0f} GFLOP/s)"
                                                   for k, v in m.items()), flush=True)
