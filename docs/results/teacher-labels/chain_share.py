"""The figures behind this directory's README "Why" paragraph, from the teacher runs' cached labels:
how often target-16m's greedy token equals the real next token, the share of an all-mask block's
masked positions that ``greedy_chain`` keeps, and the labelling rate. Writes chain_share.json.

    PYTHONPATH=. python docs/results/teacher-labels/chain_share.py ~/.cache/d3d-runs/teacher-16m/data/teacher-*.pt
"""
import json
import sys
import time

import torch

import d3d
from bench.common import machine
from d3d.assets import BUNDLED_TARGET, bundled
from d3d.train.drafter import greedy_chain, teacher_labels

cache = torch.load(sys.argv[1])
windows, labels = cache["windows"], cache["labels"]
masked = torch.ones_like(windows, dtype=torch.bool)
masked.view(windows.shape[0], -1, 16)[:, :, 0] = False  # all-mask blocks of 16, the anchor kept
chain = greedy_chain(windows, labels, masked, 16)
target = d3d.load_model(bundled(BUNDLED_TARGET))  # the dtype the labels were made in (policy: bf16 here)
sample = windows[:256]
teacher_labels(target, sample[:16])  # warm-up
t = time.perf_counter()
assert torch.equal(teacher_labels(target, sample), labels[:256])  # the cache is this target's labels
rate = sample.numel() / (time.perf_counter() - t)
out = {"what": __doc__.strip().splitlines()[0], "machine": machine(), "windows": windows.shape[0],
       "greedy_equals_real_next_token": float((windows[:, 1:] == labels[:, 1:]).float().mean()),
       "chain_share_of_masked_positions": float(chain[masked].float().mean()),
       "labels_per_second": rate, "dtype": str(target.dtype)}
json.dump(out, open("docs/results/teacher-labels/chain_share.json", "w"), indent=2)
print({k: v for k, v in out.items() if k != "machine"})
