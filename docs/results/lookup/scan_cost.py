"""Cost of ``d3d.decode.lookup.lookup_chain`` in its worst case (no match: every n-gram length scanned to the
start), the figure its docstring quotes.

    PYTHONPATH=. python docs/results/lookup/scan_cost.py > docs/results/lookup/scan_cost.txt
"""

import platform
import random
import statistics
import time

from d3d.decode.lookup import lookup_chain

random.seed(0)
print(platform.processor() or platform.machine())
for length in (300, 1000, 4000):
    ctx = [random.randrange(5000) for _ in range(length)]
    assert lookup_chain(ctx, 3, 15) == []
    times = []
    for _ in range(50):
        t = time.perf_counter()
        lookup_chain(ctx, 3, 15)
        times.append(time.perf_counter() - t)
    print(f"{length} tokens of context: {statistics.median(times) * 1000:.2f} ms (median of 50, no match)")
