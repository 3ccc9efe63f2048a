"""Real-size int8-activation matmuls (the 0.5B's gate_up int5 896->9728 and its Q4_K down 4864->896) at M rows,
one process per build: python docs/results/act-quant/mm_rows.py 17,24,32,48,64 > OUT.txt"""
import sys
import time
from pathlib import Path

import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from d3d.kernels import quant as kernel
from test_quant import vnni_format
g = torch.Generator().manual_seed(0)
mats = {"int5 896x9728": (vnni_format("int5-16", 9728, 896, g)[0], 896),
        "q4k 4864x896": (vnni_format("q4k", 896, 4864, g)[0], 4864)}
for name, (args, K) in mats.items():
    for M in [int(m) for m in sys.argv[1].split(",")]:
        x = torch.randn(M, K)
        for _ in range(5): kernel.matmul_vnni(x, *args)
        ts = []
        for _ in range(21):
            t0 = time.perf_counter(); kernel.matmul_vnni(x, *args); ts.append(time.perf_counter() - t0)
        print(f"{name} M={M}: {1e6 * sorted(ts)[10]:.0f} us", flush=True)
