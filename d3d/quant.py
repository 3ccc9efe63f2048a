"""Weight-only quantized matrices for CPU inference: int8 and int4 groups, in the kernel's panels.

A ``QuantWeight`` stands where a model's weight tensor stands (``Linear.weight``, the embedding,
the LM head). Its values are defined exactly, group by group along k (G consecutive inputs of one
output row share a scale s, and for int4 a min m):

    int8   w = fl(q * s),            q in [-128, 127]   (symmetric; G = K is one scale per row)
    int4   w = fl(fl(q * s) - m),    q in [0, 15]       (a scale and a min per group)

These hold llama.cpp's blocks without re-quantization error: Q8_0 and Q5_0 are int8 with G = 32,
Q6_K is int8 with G = 16 (s = d * sc, exact in fp32), Q4_K is int4 with G = 32 (s = d * sc,
m = dmin * mn, exact), which is what ``d3d.gguf`` keeps. From a dense checkpoint, ``quantize``
makes int8 with one scale per row, or int4 with G = ``INT4_GROUP``.

Products go through ``d3d.kernels.quant`` (AVX2 panels; row-invariant, bit for bit the fp32 panel
kernel on ``dequantize()``). Without the kernel there is no quantized path: ``load_model`` then
keeps dense weights and warns.
"""

from __future__ import annotations

import torch

from .kernels import quant as kernel

FORMATS = ("int8", "int4")
INT4_GROUP = 32  # the group of int4 made from dense weights (Q4_K's group)


class QuantWeight:
    """W [N, K] as int8/int4 groups. Built from row-major q [N, K] int8 or [N, K/2] uint8 (k even in
    the low nibble), scale [N, K/G] and, for int4, min [N, K/G] (fp32); stored as panels."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, min: torch.Tensor | None = None, what: str = "weight"):
        bits = 8 if q.dtype == torch.int8 else 4 if q.dtype == torch.uint8 else None
        if bits is None or q.dim() != 2:
            raise ValueError(f"{what}: q must be 2-D int8 (int8) or uint8 (int4, two per byte), got {q.dtype} "
                             f"{tuple(q.shape)}")
        n, k = q.shape[0], q.shape[1] * (8 // bits)
        if scale.dim() != 2 or scale.shape[0] != n or scale.shape[1] == 0 or k % scale.shape[1]:
            raise ValueError(f"{what}: scale {tuple(scale.shape)} does not fit q {tuple(q.shape)} (expected [{n}, "
                             f"K/G] with G dividing K={k})")
        if (min is not None) != (bits == 4) or (min is not None and min.shape != scale.shape):
            raise ValueError(f"{what}: int4 needs a min shaped like its scale, int8 none")
        self.bits, self.out_features, self.in_features = bits, n, k
        self.group = k // scale.shape[1]
        if bits == 4 and self.group % 2:
            raise ValueError(f"{what}: int4 groups must be even, got {self.group}")
        self.q = kernel.to_panels(q.contiguous())
        self.scale = kernel.to_panels(scale.float().contiguous())
        self.min = None if min is None else kernel.to_panels(min.float().contiguous())

    # ---------------------------------------------------------------- what it is

    @property
    def format(self) -> str:
        return f"int{self.bits}"

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32  # what it computes in and returns

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def nbytes(self) -> int:
        """Bytes a pass streams (q, scales and mins, padding included)."""
        return sum(t.numel() * t.element_size() for t in (self.q, self.scale, self.min) if t is not None)

    def __repr__(self) -> str:
        return f"QuantWeight({self.format}, [{self.out_features}, {self.in_features}], group={self.group})"

    # ---------------------------------------------------------------- values

    def rowmajor(self, rows: torch.Tensor | None = None):
        """(q, scale, min) row-major, for all rows or the LongTensor ``rows``."""
        n = self.out_features
        return tuple(None if t is None else kernel.from_panels(t, n, rows) for t in (self.q, self.scale, self.min))

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The fp32 values (of ``rows`` only: the embedding lookup dequantizes just the ids it reads)."""
        return kernel.dequantize(*self.rowmajor(rows), self.bits)

    def select(self, rows: torch.Tensor) -> "QuantWeight":
        """A new QuantWeight of the given rows (a drafter's head over its drafting vocabulary)."""
        return QuantWeight(*self.rowmajor(rows.to(self.device)))

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] @ W^T (+ bias), computed in fp32 and returned in x's dtype."""
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.float32:
            x2 = x2.float()
        y = kernel.matmul_packed(x2.contiguous(), self.q, self.scale, self.min, self.out_features, self.bits)
        if bias is not None:
            y += bias
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


