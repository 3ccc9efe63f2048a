"""A pass of a real model with QuantWeight.linear as it is against the form before it took a decoding pass's
x straight to the kernel (reshape, cast, contiguous, view and cast back around every call), swapped in and out
of one process round by round; medians (and minima) of the rounds' passes (ms).

    python docs/results/pass-rest/ab_linear.py qwen2.5-coder-0.5b
"""
import statistics
import sys
import time

import torch

import d3d
from bench.common import target_dir
from bench.passes import pass_runner
from d3d.cpu.quant import QuantWeight


def before(self, x, bias=None):  # _call: bound by the prefill pass_runner runs with the current form
    x2 = x.reshape(-1, self.in_features)
    if x2.dtype != torch.float32:
        x2 = x2.float()
    y = self._call(x2.contiguous())
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


model = d3d.load_model(target_dir(sys.argv[1], "passes"), dtype="float32", weights="auto")
runs = {T: pass_runner(model, T, 200) for T in (1, 8)}
now = QuantWeight.linear
times = {(name, T): [] for name in ("before", "now") for T in runs}
for r in range(61):
    for name, fn in (("before", before), ("now", now)):
        QuantWeight.linear = fn
        for T, run in runs.items():
            run()
            t = time.perf_counter()
            run()
            times[name, T].append(time.perf_counter() - t)
QuantWeight.linear = now
cell = lambda name, T: f"{statistics.median(times[name, T]) * 1e3:.2f} ({min(times[name, T]) * 1e3:.2f})"
print(f"{sys.argv[1]}:", " | ".join(f"T={T}: before {cell('before', T)} ms, now {cell('now', T)}" for T in runs))
