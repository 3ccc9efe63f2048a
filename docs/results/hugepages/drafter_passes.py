"""The drafter's passes in 4 KB pages against 2 MB pages, taking turns in one process: the target loaded once (as
load_model does by default), the drafter twice beside it, once with D3D_HUGEPAGES=off and once by default (its own
matrices moved into an arena; what it borrows from the target is there already). One T-row pass after 200 cached
tokens (bench passes' runner), medians.

    python docs/results/hugepages/drafter_passes.py qwen2.5-coder-1.5b 1,4,8,16 41 > drafter_passes_1.5b.txt
"""
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import d3d  # noqa: E402
from bench.common import interleaved  # noqa: E402
from bench.passes import pass_runner  # noqa: E402
from d3d.draft.pick import pick_drafter  # noqa: E402
from d3d.fetch import resolve_model  # noqa: E402

torch.set_grad_enabled(False)
name, Ts, reps = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
target = d3d.load_model(resolve_model(name), weights="auto")
drafters = {}
for label, setting in (("4 KB pages", "off"), ("2 MB pages", "auto")):
    os.environ["D3D_HUGEPAGES"] = setting
    _, drafter, note = pick_drafter(target, None)
    drafters[label] = drafter.model
print(f"{name}'s drafter: {note}", flush=True)
for T in Ts:
    runs = {k: pass_runner(m, T, 200) for k, m in drafters.items()}
    times = interleaved(runs, reps, warmup=3)  # bench.common's timer: the runs in turns
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"T={T:2d}: " + ", ".join(f"{k} {v:5.2f} ms" for k, v in ms.items())
          + f": {ms['4 KB pages'] / ms['2 MB pages']:.3f}x", flush=True)
