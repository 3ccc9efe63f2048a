"""Weight-only int8/int4 matmul for few-row passes on AVX2 CPUs (``quant_gemm.cpp``), its launcher and wrapper.

    w[n, k] = fl(q[n, k] * s[n, k // G])                  int8, q in [-128, 127]
    w[n, k] = fl(fl(q[n, k] * s[n, k // G]) - m[n, k // G])  int4, q in [0, 15]
    y[m, n] = sum_k x[m, k] w[n, k], one fma chain over k = 0 .. K-1 per (m, n)

x [M, K] fp32; q, s, m in the 16-column panels of ``d3d.kernels.skinny`` (``pack``); y [M, N] fp32.
The kernel dequantizes in registers and then computes exactly what the fp32 panel kernel computes
on the dequantized matrix: every row of an M-row product equals the 1-row product of that row bit
for bit, for every M, and equals ``naive.skinny_matmul_reference(x, dequantize(...))``.

Torch reference: ``dequantize`` + ``F.linear``. Loop oracle: ``naive.quant_matmul_reference``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from .cpp import AVX2_FLAGS, build

SOURCE = Path(__file__).with_name("quant_gemm.cpp")
PANEL = 16


@functools.cache
def _load():
    """(module, None) or (None, why not). -ffp-contract=off: int4's q * s - m must round twice, as in torch."""
    return build("d3d_quant_gemm", SOURCE, AVX2_FLAGS + ["-ffp-contract=off"])


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


def dequantize(q: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None, bits: int) -> torch.Tensor:
    """Row-major q [N, K] int8 or [N, K/2] uint8 (k even in the low nibble), s/m [N, K/G] -> w [N, K] fp32,
    rounded as the kernel rounds (the reference for every quantized format in d3d)."""
    if bits == 4:
        q = torch.stack([q & 15, q >> 4], dim=-1).flatten(-2)
    group = q.shape[-1] // s.shape[-1]
    w = q.float() * s.repeat_interleave(group, dim=-1)
    if m is not None:
        w = w - m.repeat_interleave(group, dim=-1)
    return w


def _check(x, q, s, m, n, bits):
    if bits not in (4, 8):
        raise ValueError(f"quant.matmul: bits must be 8 or 4, got {bits}")
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"quant.matmul: x must be a 2-D fp32 CPU tensor, got {tuple(x.shape)} {x.dtype} on {x.device}")
    K = x.shape[1]
    kq, dt = (K, torch.int8) if bits == 8 else (K // 2, torch.uint8)
    if q.dim() != 3 or q.shape[1:] != (kq, PANEL) or q.dtype != dt:
        raise ValueError(f"quant.matmul: q must be {dt} panels [P, {kq}, {PANEL}] for x {tuple(x.shape)}, got "
                         f"{q.dtype} {tuple(q.shape)}")
    if s.dim() != 3 or s.shape[0] != q.shape[0] or s.shape[2] != PANEL or s.shape[1] == 0 or K % s.shape[1]:
        raise ValueError(f"quant.matmul: scales {tuple(s.shape)} do not fit q {tuple(q.shape)} (expected "
                         f"[{q.shape[0]}, K/G, {PANEL}] with G dividing K={K})")
    if (m is None) != (bits == 8) or (m is not None and m.shape != s.shape):
        raise ValueError(f"quant.matmul: int4 needs mins shaped like the scales and int8 none, got "
                         f"{None if m is None else tuple(m.shape)}")
    if not (q.shape[0] - 1) * PANEL < n <= q.shape[0] * PANEL:
        raise ValueError(f"quant.matmul: n={n} does not fit {q.shape[0]} panels of {PANEL}")


ISAS = {"auto": 0, "avx2": 256, "avx512": 512}


def matmul(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None, n: int, bits: int,
           isa: str = "auto") -> torch.Tensor:
    """x [M, K] fp32 @ W^T -> [M, n], W given as panels (``to_panels``) of q, s (and m for int4).
    ``isa``: ``auto`` (AVX-512 where the CPU has it), ``avx2`` or ``avx512``; all give the same bits."""
    module, why = _load()
    if module is None:
        raise RuntimeError(f"d3d.kernels.quant: unavailable: {why}")
    if isa not in ISAS:
        raise ValueError(f"quant.matmul: isa={isa!r}: expected one of {', '.join(ISAS)}")
    _check(x, q, s, m, n, bits)
    group = x.shape[1] // s.shape[1]
    return module.matmul(x, q, s, s if m is None else m, n, group, bits, ISAS[isa])


def matmul_packed(x, q, s, m, n, bits):
    """``matmul`` without the Python checks, for ``d3d.quant.QuantWeight`` (which made the panels);
    the extension still checks every shape."""
    return _load()[0].matmul(x, q, s, s if m is None else m, n, x.shape[1] // s.shape[1], bits, 0)


__all__ = ["available", "why_unavailable", "to_panels", "from_panels", "dequantize", "matmul", "matmul_packed", "PANEL",
           "ISAS"]
