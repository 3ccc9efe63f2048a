"""Weight-only quantized matrices for CPU inference: int8, int5 and int4 groups, in the kernels' panels.

A ``QuantWeight`` stands where a model's weight tensor stands (``QuantLinear.weight``, the embedding,
the LM head). Its values are defined exactly, group by group along k (G consecutive inputs of one
output row share a scale s, and for int4 a min m):

    int8   w = fl(q * s),            q in [-128, 127]   (symmetric; G = K is one scale per row)
    int5   w = fl((q - 16) * s),     q in [0, 31]       (a nibble and a high bit)
    int4   w = fl(fl(q * s) - m),    q in [0, 15]       (a scale and a min per group)

These hold llama.cpp's blocks without re-quantization error: Q8_0 is int8 with G = 32, Q5_0 int5
with G = 32 (both with fp16 scales, their own), Q6_K int8 with G = 16 (s = d * sc, exact in fp32),
Q4_K int4 with G = 32 (s = d * sc, m = dmin * mn, exact), which is what ``d3d.model.gguf`` keeps.
K-quant scales and mins stay ``Factored`` as the GGUF holds them (an int8 factor per group, an fp16
one per super-block of 256) where the VNNI kernel multiplies: a quarter of fp32 scales' bytes, and there the
group factors apply in integers (``two_level``). From a dense checkpoint, ``quantize`` makes int8 with one
scale per row, or int4 with G = ``INT4_GROUP``.

Products go through ``d3d.kernels.quant``: with fp32 activations (AVX2 / AVX-512, bit for bit the
fp32 panel kernel on ``dequantize()``) or, where ``int8_activations`` says so, with int8 activations
and integer dot products (AVX-512 VNNI, or AVX2 with the same bits). Both are row-invariant. Without the kernels there is no
quantized path: ``load_model`` then keeps dense weights and warns.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from .. import env
from ..hardware import cpu_flags
from ..kernels import quant as kernel, quant_dense
from . import prefill

FORMATS = ("int8", "int4")  # what ``quantize`` makes from dense weights (int5 comes from GGUF Q5_0 only)
INT4_GROUP = 32  # the group of int4 made from dense weights (Q4_K's group)


@dataclass(frozen=True)
class Factored:
    """Group scales (or mins) [N, K/G] held as two factors, as llama.cpp's K-quants hold them: ``f`` int8
    per group and ``d`` (fp16 values) per super-block of ``f.shape[1] // d.shape[1]`` groups. The value
    is fl(d * f), exact in fp32 (11 bits times at most 8), so both forms give the same products."""

    f: torch.Tensor
    d: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.f.shape

    def dim(self) -> int:
        return 2

    def expand(self) -> torch.Tensor:
        """The fp32 values [N, K/G]."""
        return self.d.float().repeat_interleave(self.f.shape[1] // self.d.shape[1], dim=1) * self.f.float()

    def check(self, n: int, what: str) -> None:
        if (self.f.dtype != torch.int8 or self.f.dim() != 2 or self.d.dim() != 2 or self.f.shape[0] != n
                or self.d.shape[0] != n or self.d.shape[1] == 0 or self.f.shape[1] % self.d.shape[1]
                or not torch.equal(self.d.half().float(), self.d.float())):
            raise ValueError(f"{what}: factored scales need int8 f [{n}, K/G] and fp16-exact d [{n}, D] with D "
                             f"dividing K/G, got {self.f.dtype} {tuple(self.f.shape)}, {self.d.dtype} "
                             f"{tuple(self.d.shape)}")


def values(t):
    """fp32 scales or mins from a tensor or ``Factored`` (None stays None)."""
    return t.expand() if isinstance(t, Factored) else None if t is None else t.float()


class QuantWeight:
    """W [N, K] as int8/int5/int4 groups. Built from row-major q ([N, K] int8 for int8; [N, K/2]
    uint8, k even in the low nibble, for int4 and int5), int5's high bits ``high`` [N, K/8] uint8
    (bit i of byte b: k = 8 b + i), ``scale`` [N, K/G] and, for int4, ``min`` [N, K/G]; stored as
    panels, the scales in fp16 where that is exact (half the bytes), else fp32."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor | Factored, min: torch.Tensor | Factored | None = None,
                 high: torch.Tensor | None = None, what: str = "weight"):
        bits = 8 if q.dtype == torch.int8 else (5 if high is not None else 4) if q.dtype == torch.uint8 else None
        if bits is None or q.dim() != 2:
            raise ValueError(f"{what}: q must be 2-D int8 (int8) or uint8 (int4/int5, two per byte), got {q.dtype} "
                             f"{tuple(q.shape)}")
        n, k = q.shape[0], q.shape[1] * (1 if bits == 8 else 2)
        if scale.dim() != 2 or scale.shape[0] != n or scale.shape[1] == 0 or k % scale.shape[1]:
            raise ValueError(f"{what}: scale {tuple(scale.shape)} does not fit q {tuple(q.shape)} (expected [{n}, "
                             f"K/G] with G dividing K={k})")
        if (min is not None) != (bits == 4) or (min is not None and min.shape != scale.shape):
            raise ValueError(f"{what}: int4 needs a min shaped like its scale, int8 and int5 none")
        if high is not None and (high.dtype != torch.uint8 or tuple(high.shape) != (n, k // 8)):
            raise ValueError(f"{what}: int5's high bits must be uint8 [{n}, {k // 8}], got {high.dtype} "
                             f"{tuple(high.shape)}")
        self.bits, self.out_features, self.in_features = bits, n, k
        self._call = None  # the kernel bound to these panels (linear)
        self._tiles = None  # ... and the tiles' (a prefill's passes: d3d.cpu.prefill)
        self.group = k // scale.shape[1]
        if bits != 8 and self.group % 2:
            raise ValueError(f"{what}: int4/int5 groups must be even, got {self.group}")
        self.int8_activations = int8_activations(k, self.group)
        for t in (scale, min):
            if isinstance(t, Factored):
                t.check(n, what)
        self.scale_d = self.min_d = None  # two-level: the fp16 factors of Factored scales and mins
        factored = self.int8_activations and two_level(scale, min, self.group)
        # int8 values in [-32, 31] with two-level scales (Q6_K's) are held in 6 bits where the VNNI kernel
        # multiplies: a quarter fewer bytes to stream (the LM head of the Qwen2.5 GGUFs among them); other
        # int8 keeps fp32 scales (the kernel's integer sums of two-level scales are bounded for 6 bits)
        self.six = factored and bits == 8 and k % 8 == 0 and fits_six(q)
        held = factored and (bits == 4 or self.six)
        if self.six:
            self.q, self.high = kernel.int6_to_panels(q)
        else:
            self.q = kernel.to_panels(q.contiguous())
            self.high = None if high is None else kernel.bits_to_panels(high.contiguous(), n)
        if held:
            self.scale, self.scale_d = kernel.to_panels(scale.f), kernel.to_panels(scale.d.half())
            if min is not None:
                self.min, self.min_d = kernel.to_panels(min.f), kernel.to_panels(min.d.half())
            else:
                self.min = None
            return
        scale, min = values(scale), values(min)
        half = all(torch.equal(t.half().float(), t) for t in (scale, min) if t is not None)
        self.scale, self.min = (None if t is None else kernel.to_panels(t.half() if half else t) for t in (scale, min))

    # ---------------------------------------------------------------- what it is

    @property
    def format(self) -> str:
        return "int6" if self.six else f"int{self.bits}"

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
        """Bytes a pass streams (q, high bits, scales and mins, padding included)."""
        return sum(t.numel() * t.element_size() for t in (self.q, self.high, self.scale, self.min, self.scale_d,
                                                          self.min_d) if t is not None)

    def __repr__(self) -> str:
        return f"QuantWeight({self.format}, [{self.out_features}, {self.in_features}], group={self.group})"

    # ---------------------------------------------------------------- values

    def parts(self, rows: torch.Tensor | None = None):
        """(q, scale, min, high) row-major as ``QuantWeight`` takes them (scales ``Factored`` where they
        are held so), for all rows or the LongTensor ``rows``."""
        n = self.out_features
        q, scale, mins = (None if t is None else kernel.from_panels(t, n, rows) for t in (self.q, self.scale, self.min))
        high = None if self.high is None else kernel.bits_from_panels(self.high, n, rows)
        if self.six:
            q, high = kernel.int6_from_panels(self.q, self.high, n, rows), None
        if self.scale_d is not None:
            scale = Factored(scale, kernel.from_panels(self.scale_d, n, rows).float())
            if mins is not None:
                mins = Factored(mins, kernel.from_panels(self.min_d, n, rows).float())
        return q, scale, mins, high

    def rowmajor(self, rows: torch.Tensor | None = None):
        """(q, scale, min, high) row-major with the scales and mins in fp32, for all rows or ``rows``."""
        q, scale, mins, high = self.parts(rows)
        return q, values(scale), values(mins), high

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The fp32 values (of ``rows`` only: the embedding lookup dequantizes just the ids it reads)."""
        q, scale, mins, high = self.rowmajor(rows)
        return kernel.dequantize(q, scale, mins, self.bits, high)

    def select(self, rows: torch.Tensor) -> "QuantWeight":
        """A new QuantWeight of the given rows (a drafter's head over its drafting vocabulary)."""
        return QuantWeight(*self.parts(rows.to(self.device)))

    def __getstate__(self):  # a copy (or a pickle) binds the kernel to its own panels when it first multiplies
        return {**self.__dict__, "_call": None, "_tiles": None}

    def kernel_args(self) -> dict:
        """What the kernel takes besides x (``kernels.quant.bound``; ``d3d.kernels.layers_cpu`` too)."""
        return dict(q=self.q, h=self.high, s=self.scale, m=self.min, n=self.out_features, group=self.group,
                    bits=6 if self.six else self.bits, sd=self.scale_d, md=self.min_d)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] @ W^T (+ bias), computed in fp32 and returned in x's dtype. A decoding pass's x, [T, K]
        contiguous fp32, goes to the kernel as it is: the reshapes and casts had cost ~5 us a call, ~120 calls a
        pass (docs/results/pass-rest/)."""
        if self._call is None:  # bound on first use: the kernel is built then, not when a model loads
            self._call = kernel.bound(**self.kernel_args(), int8_activations=self.int8_activations)
        tiles = prefill.rows(x.shape[0]) if x.dim() == 2 and self.in_features % 32 == 0 else None
        if tiles is not None:  # a long prompt's rows: AMX's bf16 tiles (d3d.cpu.prefill)
            return self.with_tiles(x, tiles, bias)
        if x.dtype == torch.float32 and x.dim() == 2 and x.is_contiguous():
            y = self._call(x)
            return y if bias is None else y.add_(bias)
        y = self._call(x.reshape(-1, self.in_features).float().contiguous())
        if bias is not None:
            y += bias
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def with_tiles(self, x: torch.Tensor, tiles: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``linear`` of x [T, K] with the rows ``tiles`` (a bool mask) through AMX's bf16 tiles, the others through
        the kernel as always (``d3d.cpu.prefill``)."""
        if self._tiles is None:
            self._tiles = quant_dense.bound(**self.kernel_args())
        if bool(tiles.all()):
            y = self._tiles(x)
        else:
            y = x.new_empty(x.shape[0], self.out_features, dtype=torch.float32)
            y[tiles] = self._tiles(x[tiles])
            y[~tiles] = self._call(x[~tiles].float().contiguous())
        return (y if bias is None else y.add_(bias)).to(x.dtype)


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


def int8_activations(k: int, group: int) -> bool:
    """Whether a matrix multiplies int8-quantized activations (``kernels.quant.matmul_vnni``: per row
    and group of 32, or super-block of 256 for K-quants; integer dot products) instead of fp32 ones (``kernels.quant.matmul``: bit-equal
    to the fp32 model). ``D3D_QUANT_ACTIVATIONS`` = ``fp32``, ``int8`` or ``auto`` (the default):
    int8 wherever a kernel builds (AVX-512 VNNI, else AVX2; the same bits). Chosen on the real model: shorter
    decoding steps and faster validation requests with the defaults (which then verify with ``exact``
    attention, ``d3d.decode.engines.generate``; docs/results/quant/README.md, passes.json); on AVX2, steps
    and 8-row verifications 1.7-2.5x shorter (docs/results/avx2-int8/). Its accuracy cost:
    docs/results/quant/quality_qwen25.json."""
    choice = env.read("D3D_QUANT_ACTIVATIONS")
    fits = (group == 16 or group % 32 == 0) and k % (16 if group == 16 else 32) == 0
    if choice == "fp32" or not fits:
        return False
    if choice == "int8" and not kernel.int8_available():
        raise RuntimeError(f"D3D_QUANT_ACTIVATIONS=int8: {kernel.why_int8_unavailable()}")
    return kernel.int8_available()


def two_level(scale, min, group: int) -> bool:
    """Whether the VNNI kernel may take these scales as two factors (``quant_vnni.cpp``: activations
    quantized per super-block, group factors applied in integers): groups of 16 or 32 in super-blocks of
    256 inputs, as llama.cpp's K-quants hold them, for int4 or int6 weights (``QuantWeight``); otherwise
    their fp32 values."""
    return (isinstance(scale, Factored) and (min is None or isinstance(min, Factored)) and group in (16, 32)
            and group * (scale.f.shape[1] // scale.d.shape[1]) == 256)


def fits_six(q: torch.Tensor) -> bool:
    """Whether int8 values all lie in [-32, 31] (Q6_K's), so that int6 holds them exactly."""
    lo, hi = torch.aminmax(q)
    return int(lo) >= -32 and int(hi) <= 31


def int5_kept() -> bool:
    """Whether int5 stays int5 in memory: on CPUs with AVX-512 (BW, VL) its unpacking costs about
    what the bytes it saves do (docs/results/quant/kernels.txt), and so with int8 activations on AVX2
    (passes of the real 0.5B 6-14% shorter than with int5 widened, docs/results/avx2-int8/); the AVX2 code
    with fp32 activations unpacks it much slower than int8, so there int5 is widened to int8 at load (exact)."""
    return {"avx512bw", "avx512vl"} <= cpu_flags() or int8_activations(32, 32)  # Q5_0: groups of 32


def widen(parts: tuple) -> tuple:
    """Row-major int5 ``(q, scale, None, high)`` -> the same weights as int8 ``(q - 16, scale, None, None)``
    (int5 comes from Q5_0 only: its scales are never ``Factored``)."""
    q, scale, _, high = parts
    q = kernel.unpack_nibbles(q) | (kernel.unpack_bits(high) << 4)
    return (q.to(torch.int8) - 16), scale, None, None


def join(parts: list[tuple], what: str = "weight") -> QuantWeight | Stacked:
    """Row blocks, each row-major ``(q, scale, min, high)`` as ``QuantWeight`` takes them, -> one
    matrix (``d3d.model.checkpoint`` fuses q/k/v and gate/up): one QuantWeight when every block has the
    same format, with groups refined to the smallest (exact: a group's scale applies to each of its
    halves; int8 activations then take the smaller group too), else a ``Stacked`` of the runs of neighbouring
    blocks of one format and group, which give the bits they give alone (a Q4_K_M layer's q and k beside its
    v of another format: one call fewer a layer, those projections 1.13-1.17x faster on both real models,
    docs/results/kquant-rows/qk_join_*.txt)."""
    if not int5_kept():
        parts = [widen(p) if p[3] is not None else p for p in parts]
    if joins(parts):
        return one(parts, what)
    runs = itertools.groupby(parts, lambda p: (block_kind(p), block_group(p)))  # neighbours of one format and group
    return Stacked([one(list(run), what) for _, run in runs])


def block_kind(block: tuple) -> tuple:
    """A row-major block's format: what ``join`` requires its blocks to share."""
    q, s, m, h = block
    return q.dtype, q.shape[1], m is None, h is None


def block_group(block: tuple) -> int:
    """A row-major block's group (inputs a scale covers)."""
    q, s, m, h = block
    return q.shape[1] * (1 if q.dtype == torch.int8 else 2) // s.shape[1]


def joins(parts: list[tuple]) -> bool:
    """Whether row blocks share one format, and groups that refine to the smallest (``join``)."""
    groups = [block_group(p) for p in parts]
    return len({block_kind(p) for p in parts}) == 1 and not any(g % min(groups) for g in groups)


def one(parts: list[tuple], what: str) -> QuantWeight:
    """Row blocks that ``joins`` -> one QuantWeight."""
    groups = [block_group(p) for p in parts]
    smallest = min(groups)
    if len(parts) == 1:
        return QuantWeight(*parts[0], what=what)
    parts = factored_alike(parts)
    if isinstance(parts[0][1], Factored):  # alike (factored_alike): the factors join row-wise
        scale, mins = (None if parts[0][i] is None else Factored(torch.cat([p[i].f for p in parts]),
                                                                 torch.cat([p[i].d for p in parts])) for i in (1, 2))
        return QuantWeight(torch.cat([p[0] for p in parts]), scale, mins, what=what)
    cat = lambda i, refine: None if parts[0][i] is None else torch.cat(  # noqa: E731
        [p[i].repeat_interleave(g // smallest, dim=1) if refine else p[i] for p, g in zip(parts, groups)])
    return QuantWeight(cat(0, False), cat(1, True), cat(2, True), cat(3, False), what=what)


def factored_alike(parts: list[tuple]) -> list[tuple]:
    """Row blocks to join keep ``Factored`` scales only where all have them in one shape of groups and
    super-blocks; otherwise every block's scales and mins become fp32 values (the same numbers)."""
    shapes = {tuple((t.f.shape[1], t.d.shape[1]) if isinstance(t, Factored) else None for t in p[1:3]) for p in parts}
    if len(shapes) == 1 and isinstance(parts[0][1], Factored):
        return parts
    return [(q, values(s), values(m), h) for q, s, m, h in parts]


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
    lo, hi = g.amin(dim=2).half().float(), g.amax(dim=2)  # fp16 scale and min: 2 bytes each, exact in the kernel
    scale = ((hi - lo) / 15).clamp_min(2 ** -24).half().float()
    q = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8).view(n, k)
    return QuantWeight(kernel.pack_nibbles(q), scale, -lo)


def is_quantized(w) -> bool:
    return isinstance(w, (QuantWeight, Stacked))


__all__ = ["QuantWeight", "Factored", "Stacked", "join", "quantize", "is_quantized", "values", "FORMATS", "INT4_GROUP"]
