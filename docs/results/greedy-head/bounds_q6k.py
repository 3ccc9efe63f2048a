"""Whether the greedy head's two stages would pay for a Q6_K LM head (the 1.5B's): its weights q in [-32, 31] with a
signed scale per group of 16; q = 4 h + l leaves h in [-8, 7] (int4, 2/3 of the bytes) to the first stage and
l in [0, 3] to the bounds. The 1.5B answers 5 MT-Bench questions greedily (24 tokens each); for each row, the
columns whose upper bound (every group's scale, its sign taken into account) reaches the best lower bound, and how
many groups' scales are negative. Activations quantized per group of 16 as a plain int8 kernel would (fp32, no
rounding margin: a lower bound on the candidates). Run from the repository root:

    python docs/results/greedy-head/bounds_q6k.py qwen2.5-coder-1.5b > bounds_q6k.txt
"""
import sys

import torch

import d3d
from d3d.cpu.quant import Factored
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
sc = scale.expand() if isinstance(scale, Factored) else scale
n, K = q.shape
G = W.group
g = H.view(len(H), K // G, G)
sx = g.abs().amax(-1) / 127
qx = torch.where(sx[..., None] > 0, g / sx[..., None], 0.0).round()
pos, neg = qx.clamp(min=0).sum(-1) * sx, qx.clamp(max=0).sum(-1) * sx  # [rows, groups]
xq = (qx * sx[..., None]).view(len(H), K)
A = ((4 * torch.div(q, 4, rounding_mode="floor").float()).view(n, K // G, G) * sc[..., None]).view(n, K) @ xq.T
sp, sn = sc.clamp(min=0), sc.clamp(max=0)  # l >= 0: a negative scale swaps the group's bounds
up, lo = A + 3 * (sp @ pos.T + sn @ neg.T), A + 3 * (sp @ neg.T + sn @ pos.T)
c = sorted((up >= lo.amax(0)).sum(0).tolist())
print(f"{sys.argv[1]}: {W} ({W.format}); {len(H)} rows; {int((sc < 0).sum())} of {sc.numel()} group scales negative")
print(f"low 2 bits to the bounds, per group: columns a row median {c[len(c) // 2]}, p90 {c[int(len(c) * 0.9)]}, "
      f"max {c[-1]} (of {n})")
print(f"bounds cost per row: {K // G} groups x {n} columns = {K // G * n / 1e6:.1f} M multiply-adds; the first "
      f"stage saves {n * K * 2 / 8 / 1e6:.0f} MB of the head's {W.nbytes / 1e6:.0f} MB")
