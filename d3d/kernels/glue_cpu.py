"""The small ops between the matmuls of a CPU decoding pass, fused (``glue_cpu.cpp``): ``rms_norm``.

Each is one call where torch runs a chain of small ops; every row is computed as alone. Torch
reference: ``d3d.model.transformer.rms_norm``'s fallback (torch's layer_norm); loop oracle:
``naive.rms_norm_reference``. Measured: docs/results/vnni-streams/README.md.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from .cpp import AVX2_FLAGS, build

SOURCE = Path(__file__).with_name("glue_cpu.cpp")
_EMPTY = torch.empty(0)


@functools.cache
def _load():
    """(module, None) or (None, why not). -ffp-contract=off: the same roundings under every compiler."""
    return build("d3d_glue_cpu", SOURCE, AVX2_FLAGS + ["-ffp-contract=off"])


def available() -> bool:
    return _load()[0] is not None


def why_unavailable() -> str | None:
    return _load()[1]


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim (fp32 or bf16 x on a CPU; weight of x's dtype
    or fp32, or None), computed in fp32 per row and rounded once to x's dtype."""
    module, why = _load()
    if module is None:
        raise RuntimeError(f"d3d.kernels.glue_cpu: unavailable: {why}")
    return module.rms_norm(x, _EMPTY if weight is None else weight, eps)


__all__ = ["available", "why_unavailable", "rms_norm"]
