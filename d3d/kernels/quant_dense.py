"""A quantized matrix times many rows with AMX's bf16 tiles (``quant_dense.cpp``): each panel of 16 columns
dequantized once to bf16 tiles in cache, up to 96 rows at a time multiplied by it, fp32 sums.

For a prompt's prefill (``d3d.cpu.prefill``), where the int8-activation kernels (``quant.matmul_vnni``) are bound by
their multiply-adds. Not their bits (bf16 weights and activations); each row's sums depend on that row alone.

Torch reference: ``quant.dequantize(...)`` rounded to bf16, times x in bf16, summed in fp32 (``F.linear`` on
``.float()`` copies); ``dequantize`` here returns the kernel's fp32 values for the bit-exact check.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ..hardware import cpu_flags
from .cpp import AVX2, AVX2_FLAGS, build, module_of

SOURCE = Path(__file__).with_name("quant_dense.cpp")
AMX = frozenset({"amx_tile", "amx_bf16"})  # what matmul needs beyond the module's build


@functools.cache
def _load():
    """(module, None) or (None, why not). -ffp-contract=off: int4's q * s - m rounds twice, as the kernels do. It
    builds on any AVX-512 CPU: ``dequantize`` (the values the tiles take, tested bit for bit) runs there; only
    ``matmul`` needs AMX (``amx_usable``)."""
    return build("d3d_quant_dense", SOURCE, AVX2_FLAGS + ["-ffp-contract=off"],
                 needs=AVX2 | {"avx512f", "avx512bw", "avx512vl"})


def available() -> bool:
    """Whether the module builds here (``dequantize``); the tiles themselves: ``amx_usable``."""
    return _load()[0] is not None


def why_unavailable() -> str | None:
    return _load()[1]


def why_no_tiles() -> str | None:
    """Why the tiles cannot run here (None where they can): the module's reason, or the CPU's or Linux's."""
    if not available():
        return why_unavailable()
    if amx_usable():
        return None
    missing = AMX - cpu_flags()
    return f"this CPU lacks {' and '.join(sorted(missing))}" if missing else "Linux refused this process AMX's state"


def _module():
    return module_of(_load(), "d3d.kernels.quant_dense")


_EMPTY = torch.empty(0)


def _args(q, h, s, m, sd, md):
    return q, _EMPTY if h is None else h, s, _EMPTY if m is None else m, _EMPTY if sd is None else sd, \
        _EMPTY if md is None else md


def dequantize(q, h, s, m, n: int, k: int, group: int, bits: int, sd=None, md=None) -> torch.Tensor:
    """W^T [K, n] fp32 from the panels (``QuantWeight.kernel_args``; bits 6: ``int6_to_panels``' layout): the
    values the kernels compute with, which ``matmul`` rounds to bf16."""
    return _module().dequantize(*_args(q, h, s, m, sd, md), k, n, group, bits)


def amx_usable() -> bool:
    """Whether the tiles run in this process (the CPU has them and Linux lets this process use them)."""
    return available() and _module().amx_usable()


def matmul(x: torch.Tensor, q, h, s, m, n: int, group: int, bits: int, sd=None, md=None) -> torch.Tensor:
    """x [M, K] (rounded to bf16) @ W^T -> [M, n] fp32 with the tiles."""
    return bound(q, h, s, m, n, group, bits, sd, md)(x)


def bound(q, h, s, m, n: int, group: int, bits: int, sd=None, md=None):
    """``matmul`` of one matrix as a function of x (``QuantWeight.linear`` in a prefill)."""
    module, args = _module(), _args(q, h, s, m, sd, md)
    return lambda x: module.matmul(x.to(torch.bfloat16).contiguous(), *args, n, group, bits)


__all__ = ["available", "why_unavailable", "why_no_tiles", "amx_usable", "dequantize", "matmul", "bound"]
