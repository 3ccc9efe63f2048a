"""Weight-only int8/int5/int4 matmuls for few-row passes on x86 CPUs, their launchers and wrappers.

    w[n, k] = fl(q[n, k] * s[n, k // G])                     int8, q in [-128, 127]
    w[n, k] = fl((q[n, k] - 16) * s[n, k // G])              int5, q in [0, 31] (a nibble + a high bit)
    w[n, k] = fl(fl(q[n, k] * s[n, k // G]) - m[n, k // G])  int4, q in [0, 15]
    y[m, n] = sum_k x[m, k] w[n, k], one fma chain over k = 0 .. K-1 per (m, n)

x [M, K] fp32; q, s, m (fp32 or fp16) in the 16-column panels of ``d3d.kernels.skinny``
(``to_panels``; int5's high bits through ``bits_to_panels``); y [M, N] fp32. AVX2 code runs on every
x86-64 CPU with AVX2 + FMA, AVX-512 code where the CPU has it (F, BW, VL); both give the same bits.
The kernel dequantizes in registers and then computes exactly what the fp32 panel kernel computes
on the dequantized matrix: every row of an M-row product equals the 1-row product of that row bit
for bit, for every M, and equals ``naive.skinny_matmul_reference(x, dequantize(...))``.

Torch reference: ``dequantize`` + ``F.linear``. Loop oracle: ``naive.quant_matmul_reference``.

``matmul_vnni`` (``quant_vnni.cpp``, AVX-512 VNNI + VBMI + BITALG) reads the same panels but quantizes the
activations to int8 per row and group (per super-block of 256 for two-level K-quant scales) and sums
exact integer dot products (numerics in that file; loop oracles ``naive.quant_vnni_reference`` and
``naive.quant_vnni_two_level_reference``). It also reads int6 (``int6_to_panels``: Q6_K's values, 6.5
bits a weight with their scales instead of int8's 8.5). ``matmul_maddubs`` (``quant_maddubs.cpp``, AVX2) takes
the same arguments and gives the same bits on CPUs without VNNI; ``int8_kernel`` is the one this CPU runs.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import torch

from .cpp import AVX2, AVX2_FLAGS, build

SOURCE = Path(__file__).with_name("quant_gemm.cpp")
PANEL = 16


@functools.cache
def _load():
    """(module, None) or (None, why not). -ffp-contract=off: int4's q * s - m must round twice, as in torch."""
    return build("d3d_quant_gemm", SOURCE, AVX2_FLAGS + ["-ffp-contract=off"])


VNNI_SOURCE = Path(__file__).with_name("quant_vnni.cpp")
VNNI_FLAGS = frozenset({"avx512bw", "avx512_vnni", "avx512vbmi", "avx512_bitalg"})


@functools.cache
def _load_vnni():
    """The int8-activation kernel (``quant_vnni.cpp``): (module, None) or (None, why not)."""
    return build("d3d_quant_vnni", VNNI_SOURCE, AVX2_FLAGS, needs=AVX2 | VNNI_FLAGS)


def vnni_available() -> bool:
    return _load_vnni()[0] is not None


def why_vnni_unavailable() -> str | None:
    return _load_vnni()[1]


MADDUBS_SOURCE = Path(__file__).with_name("quant_maddubs.cpp")


@functools.cache
def _load_maddubs():
    """The int8-activation kernel for AVX2 (``quant_maddubs.cpp``): (module, None) or (None, why not)."""
    return build("d3d_quant_maddubs", MADDUBS_SOURCE, AVX2_FLAGS, needs=AVX2 | {"f16c"})


def maddubs_available() -> bool:
    return _load_maddubs()[0] is not None


def why_maddubs_unavailable() -> str | None:
    return _load_maddubs()[1]


def int8_kernel():
    """The int8-activation kernel this CPU runs: VNNI's where it has AVX-512 VNNI, else the AVX2 one (the same
    bits); None where neither builds."""
    return _load_vnni()[0] or _load_maddubs()[0]


def int8_available() -> bool:
    return int8_kernel() is not None


def why_int8_unavailable() -> str | None:
    return None if int8_available() else f"VNNI: {_load_vnni()[1]}; AVX2: {_load_maddubs()[1]}"


def matmul_vnni(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None, n: int, bits: int,
                h: torch.Tensor | None = None, sd: torch.Tensor | None = None,
                md: torch.Tensor | None = None) -> torch.Tensor:
    """``matmul`` with the activations quantized to int8 per row and group of 32 (16 where the weights'
    group is 16) and integer dot products (``quant_vnni.cpp``; numerics there). Needs AVX-512 VNNI.
    Two-level scales (this kernel only): ``s`` (and ``m``) int8 factors per group, ``sd`` (and ``md``)
    fp16 factors per super-block of groups, panels [P, D, 16]: the scale is fl(sd * s)."""
    return _int8_matmul(_load_vnni(), "the VNNI kernel", x, q, s, m, n, bits, h, sd, md)


