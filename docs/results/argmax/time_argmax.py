"""torch.argmax against glue_cpu.argmax (the same indices) over rows of logits: one step's row of the
Qwen2.5 vocabulary, a 9-row verification, the drafter's 16 rows of its 16384-token head. Medians of 300.

    python docs/results/argmax/time_argmax.py > docs/results/argmax/time_argmax.txt
"""
import statistics
import time

import torch

from d3d.hardware import cpu_flags
from d3d.kernels import glue_cpu


def median_us(fn, n: int = 300) -> float:
    for _ in range(20):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


print(f"cpu flags: {' '.join(sorted(f for f in cpu_flags() if f.startswith('avx')))}; {torch.get_num_threads()} threads")
for shape in [(1, 151936), (9, 151936), (16, 16384)]:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    assert torch.equal(glue_cpu.argmax(x), x.argmax(-1))
    print(f"{str(shape):14s} torch.argmax {median_us(lambda: x.argmax(-1)):7.1f} us   "
          f"glue_cpu.argmax {median_us(lambda: glue_cpu.argmax(x)):6.1f} us")
