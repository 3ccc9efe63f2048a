"""How tight the greedy head's bounds are on real hidden states, and what it holds. The 0.5B answers 5 MT-Bench
questions greedily (24 tokens each); the final norm's outputs at every decoding pass are the rows. For each row: the
columns whose upper bound reaches the best lower bound, with the int8 weights' low 2 or 3 bits left to the bounds,
bounding with every group's scale ("per group") or with each column's largest ("column max"). The activations are
quantized as the int8 kernels do (fp32 arithmetic here, no rounding margin). Then the GreedyHead's bytes and build
time. Run from the repository root:

    python docs/results/greedy-head/bounds.py MODEL > bounds.txt
"""
import sys
import time

import torch

import d3d
from d3d.cpu.greedy_head import GreedyHead
from d3d.data.prompts import mtbench_prompts
from d3d.fetch import resolve_model

torch.set_grad_enabled(False)
path = resolve_model(sys.argv[1])
m, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
W = m.output_weight()
hs = []
hook = m.norm.register_forward_hook(lambda mod, i, o: hs.append(o.reshape(-1, o.shape[-1])[-1:].clone()))
for i in (1, 5, 9, 20, 30):
    p = tok.encode_chat([{"role": "user", "content": mtbench_prompts()[i]}])
    d3d.generate(m, p, max_new_tokens=24, spec="ar", stop_ids=tok.stop_token_ids())
hook.remove()
H = torch.cat(hs)
q, scale, _, _ = W.rowmajor()
n, K = q.shape
sc = scale.view(n, K // 32)
g = H.view(len(H), K // 32, 32)
sx = g.abs().amax(-1) / 127
qx = torch.where(sx[..., None] > 0, g / sx[..., None], 0.0).round()
pos, neg = qx.clamp(min=0).sum(-1) * sx, qx.clamp(max=0).sum(-1) * sx  # [rows, groups]
xq = (qx * sx[..., None]).view(len(H), K)
print(f"{sys.argv[1]}: {W}; {len(H)} rows")
for drop in (2, 3):
    B = 2 ** drop
    A = ((B * torch.div(q, B, rounding_mode="floor").float()).view(n, K // 32, 32) * sc[..., None]).view(n, K) @ xq.T
    for name, up, lo in (("per group", (B - 1) * sc @ pos.T, (B - 1) * sc @ neg.T),
                         ("column max", (B - 1) * sc.amax(1)[:, None] * pos.sum(1), (B - 1) * sc.amax(1)[:, None] * neg.sum(1))):
        c = sorted(((A + up) >= (A + lo).amax(0)).sum(0).tolist())
        print(f"low {drop} bits to the bounds, {name:10s}: columns a row median {c[len(c) // 2]}, "
              f"p90 {c[int(len(c) * 0.9)]}, max {c[-1]}")
t = time.perf_counter()
head = GreedyHead(W)
print(f"GreedyHead: {head.nbytes / 1e6:.1f} MB beside the head ({W.nbytes / 1e6:.1f} MB), built in "
      f"{time.perf_counter() - t:.2f} s")