class Stacked:
    """Row blocks of one fused matrix that cannot share one format (q/k/v of other bits or groups):
    each block multiplies on its own and the outputs are joined; every row is computed as alone."""

    def __init__(self, parts: list[QuantWeight]):
        self.parts = parts
        self.out_features, self.in_features = sum(p.out_features for p in parts), parts[0].in_features

    format = property(lambda self: "+".join(sorted({p.format for p in self.parts})))
    shape = QuantWeight.shape
    dtype = QuantWeight.dtype
    device = property(lambda self: self.parts[0].device)
    nbytes = property(lambda self: sum(p.nbytes for p in self.parts))

    def dequantize(self, rows=None):
        if rows is not None:
            raise NotImplementedError("row lookup of a fused matrix")
        return torch.cat([p.dequantize() for p in self.parts])

    def linear(self, x, bias=None):
        y = torch.cat([p.linear(x) for p in self.parts], dim=-1)
        return y + bias if bias is not None else y


def join(parts: list[QuantWeight]) -> QuantWeight | Stacked:
    """Row blocks -> one matrix (``d3d.checkpoint`` fuses q/k/v and gate/up): one QuantWeight when
    every block has the same format, with groups refined to the smallest (exact: a group's scale
    applies to each of its halves), else a ``Stacked``."""
    if len(parts) == 1:
        return parts[0]
    if len({(p.bits, p.in_features) for p in parts}) > 1:
        return Stacked(parts)
    group = min(p.group for p in parts)
    if any(p.group % group for p in parts):
        return Stacked(parts)
    blocks = [p.rowmajor() for p in parts]
    refine = lambda t, p: None if t is None else t.repeat_interleave(p.group // group, dim=1)  # noqa: E731
    q = torch.cat([b[0] for b in blocks])
    scale = torch.cat([refine(b[1], p) for b, p in zip(blocks, parts)])
    mins = None if parts[0].bits == 8 else torch.cat([refine(b[2], p) for b, p in zip(blocks, parts)])
    return QuantWeight(q, scale, mins)


def quantize(w: torch.Tensor, fmt: str, group: int = INT4_GROUP) -> QuantWeight:
    """A dense [N, K] matrix -> int8 with one scale per row (max |w| / 127), or int4 in groups of
    ``group`` with scale (max - min) / 15 and min -min(w) (both round to nearest)."""
    w = w.detach().float()
    if fmt == "int8":
        scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
        return QuantWeight((w / scale).round().clamp(-127, 127).to(torch.int8), scale)
    if fmt != "int4":
        raise ValueError(f"quantize: format {fmt!r}: expected one of {FORMATS}")
    n, k = w.shape
    if k % group:
        raise ValueError(f"quantize: int4 groups of {group} do not divide the {k} inputs of a [{n}, {k}] matrix")
    g = w.view(n, k // group, group)
    lo, hi = g.amin(dim=2), g.amax(dim=2)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    q = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8).view(n, k)
    return QuantWeight(q[:, 0::2] | (q[:, 1::2] << 4), scale, -lo)


def is_quantized(w) -> bool:
    return isinstance(w, (QuantWeight, Stacked))


__all__ = ["QuantWeight", "Stacked", "join", "quantize", "is_quantized", "FORMATS", "INT4_GROUP"]
