"""What a context lookup costs a sequence each round, the scan against the n-gram index (``NgramIndex``): a context
of real code (the standard library's argparse.py, tokenized by the 0.5B's tokenizer) of 300 to 8,000 tokens, then 64 rounds
that each commit one more token of it and look up a copy (n = 3..8, up to 15 tokens), as ``lookup=3`` does.
Both must find the same copies; the index is built from scratch at the first round (its cost is in that round).

    PYTHONPATH=. python docs/results/lookup-index/cost.py > docs/results/lookup-index/cost.txt
"""

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import d3d
from d3d.decode.lookup import NgramIndex, lookup_copy
from d3d.fetch import resolve_model

path = resolve_model("qwen2.5-coder-0.5b")
tok = d3d.load_tokenizer(path)
text = tok.encode(Path(argparse.__file__).read_text())
assert len(text) > 8100, len(text)
flags = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
print(next((line.split(":", 1)[1].strip() for line in flags.splitlines() if line.startswith("Model name")), "?"))
print("| context tokens | scan: ms a round (median) | index: ms a round (median) | first round with the index | copies found |")
print("|---|---|---|---|---|")
for length in (300, 1000, 4000, 8000):
    scan, fast, found, index = [], [], 0, NgramIndex(3)
    for r in range(64):
        ctx = text[:length + r]
        t0 = time.perf_counter()
        a = lookup_copy(ctx, 3, 15)
        t1 = time.perf_counter()
        b = lookup_copy(ctx, 3, 15, index=index)
        t2 = time.perf_counter()
        assert (a and (a.tokens, a.match)) == (b and (b.tokens, b.match))
        scan.append(t1 - t0)
        fast.append(t2 - t1)
        found += a is not None
    print(f"| {length} | {statistics.median(scan) * 1e3:.3f} | {statistics.median(fast[1:]) * 1e3:.3f} | "
          f"{fast[0] * 1e3:.2f} | {found}/64 |")
