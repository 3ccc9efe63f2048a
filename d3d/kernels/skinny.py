"""Row-invariant fp32 matmul for few-row passes on AVX2 CPUs (``skinny_gemm.cpp``), its launcher and wrapper.

    y[m, n] = sum_k x[m, k] W[n, k],  accumulated as one fma chain over k = 0 .. K-1 per (m, n)

x [M, K] fp32, W [N, K] fp32 stored as panels [ceil(N/16), K, 16]; y [M, N] fp32. Every row of an
M-row product equals the 1-row product of that row bit for bit, for every M.

Why a C++ kernel beside the Triton ones: Triton has no CPU backend outside the interpreter, and
oneDNN's fp32 kernels use the memory bus poorly at 2-8 rows, the verification passes of speculative
decoding (GB/s of weights streamed, panels vs oneDNN: docs/results.md, "Measurements behind the code"). The extension is compiled on first use with
the system C++ compiler (``d3d.kernels.cpp``); where that fails, ``available()`` says why and d3d keeps oneDNN.

Torch reference: ``F.linear`` (same value up to rounding). Loop oracle: ``naive.skinny_matmul_reference``.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import torch

from .. import env
from ..hardware import cpu_flags
from .cpp import AVX2_FLAGS, build

SOURCE = Path(__file__).with_name("skinny_gemm.cpp")
PANEL = 16  # columns per panel (skinny_gemm.cpp: NR)


@functools.cache
def _load():
    """(module, None) or (None, why not)."""
    return build("d3d_skinny_gemm", SOURCE, AVX2_FLAGS)


def available() -> bool:
    """Whether the kernel is built (building it on first call); ``why_unavailable()`` says why not."""
    return _load()[0] is not None


def why_unavailable() -> str | None:
    return _load()[1]


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] fp32 CPU -> panels [ceil(N/16), K, 16], zero past N."""
    module, why = _load()
    if module is None:
        raise RuntimeError(f"d3d.kernels.skinny: unavailable: {why}")
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise ValueError(f"skinny.pack: weight must be a 2-D fp32 CPU tensor, got {tuple(weight.shape)} "
                         f"{weight.dtype} on {weight.device}")
    return module.pack(weight.detach())


def matmul(x: torch.Tensor, panels: torch.Tensor, n: int) -> torch.Tensor:
    """x [M, K] fp32 @ W^T -> [M, n], W given as ``pack(W)`` and ``n`` its rows."""
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"skinny.matmul: x must be a 2-D fp32 CPU tensor, got {tuple(x.shape)} {x.dtype} "
                         f"on {x.device}")
    if panels.dim() != 3 or panels.shape[2] != PANEL or x.shape[1] != panels.shape[1]:
        raise ValueError(f"skinny.matmul: x {tuple(x.shape)} does not fit panels {tuple(panels.shape)} "
                         f"(expected [P, {x.shape[1]}, {PANEL}])")
    if not (panels.shape[0] - 1) * PANEL < n <= panels.shape[0] * PANEL:
        raise ValueError(f"skinny.matmul: n={n} does not fit {panels.shape[0]} panels of {PANEL}")
    return _load()[0].matmul(x, panels, n)


def matmul_packed(x: torch.Tensor, panels: torch.Tensor, n: int) -> torch.Tensor:
    """``matmul`` without the Python checks, for a caller that made ``panels`` with ``pack`` and
    checked x (``d3d.cpu.linear``: ~170 calls a pass); the extension still checks every shape."""
    return _load()[0].matmul(x, panels, n)


def wanted() -> bool:
    """Whether fp32 CPU matmuls should use this kernel: ``D3D_CPU_MATMUL`` = ``panels`` (yes),
    ``onednn`` (no) or unset/``auto``: yes on AVX2 CPUs without AVX-512, where it was measured
    faster; oneDNN elsewhere (its AVX-512 fp32 kernels are unmeasured against this one)."""
    return _wanted(env.read("D3D_CPU_MATMUL"))


@functools.cache
def _wanted(choice: str) -> bool:  # cached: the warning below is said once
    if choice == "onednn":
        return False
    if choice == "auto" and "avx512f" in cpu_flags():
        return False
    if not available():
        warnings.warn(f"d3d: the fp32 panel matmul is unavailable ({why_unavailable()}); using oneDNN", stacklevel=3)
        return False
    return True


__all__ = ["available", "why_unavailable", "pack", "matmul", "matmul_packed", "wanted", "PANEL"]
