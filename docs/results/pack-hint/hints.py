"""Which oneDNN packing hints are row-invariant, and what each costs: the 0.5B target's linear shapes
(24 layers x qkv 1152x896, o 896x896, gate-up 9728x896, down 896x4864, + the head 151936x896), fp32,
random weights, median ms summed over the model, M = 1..24 rows. Row-invariant: each row of an M-row
product (M up to 176) equals the 1-row product of that row bit for bit.

    python docs/results/pack-hint/hints.py > docs/results/pack-hint/hints.txt
"""
import time

import torch

MS = (1, 2, 3, 4, 6, 8, 12, 16, 24)
HINTS = (1, 2, 4, 8, 16, 32)
SHAPES = ((1152, 896, 24), (896, 896, 24), (9728, 896, 24), (896, 4864, 24), (151936, 896, 1))


def median_ms(fn, rep):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(rep):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2] * 1e3


def row_invariant(f, x) -> bool:
    """Whether every row of an M-row product equals that row's 1-row product, M = 2..176."""
    ones = torch.cat([f(x[i:i + 1]) for i in range(len(x))])
    big = torch.cat([x] * 8)[:176]
    return all(torch.equal(f(x[:M]), ones[:M]) for M in MS) and torch.equal(f(big)[:len(x)], ones)


torch.manual_seed(0)
total = {h: [0.0] * len(MS) for h in HINTS}
invariant = {h: True for h in HINTS}
for out_f, in_f, n in SHAPES:
    w, x = torch.randn(out_f, in_f), torch.randn(max(MS), in_f)
    for h in HINTS:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, h)

        def f(rows):
            return torch.ops.mkldnn._linear_pointwise(rows, packed, None, "none", [], "")

        if not row_invariant(f, x):
            if invariant[h]:
                print("NOT invariant", out_f, in_f, "hint", h, flush=True)
            invariant[h] = False
        row = [median_ms(lambda: f(x[:M]), 30 if out_f < 100000 else 8) for M in MS]
        for k, v in enumerate(row):
            total[h][k] += v * n
        print(out_f, in_f, "hint", h, " ".join(f"{v:.3f}" for v in row), flush=True)
print("M:", MS)
for h in HINTS:
    print("model total hint", h, " ".join(f"{v:.0f}" for v in total[h]),
          "row-invariant" if invariant[h] else "NOT row-invariant")
