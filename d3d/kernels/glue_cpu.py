"""The small ops between the matmuls of a CPU decoding pass, fused (``glue_cpu.cpp``): ``rms_norm``,
``rope_write`` (RoPE on q and k, and k and v into the KV cache), ``argmax`` (greedy tokens) and ``head_candidates``
(which panels of an LM head can hold a row's maximum: ``d3d.cpu.greedy_head``; its reference is the full head, whose
argmax and logits the greedy head's are tested against in ``tests/test_greedy_head.py``).

Each is one call where torch runs a chain of small ops; every row is computed as alone. Torch
references: ``d3d.model.transformer.rms_norm``'s fallback (torch's layer_norm), ``Attention``'s torch
path (``apply_rope``, ``PassLayout.write``: the same bits) and ``torch.argmax``; loop oracles:
``naive.rms_norm_reference``, ``naive.rope_write_reference``, ``naive.argmax_reference``. Measured:
docs/results/vnni-streams/README.md, docs/results/argmax/.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from .cpp import AVX2_FLAGS, build, module_of

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


def _module():
    return module_of(_load(), "d3d.kernels.glue_cpu")


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim (fp32 or bf16 x on a CPU; weight of x's dtype
    or fp32, or None), computed in fp32 per row and rounded once to x's dtype."""
    return _module().rms_norm(x, _EMPTY if weight is None else weight, eps)


def rope_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               rows: torch.Tensor, slots: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """q [T, heads, D] (fp32) from a pass's projections ``qkv`` [T, (heads + 2 kv_heads) D] (fp32 or bf16),
    rotated by ``cos``/``sin`` [T, D] (fp32, ``d3d.model.transformer.rope_tables``' rows at the tokens'
    positions); k rotated and v written into ``k_cache``/``v_cache`` [R, kv_heads, Lmax, D] (fp32) at
    each token's ``rows[t]``, ``slots[t]``."""
    return _module().rope_write(qkv, cos, sin, k_cache, v_cache, rows, slots, heads, kv_heads)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)``: each row's first maximum (a NaN counts as the maximum), in one call for fp32 x on a
    CPU (torch's CPU argmax took ~12x its amax over a row of logits), torch's elsewhere."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() >= 1 and x.shape[-1] > 0 and available():
        return _module().argmax(x)
    return x.argmax(-1)


def head_candidates(approx: torch.Tensor, col_max: torch.Tensor, scale: torch.Tensor, neg: torch.Tensor,
                    pos: torch.Tensor, margin: torch.Tensor) -> torch.Tensor | None:
    """The greedy head's panels that can hold a row's maximum (``d3d.cpu.greedy_head``; ``glue_cpu.cpp``), ascending;
    None where some approximate logit is NaN. ``approx`` [T, N] is set to -inf."""
    return _module().head_candidates(approx, col_max, scale, neg, pos, margin)


__all__ = ["available", "why_unavailable", "rms_norm", "rope_write", "argmax", "head_candidates"]
