"""Greedy logits from an int8 LM head in fewer bytes: the argmax of every row, exactly, reading 3/4 of the head.

A greedy pass needs the argmax of each row's logits, not the logits. The head of a Q8_0 GGUF (the Qwen2.5-Coder-0.5B's:
151,936 x 896 int8, a third of a decoding step's bytes) is read here in two stages:

1. **Bounds.** Each weight q = 4 h + l with h = q >> 2 in [-32, 31] and l in [0, 3]. The int6 matrix of the h (the
   kernels' int6 panels, with the head's own scales) gives A_n, a quarter of every column's approximate logit, from 3/4
   of the bytes. With the activations quantized as the int8 kernels quantize them (qx, sx per group of 32: the same
   integers), a quarter of the exact logit lies in A_n + 3/4 sum_g s[n, g] sx_g [neg_g, pos_g] (neg_g, pos_g: the sums
   of the negative and positive qx of group g), up to fp32 rounding, which ``margin`` bounds.
   ``glue_cpu.head_candidates`` bounds with each column's largest scale first (one multiply a column), then with
   every group's scale for the columns left.
2. **Exact.** The panels of 16 columns whose upper bound reaches the best lower bound (on real text a median of 14 of
   9,496 a row) are computed by the int8 kernel itself: the same bits as the full head.

Every other column is set to -inf: each is below the row's maximum, so the argmax (lowest index on ties) is the full
head's. Only for passes whose every row is greedy (``Transformer.forward(greedy=True)``) and of up to ``rows`` rows
(``GREEDY_ROWS``); sampling needs the logits. It keeps the int6 copy beside the head (+103 MB for the 0.5B).
Measured (the 0.5B on an Intel Xeon: ar 1.07-1.10x, sync 1.01-1.06x on evaluation requests): docs/results/greedy-head/.
"""

from __future__ import annotations

import torch

from ..kernels import glue_cpu, quant as kernel
from .quant import QuantWeight

SHIFT = 2  # bits of each int8 weight left to the bounds: int6 values, 3 / 4 of a scale unit unknown
# passes of up to this many rows take it, by the int8 kernel that runs: with VNNI 8 rows measured even and 16 slower,
# the AVX2 kernel 1.02-1.11x at 1-16 rows (this Xeon standing in for an AVX2-only CPU; docs/results/greedy-head/)
GREEDY_ROWS = {"vnni": 4, "avx2": 16}


class GreedyHead:
    """Exact greedy logits (``logits``) of an int8 ``QuantWeight`` with non-negative scales per group of 32 that
    multiplies int8 activations; ``fits`` says which do."""

    def __init__(self, w: QuantWeight):
        if not self.fits(w):
            raise ValueError(f"GreedyHead: {w} is not an int8 matrix with groups of 32, non-negative scales and int8 "
                             "activations")
        q, scale, _, _ = w.rowmajor()
        self.w, self.n = w, w.out_features
        self.hi_q, self.hi_h = kernel.int6_to_panels(q >> SHIFT)  # [-32, 31]: the kernel's int6, with w's scales
        self.col_max = scale.amax(1).contiguous()  # [N]
        self.rows = GREEDY_ROWS["vnni" if kernel.vnni_available() else "avx2"]  # the most rows a pass takes it for
        self.approx = kernel.bound(self.hi_q, self.hi_h, w.scale, None, self.n, 32, 6, int8_activations=True)

    @staticmethod
    def fits(w) -> bool:
        if not isinstance(w, QuantWeight) or w.bits != 8 or w.group != 32 or w.six or not w.int8_activations:
            return False
        return isinstance(w.scale, torch.Tensor) and bool((w.scale >= 0).all())  # the panels' (padding is 0)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.hi_q, self.hi_h, self.col_max))

    def sums(self, x: torch.Tensor):
        """Per row and group of 32, as the int8 kernels quantize x [T, K]: sx * (the sum of the negative qx), the
        same of the positive ones, and a bound on the fp32 rounding of any column's logit."""
        g = x.view(x.shape[0], -1, 32)
        sx = g.abs().amax(-1) / 127
        qx = torch.where(sx[..., None] > 0, g / sx[..., None], 0.0).round()
        neg, pos = qx.clamp(max=0).sum(-1) * sx, qx.clamp(min=0).sum(-1) * sx
        # |each term| <= s sx 128 sum |qx|; 29 roundings of relative 2^-24 a sum, two sums (the approximation and
        # the exact logit): 2^-16 of the sum of the terms' bounds is four times that
        margin = float(self.col_max.max()) * 128 * (pos - neg).sum(-1) * 2.0 ** -16
        return neg, pos, margin

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] fp32 -> [T, N]: the exact logits of the columns that can be a row's maximum, -inf elsewhere (the
        full head's logits where some approximation is NaN)."""
        x, w = x.contiguous(), self.w
        # A / 4: the high bits h with w's own scales (a quarter of sum s sx 4 h, exactly); the exact logit lies in
        # 4 A + 3 sum_g s sx [neg, pos], so A + 3/4 of those bounds brackets a quarter of it
        out = self.approx(x)
        neg, pos, margin = self.sums(x)
        span = (2 ** SHIFT - 1) / 2 ** SHIFT
        panels = glue_cpu.head_candidates(out, self.col_max, w.scale, neg * span, pos * span, margin / 2 ** SHIFT)
        if panels is None:
            return w.linear(x)
        exact = kernel.bound(w.q.index_select(0, panels), None, w.scale.index_select(0, panels), None,
                             len(panels) * kernel.PANEL, 32, 8, int8_activations=True)(x)
        cols = (panels[:, None] * kernel.PANEL + torch.arange(kernel.PANEL)).flatten()
        inside = cols < self.n
        out[:, cols[inside]] = exact[:, inside]
        return out


__all__ = ["GreedyHead", "GREEDY_ROWS"]
