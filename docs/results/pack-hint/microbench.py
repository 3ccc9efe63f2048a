"""The 0.5B target's linear shapes through oneDNN, packed for 1 row and for 16 rows (fp32, median ms;
random weights). Summed over the model: 24 layers x (qkv 1152x896, o 896x896, gate-up 9728x896,
down 896x4864) + the head 151936x896.

    python docs/results/pack-hint/microbench.py > docs/results/pack-hint/microbench.txt
"""
import time

import torch


def median_ms(fn, rep):
    for _ in range(5):
        fn()
    ts = []
    for _ in range(rep):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2] * 1e3


torch.manual_seed(0)
Ms = (1, 2, 4, 8, 12, 16)
total = {h: [0.0] * len(Ms) for h in (1, 16)}
for out_f, in_f, n in ((1152, 896, 24), (896, 896, 24), (9728, 896, 24), (896, 4864, 24), (151936, 896, 1)):
    w = torch.randn(out_f, in_f)
    for hint in (1, 16):
        packed = torch.ops.mkldnn._reorder_linear_weight(w, hint)
        row = []
        for M in Ms:
            x = torch.randn(M, in_f)
            row.append(median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
                                 40 if out_f < 100000 else 10))
        for k, v in enumerate(row):
            total[hint][k] += v * n
        print(out_f, in_f, "hint", hint, " ".join(f"{v:.3f}" for v in row), flush=True)
for h in total:
    print("model total hint", h, " ".join(f"{v:.0f}" for v in total[h]))