def matmul_maddubs(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None, n: int, bits: int,
                   h: torch.Tensor | None = None, sd: torch.Tensor | None = None,
                   md: torch.Tensor | None = None) -> torch.Tensor:
    """``matmul_vnni`` on AVX2 (``quant_maddubs.cpp``): the same arguments, the same bits."""
    return _int8_matmul(_load_maddubs(), "the AVX2 int8-activation kernel", x, q, s, m, n, bits, h, sd, md)


def _int8_matmul(loaded, what, x, q, s, m, n, bits, h, sd, md):
    module, why = loaded
    if module is None:
        raise RuntimeError(f"d3d.kernels.quant: {what} is unavailable: {why}")
    _check(x, q, s, m, n, bits, h, two_level=sd is not None)
    return module.matmul(x, q, _EMPTY if h is None else h, s, _EMPTY if m is None else m, n, x.shape[1] // s.shape[1],
                         bits, _EMPTY if sd is None else sd, _EMPTY if md is None else md)


def int8_macs_per_second(seconds: float = 0.05) -> float:
    """The machine's rate of int8 multiply-adds with torch's threads: vpdpbusd on independent chains,
    no memory (``quant_vnni.cpp``'s ``dot_probe``), best of 3. A pass of T rows through ``matmul_vnni``
    cannot take less than T x its multiply-adds at this rate (``bench passes``' floor). Needs AVX-512 VNNI."""
    module, why = _load_vnni()
    if module is None:
        raise RuntimeError(f"d3d.kernels.quant: the VNNI kernel is unavailable: {why}")
    threads, per = torch.get_num_threads(), 12_000
    while True:  # per thread, enough instructions for ``seconds``
        t = time.perf_counter()
        module.dot_probe(per)
        if time.perf_counter() - t >= seconds / 4:
            break
        per *= 4
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        module.dot_probe(per)
        best = min(best, time.perf_counter() - t)
    return threads * per * 64 / best


def available() -> bool:
    """Whether the kernel is built (building it on first call); ``why_unavailable()`` says why not."""
    return _load()[0] is not None


def why_unavailable() -> str | None:
    return _load()[1]


def to_panels(t: torch.Tensor) -> torch.Tensor:
    """Row-major [N, C] (q bytes, scales or mins) -> panels [ceil(N/16), C, 16], zero past N.
    Written in place into one allocation (no padded or transposed temporaries: loading a model
    converts ~0.7 GB this way, and freed temporaries would stay in the process's heap)."""
    n, c = t.shape
    full, rest = divmod(n, PANEL)
    out = torch.zeros(full + (rest > 0), c, PANEL, dtype=t.dtype)
    out[:full].permute(0, 2, 1).copy_(t[: full * PANEL].view(full, PANEL, c))
    if rest:
        out[full, :, :rest].copy_(t[full * PANEL:].T)
    return out


