"""How tight greedy bounds from a separate int4 copy of a Q6_K head would be (the 1.5B's: 151,936 x 1536, 191 MB).
Each group of 16 weights re-quantized to 4 bits by truncation over its own range (w - w_int4 in [0, E) per group, E
kept per column and group), the activations quantized as the two-level kernels quantize them (one scale per 256
inputs, up to 3 more bits for a quiet group of 16): a column's exact logit lies in A + sum_g E [neg_g, pos_g] (A: the
copy's logit). Rows: the final norm's outputs while the model answers 5 MT-Bench questions greedily (24 tokens each).
Prints the columns whose upper bound reaches the best lower bound, per group and with each column's largest E first.
Not built (docs/results/greedy-head/README.md). Run from the repository root:

    python docs/results/greedy-head/bounds_int4.py > docs/results/greedy-head/bounds_int4_1.5b.txt
"""
import time

import torch

from rows import final_rows

m, W, H = final_rows("qwen2.5-coder-1.5b")
n, K = W.out_features, W.in_features
G = 16
# activations as the two-level kernels quantize them: sx per 256, e per group of 16
xs = H.view(len(H), K // 256, 256)
top = xs.abs().amax(-1, keepdim=True)
sx = top / 127
gm = H.view(len(H), K // 256, 16, 16).abs().amax(-1)
e = torch.zeros_like(gm)
for _ in range(3):
    e = torch.where((e < 3) & (gm * 2 ** (e + 1) <= top), e + 1, e)
step = (sx / 2 ** e)  # [rows, 6, 16]
qx = torch.where(step[..., None] > 0, H.view(len(H), K // 256, 16, 16) / step[..., None], 0.0).round()
xq = (qx * step[..., None]).view(len(H), K)
pos = (qx.clamp(min=0).sum(-1) * step).view(len(H), K // G)
neg = (qx.clamp(max=0).sum(-1) * step).view(len(H), K // G)
A = torch.empty(len(H), n); L = torch.empty(len(H), n); E = torch.empty(n, K // G)
t = time.perf_counter()
for r in range(0, n, 8192):
    rows = torch.arange(r, min(n, r + 8192))
    w = W.dequantize(rows).double().view(len(rows), K // G, G)
    lo, hi = w.amin(-1), w.amax(-1)
    a = ((hi - lo) / 15).clamp_min(1e-30)
    u = torch.floor((w - lo[..., None]) / a[..., None]).clamp(0, 15)
    wh = u * a[..., None] + lo[..., None]
    err = w - wh
    assert (err >= 0).all()
    E[rows] = err.amax(-1).float()
    A[:, rows] = (xq.double() @ wh.view(len(rows), K).T).float()
    L[:, rows] = (xq.double() @ w.view(len(rows), K).T).float()
print(f"built in {time.perf_counter() - t:.0f} s; E median {E.median():.3g}, "
      f"w abs mean {W.dequantize(torch.arange(1000)).abs().mean():.3g}")
up, low = A + pos @ E.T, A + neg @ E.T
best = low.amax(1, keepdim=True)
c = sorted((up >= best).sum(1).tolist())
cm = E.amax(1)
upc, lowc = A + pos.sum(1, keepdim=True) * cm, A + neg.sum(1, keepdim=True) * cm
c2 = sorted((upc >= lowc.amax(1, keepdim=True)).sum(1).tolist())
assert ((L <= up + 1e-3) & (L >= low - 1e-3)).all()
agree = (L.argmax(1) == (torch.where(up >= best, L, -1e30)).argmax(1)).all()
q = lambda c: f"median {c[len(c)//2]}, p90 {c[int(len(c)*0.9)]}, max {c[-1]}"
print(f"{len(H)} rows; per-group bounds: columns {q(c)}; column-max stage leaves {q(c2)}; argmax kept {bool(agree)}")
