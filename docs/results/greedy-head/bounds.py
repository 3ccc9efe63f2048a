"""How tight the greedy head's bounds are on real hidden states, and what it holds. The model answers 5 MT-Bench
questions greedily (24 tokens each); the final norm's outputs at every decoding pass are the rows. For each row: the
columns whose upper bound reaches the best lower bound, with the weights' low 2 or 3 bits left to the bounds,
bounding with every group's scale ("per group", a negative scale swapping its group's bounds) or with each column's
largest ("column max"; non-negative scales only). The activations are quantized per group as an int8 kernel would
(fp32 arithmetic here, no rounding margin). Then the GreedyHead's bytes and build time; for a Q6_K head (the 1.5B's:
int6, signed scales per group of 16, which the greedy head does not take), its low 2 bits only and what the bounds
would cost. Run from the repository root:

    python docs/results/greedy-head/bounds.py qwen2.5-coder-0.5b > bounds.txt
    python docs/results/greedy-head/bounds.py qwen2.5-coder-1.5b > bounds_q6k.txt
"""
import sys
import time

import torch

from d3d.cpu.greedy_head import GreedyHead
from d3d.cpu.quant import Factored
from rows import final_rows

m, W, H = final_rows(sys.argv[1])
q, scale, _, _ = W.rowmajor()
n, K = q.shape
G, six = W.group, W.format == "int6"
sc = (scale.expand() if isinstance(scale, Factored) else scale).view(n, K // G)
g = H.view(len(H), K // G, G)
sx = g.abs().amax(-1) / 127
qx = torch.where(sx[..., None] > 0, g / sx[..., None], 0.0).round()
pos, neg = qx.clamp(min=0).sum(-1) * sx, qx.clamp(max=0).sum(-1) * sx  # [rows, groups]
xq = (qx * sx[..., None]).view(len(H), K)
sp, sn = sc.clamp(min=0), sc.clamp(max=0)  # the low bits l >= 0: a negative scale swaps its group's bounds
print(f"{sys.argv[1]}: {W}; {len(H)} rows; {int((sc < 0).sum())} of {sc.numel()} group scales negative")
for drop in (2,) if six else (2, 3):
    B = 2 ** drop
    A = ((B * torch.div(q, B, rounding_mode="floor").float()).view(n, K // G, G) * sc[..., None]).view(n, K) @ xq.T
    bounds = [("per group", (B - 1) * (sp @ pos.T + sn @ neg.T), (B - 1) * (sp @ neg.T + sn @ pos.T))]
    if not (sc < 0).any():
        top = (B - 1) * sc.amax(1)[:, None]
        bounds.append(("column max", top * pos.sum(1), top * neg.sum(1)))
    for name, up, lo in bounds:
        c = sorted(((A + up) >= (A + lo).amax(0)).sum(0).tolist())
        print(f"low {drop} bits to the bounds, {name:10s}: columns a row median {c[len(c) // 2]}, "
              f"p90 {c[int(len(c) * 0.9)]}, max {c[-1]}")
if six:
    print(f"bounds cost per row: {K // G} groups x {n} columns = {K // G * n / 1e6:.1f} M multiply-adds; the first "
          f"stage would save {n * K * 2 / 8 / 1e6:.0f} MB of the head's {W.nbytes / 1e6:.0f} MB")
else:
    t = time.perf_counter()
    head = GreedyHead(W)
    print(f"GreedyHead: {head.nbytes / 1e6:.1f} MB beside the head ({W.nbytes / 1e6:.1f} MB), built in "
          f"{time.perf_counter() - t:.2f} s")
