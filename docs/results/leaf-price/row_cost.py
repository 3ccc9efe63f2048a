"""What a verification row costs, and whether a leaf's row costs more than a draft's: the 0.5B target
(fp32) after a 200-token prefill, one pass over n new tokens as plain causal rows (anchor + drafts),
as n-1 causal rows + 1 leaf, and as n-2 rows + 2 leaves (the leaf layout of ``Verifier.verification``:
groups, ``reach`` and positions), median ms of 15, twice.

    PYTHONPATH=. python docs/results/leaf-price/row_cost.py TARGET_DIR > docs/results/leaf-price/row_cost.txt
"""
import statistics
import sys
import time

import torch

import d3d
from d3d.decode.generation import prefill

target = d3d.load_model(sys.argv[1], dtype="float32")
cache = target.new_cache(rows=1, max_len=400)
torch.set_grad_enabled(False)
prefill(target, [list(range(1000, 1200))], cache, 0.0, None)
start = cache.lengths[0]


def median_ms(fn, rep=15):
    ts = []
    for _ in range(rep):
        cache.lengths[0] = start  # every pass writes the same slots
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def plain(n):
    return target(torch.arange(5, 5 + n), cache.layout([n], [0]), cache)


def with_leaves(n, k):
    """n causal rows, then k leaves at the position of d_1 (each sees the anchor only)."""
    layout = cache.layout([n + k], [0], groups=[range(n + k)], reach=[list(range(n)) + [1] * k],
                          positions=[[start + p for p in range(n)] + [start + 1] * k])
    return target(torch.arange(5, 5 + n + k), layout, cache)


for _ in range(2):
    for n in (3, 5, 7):
        print(f"rows {n}: plain {median_ms(lambda: plain(n)):.1f}  {n - 1} + 1 leaf {median_ms(lambda: with_leaves(n - 1, 1)):.1f}"
              f"  {n - 2} + 2 leaves {median_ms(lambda: with_leaves(n - 2, 2)):.1f} ms", flush=True)