def from_panels(t: torch.Tensor, n: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse of ``to_panels``: rows [n] (or just ``rows``, a LongTensor of row indices) as [r, C]."""
    if rows is None:
        return t.transpose(1, 2).reshape(-1, t.shape[1])[:n]
    return t[rows // PANEL, :, rows % PANEL]


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """Values 0..15 [..., K] -> uint8 [..., K/2], k even in the low nibble (int4/int5's layout)."""
    return (q[..., 0::2] & 15).to(torch.uint8) | ((q[..., 1::2] & 15).to(torch.uint8) << 4)


def unpack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_nibbles``: uint8 [..., K/2] -> uint8 0..15 [..., K]."""
    return torch.stack([q & 15, q >> 4], dim=-1).flatten(-2)


def unpack_bits(h: torch.Tensor) -> torch.Tensor:
    """uint8 [..., C] -> uint8 0/1 [..., 8 C] (bit i of byte b is element 8 b + i)."""
    return ((h[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten(-2)


def pack_bits(b: torch.Tensor) -> torch.Tensor:
    """The inverse of ``unpack_bits``."""
    b = b.view(*b.shape[:-1], -1, 8).to(torch.int32) << torch.arange(8, dtype=torch.int32)
    return b.sum(-1).to(torch.uint8)


def bits_to_panels(h: torch.Tensor, n: int, chunk: int = 4096) -> torch.Tensor:
    """int5's high bits row-major [N, K/8] -> panels [P, K/2, 4]: per k pair one little-endian word,
    bit j for column j at k, bit 16 + j at k + 1. In chunks of rows (an unpacked bit is a byte)."""
    out = torch.empty(-(-n // PANEL), h.shape[1] * 4, 4, dtype=torch.uint8)
    for r in range(0, n, chunk):  # chunk is a multiple of PANEL
        p = to_panels(unpack_bits(h[r: r + chunk]))  # [p, K, 16] of 0/1
        out[r // PANEL: r // PANEL + p.shape[0]] = pack_bits(p).view(p.shape[0], -1, 4)
    return out


def bits_from_panels(t: torch.Tensor, n: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse of ``bits_to_panels``, for all rows or just ``rows``."""
    rows = torch.arange(n) if rows is None else rows
    b = unpack_bits(t[rows // PANEL]).view(len(rows), -1, 2, PANEL)  # [r, K/2, (k, k + 1), column]
    return pack_bits(b[torch.arange(len(rows)), :, :, rows % PANEL].reshape(len(rows), -1))


def int6_to_panels(q: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 q [N, K] with values in [-32, 31] (Q6_K's) -> int6 panels for the VNNI kernel: the nibbles of
    u = q + 32 as int4's [P, K/2, 16], and u's high two bits [P, K/8, 32] laid out for the kernel's
    transposed bytes: for k step s (k = 8 s .. 8 s + 7), transposed byte t = 4 j + i is column j at
    k = 8 s + 2 i (even, E[t]) or 8 s + 2 i + 1 (odd, O[t]); byte u < 32 holds E[u], E[u + 32], O[u],
    O[u + 32] from bit 0, two bits each. In chunks of rows (a multiple of 16)."""
    n, k = q.shape
    if k % 8:
        raise ValueError(f"int6_to_panels: K={k} must be a multiple of 8")
    panels = -(-n // PANEL)
    nib = torch.empty(panels, k // 2, PANEL, dtype=torch.uint8)
    crumbs = torch.empty(panels, k // 8, 32, dtype=torch.uint8)
    for r in range(0, n, chunk):
        u = (q[r:r + chunk].to(torch.int16) + 32).to(torch.uint8)
        p0, c = r // PANEL, -(-u.shape[0] // PANEL)
        nib[p0:p0 + c] = to_panels(pack_nibbles(u & 15))
        h = torch.zeros(c * PANEL, k, dtype=torch.uint8)
        h[:u.shape[0]] = u >> 4
        x = h.view(c, PANEL, k // 8, 4, 2).permute(0, 2, 4, 1, 3).reshape(c, k // 8, 2, 64)  # [p, s, odd, t]
        e, o = x[:, :, 0], x[:, :, 1]
        crumbs[p0:p0 + c] = e[..., :32] | (e[..., 32:] << 2) | (o[..., :32] << 4) | (o[..., 32:] << 6)
    return nib, crumbs


def int6_from_panels(nib: torch.Tensor, crumbs: torch.Tensor, n: int,
                     rows: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse of ``int6_to_panels``: int8 q [r, K] of all n rows or just ``rows``."""
    rows = torch.arange(n) if rows is None else rows
    low = unpack_nibbles(from_panels(nib, n, rows))  # [r, K]
    b = crumbs[rows // PANEL]  # [r, K/8, 32]
    e = torch.cat([b & 3, (b >> 2) & 3], dim=-1)  # [r, K/8, 64] by transposed byte t
    o = torch.cat([(b >> 4) & 3, (b >> 6) & 3], dim=-1)
    t = (rows % PANEL)[:, None, None] * 4 + torch.arange(4)  # column j's bytes 4 j .. 4 j + 3
    t = t.expand(-1, b.shape[1], -1)
    high = torch.stack([e.gather(2, t), o.gather(2, t)], dim=-1).reshape(len(rows), -1)  # k order
    return ((low | (high << 4)).to(torch.int16) - 32).to(torch.int8)


def dequantize(q: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None, bits: int,
               h: torch.Tensor | None = None) -> torch.Tensor:
    """Row-major q [N, K] int8 or [N, K/2] uint8 (k even in the low nibble), int5's high bits h [N, K/8],
    s/m [N, K/G] -> w [N, K] fp32, rounded as the kernel rounds (the reference for every quantized
    format in d3d)."""
    if bits != 8:
        q = unpack_nibbles(q)
    if bits == 5:
        q = (q | (unpack_bits(h) << 4)).to(torch.int8) - 16
    group = q.shape[-1] // s.shape[-1]
    w = q.float() * s.float().repeat_interleave(group, dim=-1)
    if m is not None:
        w = w - m.float().repeat_interleave(group, dim=-1)
    return w


def _check(x, q, s, m, n, bits, h, two_level=False):
    if bits not in ((4, 5, 6, 8) if two_level else (4, 5, 8)):
        raise ValueError(f"quant.matmul: bits must be 8, 5 or 4 (6 with two-level scales), got {bits}")
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"quant.matmul: x must be a 2-D fp32 CPU tensor, got {tuple(x.shape)} {x.dtype} on {x.device}")
    K = x.shape[1]
    kq, dt = (K, torch.int8) if bits == 8 else (K // 2, torch.uint8)  # int4, int5, int6: nibbles
    if q.dim() != 3 or q.shape[1:] != (kq, PANEL) or q.dtype != dt:
        raise ValueError(f"quant.matmul: q must be {dt} panels [P, {kq}, {PANEL}] for x {tuple(x.shape)}, got "
                         f"{q.dtype} {tuple(q.shape)}")
    if s.dim() != 3 or s.shape[0] != q.shape[0] or s.shape[2] != PANEL or s.shape[1] == 0 or K % s.shape[1]:
        raise ValueError(f"quant.matmul: scales {tuple(s.shape)} do not fit q {tuple(q.shape)} (expected "
                         f"[{q.shape[0]}, K/G, {PANEL}] with G dividing K={K})")
    if two_level != (s.dtype == torch.int8):
        raise ValueError(f"quant.matmul: scales are int8 exactly when they are two-level (with fp16 factors sd), "
                         f"got {s.dtype}{' with sd' if two_level else ''}")
    if (m is None) != (bits != 4) or (m is not None and (m.shape != s.shape or m.dtype != s.dtype)):
        raise ValueError(f"quant.matmul: int4 needs mins shaped and typed like the scales and int8/int5 none, got "
                         f"{None if m is None else (tuple(m.shape), m.dtype)}")
    hs = {5: (q.shape[0], K // 2, 4), 6: (q.shape[0], K // 8, 32)}.get(bits)
    if (h is None) != (hs is None) or (h is not None and h.shape != hs):
        raise ValueError(f"quant.matmul: int5 needs high bits [P, K/2, 4] (bits_to_panels), int6 [P, K/8, 32] "
                         f"(int6_to_panels), the others none; got {None if h is None else tuple(h.shape)} for "
                         f"int{bits}")
    if not (q.shape[0] - 1) * PANEL < n <= q.shape[0] * PANEL:
        raise ValueError(f"quant.matmul: n={n} does not fit {q.shape[0]} panels of {PANEL}")


ISAS = {"auto": 0, "avx2": 256, "avx512": 512}


def matmul(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None, n: int, bits: int,
           isa: str = "auto", h: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] fp32 @ W^T -> [M, n], W given as panels (``to_panels``) of q, s (and m for int4, the
    high bits h for int5). ``isa``: ``auto`` (AVX-512 where the CPU has it), ``avx2`` or ``avx512``;
    all give the same bits."""
    module, why = _load()
    if module is None:
        raise RuntimeError(f"d3d.kernels.quant: unavailable: {why}")
    if isa not in ISAS:
        raise ValueError(f"quant.matmul: isa={isa!r}: expected one of {', '.join(ISAS)}")
    _check(x, q, s, m, n, bits, h)
    return module.matmul(x, q, _EMPTY if h is None else h, s, _EMPTY if m is None else m, n, x.shape[1] // s.shape[1],
                         bits, ISAS[isa])


_EMPTY = torch.empty(0)


def bound(q, h, s, m, n, group, bits, int8_activations: bool = False, sd=None, md=None):
    """``matmul`` (or ``matmul_vnni`` with ``int8_activations``, two-level scales ``sd``/``md`` too) of one
    matrix, as a function of x [M, K] contiguous fp32, without the Python checks: for
    ``d3d.cpu.quant.QuantWeight``, which made the panels (~120 calls a pass, where building the arguments
    each call had cost ~1 us). The extension still checks every shape."""
    h, m = _EMPTY if h is None else h, _EMPTY if m is None else m
    if int8_activations:
        call, args = int8_kernel().matmul, (q, h, s, m, n, group, bits, _EMPTY if sd is None else sd,
                                               _EMPTY if md is None else md)
    else:
        call, args = _load()[0].matmul, (q, h, s, m, n, group, bits, 0)
    return lambda x: call(x, *args)


__all__ = ["available", "why_unavailable", "vnni_available", "why_vnni_unavailable", "int8_available",
           "why_int8_unavailable", "maddubs_available", "why_maddubs_unavailable", "int8_kernel", "matmul", "matmul_vnni", "matmul_maddubs",
           "bound", "to_panels", "from_panels", "bits_to_panels", "bits_from_panels", "int6_to_panels",
           "int6_from_panels", "pack_nibbles", "unpack_nibbles", "unpack_bits", "pack_bits", "dequantize", "PANEL",
           "ISAS"]
