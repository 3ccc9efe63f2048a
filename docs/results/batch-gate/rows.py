"""What a verification pass of 16 sequences costs as rows are added: 16 sequences with 250 cached tokens each
(random ids), one pass appending the given tokens per sequence (16 x 1 is a batch's plain step), median of 15,
twice. Run from the repository root:

    python docs/results/batch-gate/rows.py MODEL OUT.json
"""
import statistics
import sys
import time

import torch

import d3d
from bench.common import machine, write_json
from d3d.fetch import resolve_model

torch.set_grad_enabled(False)
name, out_path = sys.argv[1], sys.argv[2]
target = d3d.load_model(resolve_model(name), weights="auto")
N, CONTEXT = 16, 250
cache = target.new_cache(N, 600)
g = torch.Generator().manual_seed(0)
for r in range(N):
    target(torch.randint(100, 20000, (CONTEXT,), generator=g), cache.layout([CONTEXT], [r]), cache)


def ms(lens, reps=15):
    times = []
    for _ in range(reps):
        ids, layout = torch.randint(100, 20000, (sum(lens),), generator=g), cache.layout(lens, list(range(N)))
        t0 = time.perf_counter()
        target(ids, layout, cache)
        times.append(time.perf_counter() - t0)
        for r in range(N):
            cache.crop(r, CONTEXT)
    return round(statistics.median(times) * 1e3, 2)


CASES = {"16 x 1": [1] * 16, "one of 2": [2] + [1] * 15, "one of 3": [3] + [1] * 15, "two of 2": [2, 2] + [1] * 14,
         "one of 16": [16] + [1] * 15, "16 x 2": [2] * 16}
runs = [{case: ms(lens) for case, lens in CASES.items()} for _ in range(2)]
print(runs)
write_json(out_path, {"bench": "a batch's verification pass by rows", "machine": machine(), "model": name,
                      "context": CONTEXT, "rows_per_case": {c: sum(v) for c, v in CASES.items()}, "ms": runs})
