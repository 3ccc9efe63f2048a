"""Packed attention over the KV cache on x86 CPUs, every query row computed alone (``attend_cpu.cpp``).

The decoding passes' attention on a CPU (a step, a verification, leaves and hypothesis blocks): the
same visibility rule as ``d3d.kernels.attention`` (each sequence's cached keys, then its new keys by
``group_ids`` and ``reach``), flattened per query into ``(row, nkeys, first, mask)``: keys
``j < first`` visible, keys ``first <= j < nkeys`` visible where ``mask[i, j - first]``.

Why a kernel of its own: each query's scores, softmax and weighted sum run over its visible keys only,
in key order, in fp32, so a row's output does not depend on how many rows share the pass or which keys
the mask hides. A T-token verification (or a leaf) computes exactly what a one-token step over the same
keys does, in bf16 as in fp32: the lossless property without attending one row at a time. Measured:
docs/results/attention-cpu/ (validation before/after, passes.json).

Torch reference: ``attention.packed_attention_torch`` (SDPA, equal up to rounding). Loop oracle:
``naive.packed_attention_reference`` (float64).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from .cpp import AVX2_FLAGS, build

SOURCE = Path(__file__).with_name("attend_cpu.cpp")
MAX_QUERIES = 64  # longer runs (prefill) go to SDPA: its blocked kernel is faster there, and no step repeats them


@functools.cache
def _load():
    """(module, None) or (None, why not). -ffp-contract=off: the same roundings under every compiler."""
    return build("d3d_attend_cpu", SOURCE, AVX2_FLAGS + ["-ffp-contract=off"])


def available() -> bool:
    return _load()[0] is not None


def why_unavailable() -> str | None:
    return _load()[1]


MAX_HEAD_DIM, MAX_GROUP = 256, 16  # attend_cpu.cpp's limits (its head dim also a multiple of 8)


def fits(head_dim: int, heads: int, kv_heads: int) -> bool:
    """Whether a model's attention shape is one the kernel computes (others stay on SDPA)."""
    return head_dim % 8 == 0 and head_dim <= MAX_HEAD_DIM and heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP


def row_invariant(device: torch.device, cfg=None) -> bool:
    """Whether decoding passes on ``device`` (of a model with the ``ModelConfig`` ``cfg``) attend
    through this kernel: every row as a one-token step."""
    shape_fits = cfg is None or fits(cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads)
    return torch.device(device).type == "cpu" and available() and shape_fits


@dataclass
class CpuPlan:
    """Per query of a pass: its cache row, how many key positions it scans, how many of those come
    before its mask, and the mask over the rest ([T, W] bool)."""

    rows: torch.Tensor
    nkeys: torch.Tensor
    first: torch.Tensor
    mask: torch.Tensor


def cpu_plan(cu: list[int], cached: list[int], rows, group_ids: torch.Tensor,
             reach: torch.Tensor | None = None) -> CpuPlan:
    """The plan of a packed pass (``cu`` offsets, ``cached`` keys per sequence, cache ``rows``), the
    new keys of sequence n at ``cached[n] ..`` in its row: query i of it sees new key j iff
    ``g[j] <= g[i]``, or with ``reach`` iff ``g[j] == g[i] or g[j] < reach[i]``."""
    T = cu[-1]
    W = max((e - s for s, e in zip(cu[:-1], cu[1:])), default=0)
    mask = torch.zeros(T, max(W, 1), dtype=torch.bool)
    row_of, nkeys, first = torch.empty(T, dtype=torch.int64), torch.empty(T, dtype=torch.int64), \
        torch.empty(T, dtype=torch.int64)
    g = group_ids.cpu()
    r = None if reach is None else reach.cpu()
    for n, (s, e, c) in enumerate(zip(cu[:-1], cu[1:], cached)):
        L = e - s
        if L == 0:
            continue
        gs = g[s:e]
        if L > 1 and bool((gs[1:] < gs[:-1]).any()):
            raise ValueError("packed_attention: group_ids must be non-decreasing inside each sequence")
        vis = gs[None, :] <= gs[:, None] if r is None else \
            (gs[None, :] == gs[:, None]) | (gs[None, :] < r[s:e, None])
        mask[s:e, :L] = vis
        row_of[s:e], nkeys[s:e], first[s:e] = rows[n], c + L, c
    return CpuPlan(row_of, nkeys, first, mask)


ISAS = {"auto": 0, "avx2": 1, "avx512": 2}  # the kernel's code paths; all give the same bits


def attend_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: CpuPlan,
               scale: float, isa: str = "auto", block_bytes: int = 0) -> torch.Tensor:
    """out [T, H, D] in q's dtype: q [T, H, D] over the cache rows [R, Hkv, Lmax, D] as ``plan`` says.
    ``isa``: ``auto`` (AVX-512 where the CPU has it), ``avx2`` or ``avx512``; ``block_bytes``: the keys taken at
    a time, in bytes of K (0: the kernel's 64 KB); the same bits for every choice."""
    module, why = _load()
    if module is None:
        raise RuntimeError(f"d3d.kernels.attention_cpu: unavailable: {why}")
    if isa not in ISAS:
        raise ValueError(f"attend_cpu: isa={isa!r}: expected one of {', '.join(ISAS)}")
    return module.attend(q.contiguous(), k_cache, v_cache, plan.rows, plan.nkeys, plan.first, plan.mask, scale,
                         ISAS[isa], block_bytes)


__all__ = ["available", "why_unavailable", "row_invariant", "fits", "CpuPlan", "cpu_plan", "attend_cpu", "MAX_QUERIES",
           "ISAS"]
