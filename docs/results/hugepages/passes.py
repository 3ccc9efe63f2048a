"""Whole passes of one model in 4 KB pages against the same model in 2 MB pages, taking turns in one process: the
model loaded twice, once with D3D_HUGEPAGES=off and once as load_model does by default (its matrices moved into
transparent huge pages, d3d.cpu.hugepages). One T-row pass after 200 cached tokens (bench passes' runner), medians.

    python docs/results/hugepages/passes.py qwen2.5-coder-1.5b 1,2,4,8,16 21 > docs/results/hugepages/passes_1.5b.txt
"""
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import d3d  # noqa: E402
from bench.common import interleaved  # noqa: E402
from bench.passes import pass_runner  # noqa: E402
from d3d.cpu import hugepages  # noqa: E402
from d3d.fetch import resolve_model  # noqa: E402
from d3d.hardware import cpu_flags  # noqa: E402

torch.set_grad_enabled(False)
name, Ts, reps = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
path = resolve_model(name)
os.environ["D3D_HUGEPAGES"] = "off"
small = d3d.load_model(path, weights="auto")
os.environ["D3D_HUGEPAGES"] = "auto"
start = time.perf_counter()
huge = d3d.load_model(path, weights="auto")
loaded = time.perf_counter() - start
rollup = {k: v.split()[0] for k, v in (line.split(":", 1) for line in open("/proc/self/smaps_rollup") if ":" in line)}
print(f"{name}; transparent huge pages: {hugepages.mode()}; the second load {loaded:.1f} s; this process's "
      f"AnonHugePages {int(rollup.get('AnonHugePages', 0)) >> 10} MB; cpu flags "
      + " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))), flush=True)
for T in Ts:
    runs = {"4 KB pages": pass_runner(small, T, 200), "2 MB pages": pass_runner(huge, T, 200)}
    times = interleaved(runs, reps, warmup=2)  # bench.common's timer: the runs in turns
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"T={T:2d}: " + ", ".join(f"{k} {v:6.2f} ms" for k, v in ms.items())
          + f": {ms['4 KB pages'] / ms['2 MB pages']:.3f}x", flush=True)
