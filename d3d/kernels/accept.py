"""Batched acceptance for speculative decoding (docs/design.md §2, §6).

For ``N`` sequences, a verification round gives the draft ``d_1 .. d_{B-1}`` (``draft[:, j]`` is
``d_{j+1}``) and the target's logits at the ``B`` positions ``[anchor, d_1, .., d_{B-1}]``:
``logits[:, j]`` is the target's distribution for the token after ``d_j`` (``d_0`` = the anchor),
so draft ``d_{j+1}`` is judged by row ``j`` and row ``B-1`` gives the free token after a fully
accepted draft. With ``p_j = softmax(logits[:, j] / T)``:

- ``T == 0``: ``y_j = argmax logits[:, j]`` (the lowest index wins a tie). The accept length ``a``
  is the number of leading ``j`` with ``d_{j+1} == y_j``; the bonus is ``y_a``.
- ``T > 0``, one-hot drafts (no ``draft_probs``): ``y_j`` is a sample from ``p_j`` (Gumbel-max,
  ``argmax(logits / T + G)``) and the rule is the same as at ``T == 0``: accept while
  ``y_j == d_{j+1}``, bonus ``y_a``. This *is* "accept ``d`` with probability ``p(d)``, otherwise
  sample the bonus from ``p`` with ``d`` removed and renormalised": ``P(y = d) = p(d)``, and given
  ``y != d``, ``y`` is distributed as ``p`` restricted to the other tokens. It needs one argmax pass
  per row and no softmax statistics, and it reduces to the greedy rule as ``T -> 0``.
- ``T > 0`` with drafter probabilities ``q_j = draft_probs[:, j]`` (the distribution ``d_{j+1}``
  was sampled from): standard speculative sampling. Accept ``d`` when ``u * q(d) < p(d)``
  (``u`` uniform in (0, 1); that is ``u < min(1, p(d) / q(d))``, without a division, and a draft
  with ``q(d) = 0`` is accepted iff ``p(d) > 0``). On the first rejection the bonus is sampled from
  the residual ``r ∝ max(p - q, 0)`` by Gumbel-max over ``log r`` (two passes over the vocabulary:
  softmax statistics, then the residual); if rounding leaves ``r == 0`` everywhere (only possible
  when ``p ≈ q``) the bonus is sampled from ``p`` with the same noise. After ``B-1`` acceptances
  the bonus is sampled from ``p_{B-1}``.
  At ``T == 0`` ``draft_probs`` is ignored: the target is greedy, the rule above is then exactly
  the greedy rule.

Each emitted token is distributed exactly as the target's sampling distribution at ``T`` (the
"lossless" property; tests check it with chi-square against a biased control).

Committed tokens are ``d_1 .. d_a, bonus`` (``a + 1`` tokens; the rest of the ``[N, B]`` row is
``-1``). With ``stop_ids``, ``num_tokens`` counts up to and including the first stop token among
them and ``stop_hit`` says whether there was one, so an engine ends the output exactly there.
``accept_len`` is always the raw accept length (what the caches must keep).

Randomness: the counter-based RNG of ``denoise.py`` with its own streams, keyed by
``(seed, n, row j, vocab index)``; kernel and torch path draw identical noise. They agree exactly
at ``T == 0`` and, at ``T > 0``, everywhere except where two noisy scores (or ``u * q(d)`` and
``p(d)``) are within float rounding of each other (``log``/``exp`` may differ by an ulp between
libraries, and vocabulary sums are taken in different orders).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from . import glue_cpu, tl, triton, use_triton
from .denoise import (
    STREAM_ACCEPT_RESIDUAL,
    STREAM_ACCEPT_SAMPLE,
    STREAM_ACCEPT_UNIFORM,
    _block_v,
    f32,
    fmix32_tl,
    gumbel_argmax_torch,
    gumbel_tl,
    gumbel_torch,
    row_key_tl,
    row_keys_torch,
    row_scan_tl,
    stream_key,
    uniform_torch,
    unit_tl,
)

__all__ = ["AcceptResult", "accept", "accept_torch"]


class AcceptResult(NamedTuple):
    """Outcome of one verification round for ``N`` sequences (all on the logits' device).

    accept_len: ``[N]`` int64, ``a`` in ``0 .. B-1``.
    bonus:      ``[N]`` int64, the target's token after the accepted prefix.
    tokens:     ``[N, B]`` int64, ``d_1 .. d_a, bonus`` then ``-1`` padding.
    num_tokens: ``[N]`` int64, tokens to emit: ``a + 1``, or up to and including the first stop.
    stop_hit:   ``[N]`` bool, a stop token is among the emitted tokens.
    """

    accept_len: torch.Tensor
    bonus: torch.Tensor
    tokens: torch.Tensor
    num_tokens: torch.Tensor
    stop_hit: torch.Tensor


# ------------------------------------------------------------------------------------------------
# Triton kernel
# ------------------------------------------------------------------------------------------------


@triton.jit
def _residual_scan_tl(row_ptr, q_ptr, V, inv_t, m, s, row, BLOCK_V: tl.constexpr):
    """Sample from ``r ∝ max(p - q, 0)``, ``p = exp(z - m) / s``: Gumbel-max over ``log r``;
    the fallback sample from ``p`` (same noise) is returned when ``r`` is zero everywhere."""
    offs = tl.arange(0, BLOCK_V)
    best_r = tl.full([], float("-inf"), tl.float32)
    pick_r = tl.full([], 0, tl.int32)
    best_p = tl.full([], float("-inf"), tl.float32)
    pick_p = tl.full([], 0, tl.int32)
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + offs
        ok = idx < V
        z = tl.load(row_ptr + idx, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
        q = tl.load(q_ptr + idx, mask=ok, other=0.0).to(tl.float32)
        g = gumbel_tl(row, idx)
        r = tl.maximum(tl.exp(z - m) / s - q, 0.0)
        score_r = tl.where(r > 0.0, tl.log(tl.where(r > 0.0, r, 1.0)) + g, float("-inf"))
        score_p = tl.where(ok, z + g, float("-inf"))
        c_r, arg_r = tl.max(score_r, axis=0, return_indices=True,
                            return_indices_tie_break_left=True)
        c_p, arg_p = tl.max(score_p, axis=0, return_indices=True,
                            return_indices_tie_break_left=True)
        pick_r = tl.where(c_r > best_r, v0 + arg_r, pick_r)
        pick_p = tl.where(c_p > best_p, v0 + arg_p, pick_p)
        best_r = tl.maximum(best_r, c_r)
        best_p = tl.maximum(best_p, c_p)
    return tl.where(best_r > float("-inf"), pick_r, pick_p)


@triton.jit(do_not_specialize=["key_sample", "key_uniform", "key_residual"])
def _accept_kernel(
    logits_ptr, draft_ptr, q_ptr, stop_ptr,
    acc_ptr, bonus_ptr, out_ptr, num_ptr, hit_ptr,
    B, V, S,
    stride_ln, stride_lb, stride_dn, stride_db, stride_qn, stride_qb,
    inv_t, key_sample, key_uniform, key_residual,
    NOISE: tl.constexpr, HAS_Q: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    offs_b = tl.arange(0, BLOCK_B)
    out_row = out_ptr + n * B
    tl.store(out_row + offs_b, tl.full([BLOCK_B], -1, tl.int64), mask=offs_b < B)
    # Scalars carried over the rows (no vector reductions: they are cheap on a GPU, but each is
    # a costly nested call in the interpreter).
    a = tl.full([], 0, tl.int32)  # accept length so far
    active = tl.full([], 1, tl.int32)  # all rows so far accepted
    y = tl.full([], -1, tl.int64)  # the token committed at the last row visited = the bonus
    first = tl.full([], B, tl.int32)  # position of the first stop token among the committed
    for j in range(0, B):
        if active != 0:
            # d_{j+1}; -1 at j = B-1, so that the last row never "matches" and yields the bonus.
            d = tl.load(draft_ptr + n * stride_dn + j * stride_db, mask=j < B - 1, other=-1)
            row_ptr = logits_ptr + n * stride_ln + j * stride_lb
            if HAS_Q:
                if j < B - 1:
                    # Speculative sampling: the min(1, p/q) test, then the residual if rejected.
                    valid = (d >= 0) & (d < V)
                    d_safe = tl.minimum(tl.maximum(d, 0), V - 1)  # never read out of bounds
                    _, _, m, s = row_scan_tl(row_ptr, V, inv_t, 0, False, True, BLOCK_V)
                    p_d = tl.exp(tl.load(row_ptr + d_safe).to(tl.float32) * inv_t - m) / s
                    q_row = q_ptr + n * stride_qn + j * stride_qb
                    q_d = tl.load(q_row + d_safe).to(tl.float32)
                    u = unit_tl(fmix32_tl(row_key_tl(key_uniform, n, j)))
                    acc = valid & (u * q_d < p_d)
                    y = d
                    if acc == 0:
                        y = _residual_scan_tl(row_ptr, q_row, V, inv_t, m, s,
                                              row_key_tl(key_residual, n, j), BLOCK_V).to(tl.int64)
                else:
                    # All B-1 drafts accepted: the free token is a plain sample from p_{B-1}.
                    acc = d != d
                    y_s, _, _, _ = row_scan_tl(row_ptr, V, inv_t, row_key_tl(key_sample, n, j),
                                               True, False, BLOCK_V)
                    y = y_s.to(tl.int64)
            else:
                # Greedy (T == 0) or one-hot drafts: accept while the target's pick equals d.
                y_s, _, _, _ = row_scan_tl(row_ptr, V, inv_t, row_key_tl(key_sample, n, j),
                                           NOISE, False, BLOCK_V)
                y = y_s.to(tl.int64)
                acc = y == d
            # The committed token at row j is y: d itself when accepted, else the bonus.
            tl.store(out_row + j, y)
            for i in range(0, S):
                first = tl.where((y == tl.load(stop_ptr + i)) & (first == B), j, first)
            a += acc.to(tl.int32)
            active = acc.to(tl.int32)

    hit = first < B
    tl.store(acc_ptr + n, a.to(tl.int64))
    tl.store(bonus_ptr + n, y)
    tl.store(num_ptr + n, tl.where(hit, first + 1, a + 1).to(tl.int64))
    tl.store(hit_ptr + n, hit.to(tl.uint8))


def _accept_triton(draft, logits, q, stop, *, inv_t, keys, block_v=None) -> AcceptResult:
    N, B, V = logits.shape
    dev = logits.device
    if logits.stride(-1) != 1:  # the kernel walks the vocabulary with unit stride
        logits = logits.contiguous()
    if q is not None and q.stride(-1) != 1:
        q = q.contiguous()
    acc = torch.empty(N, dtype=torch.int64, device=dev)
    bonus = torch.empty(N, dtype=torch.int64, device=dev)
    tokens = torch.empty((N, B), dtype=torch.int64, device=dev)
    num = torch.empty(N, dtype=torch.int64, device=dev)
    hit = torch.empty(N, dtype=torch.bool, device=dev)
    if N == 0:
        return AcceptResult(acc, bonus, tokens, num, hit)
    # Unused pointers still need a tensor; strides of an absent draft/q are never used.
    d_arg = draft if B > 1 else tokens
    q_arg = q if q is not None else logits
    q_strides = q.stride()[:2] if q is not None else (0, 0)
    stop_arg = stop if stop is not None else tokens
    block_v = block_v or _block_v(V, logits.is_cuda)
    _accept_kernel[(N,)](
        logits, d_arg, q_arg, stop_arg,
        acc, bonus, tokens, num, hit.view(torch.uint8),
        B, V, 0 if stop is None else stop.numel(),
        logits.stride(0), logits.stride(1), d_arg.stride(0), d_arg.stride(1), *q_strides,
        inv_t or 1.0, *keys,
        NOISE=inv_t is not None, HAS_Q=q is not None,
        BLOCK_B=triton.next_power_of_2(B), BLOCK_V=block_v,
        num_warps=8 if block_v >= 4096 else 4,
    )
    return AcceptResult(acc, bonus, tokens, num, hit)


# ------------------------------------------------------------------------------------------------
# Torch path (vectorised over sequences and positions; the production path on CPU)
# ------------------------------------------------------------------------------------------------


def _sample_rows_torch(z: torch.Tensor, key: int, n: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """Gumbel-max samples from ``softmax(z)`` for rows ``z[..., V]`` at stream rows (n, j)."""
    return gumbel_argmax_torch(z, row_keys_torch(key, n, j))


def _softmax_stats_torch(z: torch.Tensor):
    """``m = max z`` and ``s = sum exp(z - m)`` over the last dim, with the kernel's -inf guard."""
    m = z.amax(-1)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    return m, torch.exp(z - m.unsqueeze(-1)).sum(-1)


def _finish_torch(draft: torch.Tensor, y: torch.Tensor, a: torch.Tensor, stop) -> AcceptResult:
    """Committed tokens and stop handling from drafts, per-row picks ``y [N, B]`` and ``a [N]``.

    ``y[:, a]`` is the bonus (only that entry of ``y`` is used beyond the accepted prefix)."""
    N, B = y.shape
    pos = torch.arange(B, device=y.device)
    bonus = y.gather(1, a.unsqueeze(1)).squeeze(1)
    d_pad = torch.cat([draft, draft.new_full((N, 1), -1)], 1)
    tokens = torch.where(pos < a.unsqueeze(1), d_pad, torch.full_like(d_pad, -1))
    tokens = torch.where(pos == a.unsqueeze(1), bonus.unsqueeze(1), tokens)
    count = a + 1
    if stop is None or stop.numel() == 0:
        return AcceptResult(a, bonus, tokens, count, torch.zeros(N, dtype=torch.bool, device=y.device))
    is_stop = torch.isin(tokens, stop) & (pos < count.unsqueeze(1))
    hit = is_stop.any(1)
    first = torch.where(is_stop, pos, B).amin(1)
    return AcceptResult(a, bonus, tokens, torch.where(hit, first + 1, count), hit)


def _accept_torch(draft, logits, q, stop, *, inv_t, keys) -> AcceptResult:
    N, B, V = logits.shape
    dev = logits.device
    key_sample, key_uniform, key_residual = keys
    n = torch.arange(N, device=dev)
    x = logits.float()

    if q is None:
        if inv_t is None:
            y = glue_cpu.argmax(x)  # first maximum: the lowest index wins a tie (torch.argmax's, one call on a CPU)
        else:
            y = _sample_rows_torch(x * inv_t, key_sample, n[:, None], torch.arange(B, device=dev))
        # a = number of leading matches (cumprod stops at the first mismatch).
        a = (draft == y[:, : B - 1]).long().cumprod(1).sum(1)
        return _finish_torch(draft, y, a, stop)

    # Speculative sampling with drafter probabilities (T > 0 only; see the module docstring).
    z = x * inv_t
    m, s = _softmax_stats_torch(z[:, : B - 1])  # [N, B-1]
    valid = (draft >= 0) & (draft < V)
    d_safe = draft.clamp(0, V - 1).unsqueeze(-1)
    p_d = torch.exp(z[:, : B - 1].gather(-1, d_safe).squeeze(-1) - m) / s
    q_d = q.gather(-1, d_safe).squeeze(-1).float()
    u = uniform_torch(row_keys_torch(key_uniform, n[:, None], torch.arange(B - 1, device=dev)))
    a = (valid & (u * q_d < p_d)).long().cumprod(1).sum(1)

    # Only row a of each sequence matters from here on: gather it, then sample once per sequence.
    z_a = z.gather(1, a.view(N, 1, 1).expand(N, 1, V)).squeeze(1)  # [N, V]
    full = _sample_rows_torch(z_a, key_sample, n, a)  # used when a == B-1
    if B > 1:
        a_q = a.clamp(max=B - 2)  # rows with a == B-1 have no q row; their result is discarded
        q_a = q.gather(1, a_q.view(N, 1, 1).expand(N, 1, V)).squeeze(1).float()
        m_a = m.gather(1, a_q.unsqueeze(1))
        s_a = s.gather(1, a_q.unsqueeze(1))
        g = gumbel_torch(row_keys_torch(key_residual, n, a), V)
        r = (torch.exp(z_a - m_a) / s_a - q_a).clamp(min=0.0)
        score_r = torch.where(r > 0, torch.log(r) + g, torch.full_like(r, float("-inf")))
        pick_r = score_r.argmax(-1)  # the first maximum: the lowest index wins a tie
        residual = torch.where(score_r.amax(-1) > float("-inf"), pick_r, g.add_(z_a).argmax(-1))
        bonus = torch.where(a < B - 1, residual, full)
    else:
        bonus = full
    y = bonus.unsqueeze(1).expand(N, B)  # _finish_torch reads y only at column a
    return _finish_torch(draft, y.contiguous(), a, stop)


# ------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _prepare(draft, logits, temperature, seed, draft_probs, stop_ids):
    """Validate the arguments; returns (draft, q, stop, kernel scalars)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise ValueError(f"logits: expected a [N, B, V] tensor, got "
                         f"{getattr(logits, 'shape', type(logits).__name__)}")
    if logits.dtype not in _FLOATS:
        raise ValueError(f"logits: expected float16, bfloat16 or float32, got {logits.dtype}")
    N, B, V = logits.shape
    if B < 1 or V < 1:
        raise ValueError(f"logits: block size and vocabulary must be >= 1, got shape {tuple(logits.shape)}")
    dev = logits.device
    if not isinstance(draft, torch.Tensor) or tuple(draft.shape) != (N, B - 1):
        raise ValueError(f"draft: expected shape ({N}, {B - 1}) (logits has N={N}, B={B}), got "
                         f"{tuple(getattr(draft, 'shape', ()))}")
    if draft.dtype != torch.int64:
        raise ValueError(f"draft: expected dtype torch.int64, got {draft.dtype}")
    if draft.device != dev:
        raise ValueError(f"draft: on {draft.device}, logits on {dev}")
    temperature = float(temperature)
    if not temperature >= 0.0 or temperature == float("inf"):
        raise ValueError(f"temperature: expected a finite value >= 0, got {temperature}")
    q = None
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor) or tuple(draft_probs.shape) != (N, B - 1, V):
            raise ValueError(f"draft_probs: expected shape ({N}, {B - 1}, {V}), got "
                             f"{tuple(getattr(draft_probs, 'shape', ()))}")
        if draft_probs.dtype not in _FLOATS:
            raise ValueError(f"draft_probs: expected a float dtype, got {draft_probs.dtype}")
        if draft_probs.device != dev:
            raise ValueError(f"draft_probs: on {draft_probs.device}, logits on {dev}")
        if temperature > 0:  # at T == 0 the greedy rule is exact and q is not needed
            q = draft_probs
    stop = None
    if stop_ids is not None:
        if not isinstance(stop_ids, torch.Tensor):
            stop_ids = torch.tensor(list(stop_ids), dtype=torch.int64, device=dev)
        if stop_ids.dim() != 1 or stop_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"stop_ids: expected a 1-D integer tensor, got "
                             f"{tuple(stop_ids.shape)} {stop_ids.dtype}")
        if stop_ids.device != dev:
            raise ValueError(f"stop_ids: on {stop_ids.device}, logits on {dev}")
        stop = stop_ids.to(torch.int64).contiguous() if stop_ids.numel() else None
    scalars = dict(
        inv_t=f32(1.0 / temperature) if temperature > 0 else None,
        keys=(stream_key(seed, STREAM_ACCEPT_SAMPLE), stream_key(seed, STREAM_ACCEPT_UNIFORM),
              stream_key(seed, STREAM_ACCEPT_RESIDUAL)),
    )
    return draft, q, stop, scalars


def accept(
    draft: torch.Tensor,
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    draft_probs: torch.Tensor | None = None,
    stop_ids: torch.Tensor | Sequence[int] | None = None,
    torch_path: bool = False,
) -> AcceptResult:
    """Verify ``N`` drafts against the target in one launch (see the module docstring).

    Args:
        draft: ``[N, B-1]`` int64 draft tokens ``d_1 .. d_{B-1}`` (``B = 1``: ``[N, 0]``).
        logits: ``[N, B, V]`` float16/bfloat16/float32 target logits at ``[anchor, d_1 .. d_{B-1}]``.
        temperature: 0 for greedy verification, ``T > 0`` for lossless sampling at ``T``.
        seed: selects the random streams (reduced mod 2^32); vary it per round.
        draft_probs: optional ``[N, B-1, V]`` float, the drafter distributions the drafts were
            sampled from; enables ``min(1, p/q)`` acceptance (ignored at ``T == 0``).
        stop_ids: optional stop token ids (1-D int tensor on the logits' device, or a sequence).

    Returns:
        ``AcceptResult(accept_len [N], bonus [N], tokens [N, B], num_tokens [N], stop_hit [N])``.

    Dispatch: the Triton kernel for CUDA tensors, the torch path otherwise (``D3D_KERNELS``) or with
    ``torch_path``.
    """
    draft, q, stop, kw = _prepare(draft, logits, temperature, seed, draft_probs, stop_ids)
    if use_triton(logits) and not torch_path:
        return _accept_triton(draft, logits, q, stop, **kw)
    return _accept_torch(draft, logits, q, stop, **kw)


def accept_torch(draft: torch.Tensor, logits: torch.Tensor, **kw) -> AcceptResult:
    """``accept`` on the torch path whatever the backend setting (the reference)."""
    return accept(draft, logits, torch_path=True, **kw)
