"""Fused denoising step for block-diffusion drafting (docs/design.md §5).

A draft block is ``B`` positions, some of them still masked. One denoising step reads the
drafter's logits for every position of every block and, for each block:

1. for each masked position ``b``, scans the vocabulary once (in chunks, so ``V`` of about 152k is
   fine) and keeps the softmax statistics of ``z = x / T`` (running max ``m``, running sum
   ``s = sum_v exp(z_v - m)``) together with the picked token:

   - ``T == 0``: ``pick = argmax_v x_v`` (the lowest index wins a tie), ``z = x``;
   - ``T > 0``:  ``pick = argmax_v (z_v + G_v)`` with ``G_v`` standard Gumbel noise from the
     counter-based RNG below, which is an exact sample from ``softmax(z)`` (Gumbel-max trick);

   and its **confidence** ``c_b = softmax(z)[pick] = exp(z_pick - m) / s``;
2. chooses which masked positions to **commit** in this step (``rule``):

   - ``"threshold"`` (Fast-dLLM): every masked ``b`` with ``c_b >= threshold``, and always the
     single most confident masked position (a tie goes to the lowest position);
   - ``"topk"`` (LLaDA low-confidence remasking): the ``k`` most confident masked positions
     (ties to the lowest position; all of them when fewer than ``k`` remain);
   - ``"all"``: every masked position (one-step drafting);

3. writes, in place, ``tokens[b] = pick`` and ``masked[b] = False`` for the committed positions and,
   if asked, ``confidence[b] = c_b`` for every position that was masked on entry.

Positions that are not masked are never read through the vocabulary and never written; a block
with no masked position is a no-op.

The Triton kernel does all of this in one launch, one program per block. ``denoise_step_torch``
is the same computation vectorised over blocks (the production path on CPU and the test oracle).
Kernel and torch path pick the same tokens exactly at ``T == 0`` (argmax on values converted
exactly to fp32, lowest index on ties). At ``T > 0`` both draw the same Gumbel noise bit for bit
(integer hash, see below), so they also agree except where two perturbed scores are within a
rounding error of each other (``log`` may differ by an ulp between libraries). Confidences agree
to float rounding (the vocabulary sum is taken in a different order), so commit sets agree unless
two confidences, or a confidence and the threshold, sit within a few ulps of each other.

Counter-based RNG (shared with ``accept.py``)
---------------------------------------------
Every random number is a pure function of ``(seed, stream, n, position, vocab index)``, so results
do not depend on launch order, chunk size or backend. With ``fmix32`` the murmur3 finaliser (a
bijection of uint32) and ``W = 0x9E3779B9`` (the golden-ratio Weyl constant), all arithmetic mod 2^32:

    stream_key(seed, stream) = fmix32((seed mod 2^32) ^ fmix32(stream * W))     # on the host
    row_key(key, n, pos)     = fmix32(fmix32(key + n) + pos)
    bits(row, v)             = fmix32(row + v * W)                             # SplitMix32-style
    w = min(float32(bits >> 1) * 2^-31 + 2^-32, 1 - 2^-24)                     # uniform in (0, 1)

``w`` keeps 24 significant bits even when it is tiny, which matters for the Gumbel tail:
``E = -log(1 - w)`` is an Exp(1) variate (for ``w < 2^-8``, where ``1 - w`` would lose digits, the
series ``w (1 + w (1/2 + w (1/3 + w/4)))`` replaces it; there is no ``log1p`` without libdevice)
and ``G = -log(E)`` is standard Gumbel. The largest ``G`` is about 22.2, so even with 152k
candidates the truncated Gumbel tail has probability ~4e-5 (and then only near-ties are affected).
Triton computes in uint32 (``tl.mul``/``tl.add`` with ``sanitize_overflow=False``: wrapping is the
point). torch has no uint32 shifts on CPU, so the torch path uses int32 with wrapping multiply and
emulated logical shifts (``_fmix32_torch_``), which the tests check against plain Python integers.
Because ``G`` lies in [-2.82, 22.19], a token more than 26 below its row's maximum scaled logit can
never win a Gumbel-max; the torch path draws noise only for the others when that prunes most of
the vocabulary (``gumbel_argmax_torch``: same result, several times faster on peaked logits).
"""

from __future__ import annotations

import math
import struct

import torch

from . import glue_cpu, tl, triton, use_triton

__all__ = ["denoise_step", "denoise_step_torch", "RULES"]

RULES = ("threshold", "topk", "all")
_RULE_ID = {"all": 0, "threshold": 1, "topk": 2}

# ------------------------------------------------------------------------------------------------
# Counter-based RNG: constants and host-side helpers
# ------------------------------------------------------------------------------------------------

_M32 = 0xFFFFFFFF
_WEYL = 0x9E3779B9
_FMIX_C1 = 0x85EBCA6B
_FMIX_C2 = 0xC2B2AE35
_TWO_M31 = 2.0**-31  # exact in fp32
_TWO_M32 = 2.0**-32
_W_MAX = 1.0 - 2.0**-24  # largest fp32 below 1
_SERIES_BELOW = 2.0**-8  # below this, -log(1 - w) is taken from its series

# Stream ids: independent random streams for independent purposes.
STREAM_DENOISE = 1
STREAM_ACCEPT_SAMPLE = 2  # Gumbel noise for sampling the target distribution
STREAM_ACCEPT_UNIFORM = 3  # the uniform of the min(1, p/q) acceptance test
STREAM_ACCEPT_RESIDUAL = 4  # Gumbel noise for sampling the residual max(p - q, 0)


def fmix32(h: int) -> int:
    """murmur3's 32-bit finaliser on a Python int (the specification the kernels follow)."""
    h &= _M32
    h ^= h >> 16
    h = (h * _FMIX_C1) & _M32
    h ^= h >> 13
    h = (h * _FMIX_C2) & _M32
    h ^= h >> 16
    return h


def stream_key(seed: int, stream: int) -> int:
    """The uint32 key of one random stream for one call (computed on the host, no device work)."""
    return fmix32((int(seed) & _M32) ^ fmix32(stream * _WEYL))


def _as_i32(c: int) -> int:
    """The int32 with the same bits as the uint32 ``c`` (torch rejects out-of-range scalars)."""
    c &= _M32
    return c - (1 << 32) if c >= 1 << 31 else c


def _fmix32_torch_(h: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """``fmix32`` in place on int32 tensors holding uint32 bits (multiplication wraps mod 2^32).

    torch's ``>>`` on int32 is arithmetic, so each logical shift masks off the sign copies.
    ``tmp`` is scratch of the same shape: in-place ops avoid an allocation per step, which is
    most of the cost on CPU for vocabulary-sized tensors."""
    for shift, mult in ((16, _FMIX_C1), (13, _FMIX_C2), (16, None)):
        torch.bitwise_right_shift(h, shift, out=tmp)
        tmp &= (1 << (32 - shift)) - 1
        h ^= tmp
        if mult is not None:
            h *= _as_i32(mult)
    return h


def _fmix32_torch(h: torch.Tensor) -> torch.Tensor:
    """``fmix32`` on int32 tensors holding uint32 bits (out of place)."""
    return _fmix32_torch_(h.clone(), torch.empty_like(h))


def row_keys_torch(key: int, n: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``row_key(key, n, pos)`` for broadcastable integer tensors ``n`` and ``pos`` -> int32."""
    n = n.to(torch.int32)
    pos = pos.to(torch.int32)
    return _fmix32_torch(_fmix32_torch(n + _as_i32(key)) + pos)


def _unit_torch_(bits: torch.Tensor) -> torch.Tensor:
    """Uniform in (0, 1) from int32-held uint32 bits (clobbers ``bits``), as the kernels do:
    ``min(float32(bits >> 1) * 2^-31 + 2^-32, 1 - 2^-24)``."""
    bits >>= 1
    bits &= 0x7FFFFFFF
    return bits.to(torch.float32).mul_(_TWO_M31).add_(_TWO_M32).clamp_(max=_W_MAX)


def _gumbel_from_counter_torch_(h: torch.Tensor) -> torch.Tensor:
    """Gumbel noise from int32 counters ``h = row + v * W`` (clobbered; the result reuses it).

    ``G = -log(E)`` with ``E = -log(1 - w)``, or its series ``w (1 + w (1/2 + w (1/3 + w/4)))``
    for ``w < 2^-8``; the same operations in the same order as ``gumbel_tl``."""
    tmp = torch.empty_like(h)
    w = _unit_torch_(_fmix32_torch_(h, tmp))
    series = tmp.view(torch.float32)  # reuse the scratch storage
    torch.mul(w, 0.25, out=series)
    series.add_(0.3333333432674408).mul_(w).add_(0.5).mul_(w).add_(1.0).mul_(w)
    e = h.view(torch.float32)
    torch.neg(w, out=e)
    e.add_(1.0).log_().neg_()
    torch.where(w < _SERIES_BELOW, series, e, out=e)
    return e.log_().neg_()


def gumbel_torch(rows: torch.Tensor, V: int) -> torch.Tensor:
    """Gumbel noise ``[*rows.shape, V]`` (fp32) for int32 row keys ``rows``."""
    v = torch.arange(V, dtype=torch.int32, device=rows.device) * _as_i32(_WEYL)
    return _gumbel_from_counter_torch_(rows.to(torch.int32).unsqueeze(-1) + v)


# G is bounded: w >= 2^-32 gives G <= 22.19 and w <= 1 - 2^-24 gives G >= -2.82. A token whose
# logit is more than the span below its row's maximum can therefore never win a Gumbel-max.
_GUMBEL_SPAN = 26.0  # > 22.19 + 2.82, with room for rounding


def gumbel_argmax_torch(z: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``argmax_v (z[..., v] + G(rows[...], v))``, the lowest index on ties (a sample from
    ``softmax(z)``); ``z`` fp32 ``[..., V]``, ``rows`` int32 row keys broadcastable to ``z[..., 0]``.

    Exactly the dense computation, but noise is drawn only for tokens within ``_GUMBEL_SPAN`` of
    their row's maximum: real logits are peaked, and the hash is most of the cost on CPU."""
    shape, V = z.shape[:-1], z.shape[-1]
    z2 = z.reshape(-1, V)
    rows = rows.to(torch.int32).expand(shape).reshape(-1)
    cand = z2 >= z2.amax(-1, keepdim=True) - _GUMBEL_SPAN
    if 4 * int(cand.count_nonzero()) > cand.numel():  # pruning would not pay for its gathers
        return gumbel_torch(rows, V).add_(z2).argmax(-1).view(shape)
    r_idx, v_idx = cand.nonzero(as_tuple=True)
    score = _gumbel_from_counter_torch_(rows[r_idx] + v_idx.to(torch.int32) * _as_i32(_WEYL))
    score.add_(z2[r_idx, v_idx])
    R = z2.shape[0]
    best = torch.full((R,), float("-inf"), device=z.device).scatter_reduce_(0, r_idx, score, "amax")
    win = score == best[r_idx]
    pick = torch.full((R,), V, dtype=torch.int64, device=z.device)
    pick.scatter_reduce_(0, r_idx[win], v_idx[win], "amin")
    return pick.view(shape)


def uniform_torch(rows: torch.Tensor) -> torch.Tensor:
    """One uniform in (0, 1) per row key (vocab index 0 of the row's stream)."""
    return _unit_torch_(_fmix32_torch(rows.to(torch.int32)))


def f32(x: float) -> float:
    """``x`` rounded to fp32, so that host scalars are the very values a kernel sees (on the host:
    no tensor, so nothing a stream could wait for)."""
    try:
        return struct.unpack("f", struct.pack("f", float(x)))[0]
    except OverflowError:  # beyond fp32's range: what the cast gives
        return math.copysign(math.inf, float(x))


# ------------------------------------------------------------------------------------------------
# Triton: RNG and one-row vocabulary scan (shared with accept.py)
# ------------------------------------------------------------------------------------------------


# Hash arithmetic wraps mod 2^32 on purpose: tl.mul/tl.add with sanitize_overflow=False say so
# (the operators would add an overflow check, which fires under TRITON_DEBUG and costs time in
# the interpreter).


@triton.jit
def fmix32_tl(h):
    """murmur3 finaliser on uint32."""
    h ^= h >> 16
    h = tl.mul(h, 0x85EBCA6B, sanitize_overflow=False)
    h ^= h >> 13
    h = tl.mul(h, 0xC2B2AE35, sanitize_overflow=False)
    h ^= h >> 16
    return h


@triton.jit
def row_key_tl(key, n, pos):
    """``row_key(key, n, pos) = fmix32(fmix32(key + n) + pos)`` as uint32 (``n``, ``pos`` any
    integers, truncated to 32 bits). The finaliser is written out rather than calling
    ``fmix32_tl``: every nested ``@jit`` call costs time under the interpreter (the tests run there)."""
    h = tl.add(key.to(tl.uint32), tl.cast(n, tl.uint32), sanitize_overflow=False)
    h ^= h >> 16
    h = tl.mul(h, 0x85EBCA6B, sanitize_overflow=False)
    h ^= h >> 13
    h = tl.mul(h, 0xC2B2AE35, sanitize_overflow=False)
    h ^= h >> 16
    h = tl.add(h, tl.cast(pos, tl.uint32), sanitize_overflow=False)
    h ^= h >> 16
    h = tl.mul(h, 0x85EBCA6B, sanitize_overflow=False)
    h ^= h >> 13
    h = tl.mul(h, 0xC2B2AE35, sanitize_overflow=False)
    h ^= h >> 16
    return h


@triton.jit
def unit_tl(bits):
    """Uniform in (0, 1) from uint32 bits: ``min(float32(bits >> 1) * 2^-31 + 2^-32, 1 - 2^-24)``."""
    w = (bits >> 1).to(tl.float32) * 4.656612873077393e-10 + 2.3283064365386963e-10
    return tl.minimum(w, 0.9999999403953552)


@triton.jit
def gumbel_tl(row, idx):
    """Standard Gumbel noise for vocab indices ``idx`` of the stream row ``row`` (fp32):
    ``bits = fmix32(row + idx * W)``, ``w = unit(bits)``, ``G = -log(-log(1 - w))`` (series for
    small ``w``). Written out in one function for the interpreter's sake (see ``row_key_tl``)."""
    h = tl.add(row, tl.mul(idx.to(tl.uint32), 0x9E3779B9, sanitize_overflow=False),
               sanitize_overflow=False)
    h ^= h >> 16
    h = tl.mul(h, 0x85EBCA6B, sanitize_overflow=False)
    h ^= h >> 13
    h = tl.mul(h, 0xC2B2AE35, sanitize_overflow=False)
    h ^= h >> 16
    w = tl.minimum((h >> 1).to(tl.float32) * 4.656612873077393e-10 + 2.3283064365386963e-10,
                   0.9999999403953552)
    series = w * (1.0 + w * (0.5 + w * (0.3333333432674408 + w * 0.25)))
    e = tl.where(w < 0.00390625, series, -tl.log(1.0 - w))
    return -tl.log(e)


@triton.jit
def row_scan_tl(row_ptr, V, inv_t, row, NOISE: tl.constexpr, STATS: tl.constexpr,
                BLOCK_V: tl.constexpr):
    """One pass over the ``V`` logits ``x`` at ``row_ptr`` (unit stride), with ``z = x * inv_t``
    (``inv_t = 1`` at ``T == 0``, an exact no-op).

    Returns ``(pick, z_pick, m, s)``: the argmax of ``z`` (or of ``z + G`` with Gumbel noise ``G``
    from the stream row ``row`` when ``NOISE``), ``z`` at the pick, and, when ``STATS``, the
    softmax statistics of ``z``: ``m = max z`` and ``s = sum exp(z - m)`` (online over chunks).
    The lowest index wins a tie, within a chunk (``tl.argmax``) and across chunks (strict ``>``).
    """
    offs = tl.arange(0, BLOCK_V)
    best = tl.full([], float("-inf"), tl.float32)
    pick = tl.full([], 0, tl.int32)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + offs
        ok = idx < V
        # Convert right after the load: the interpreter does integer arithmetic on raw bf16.
        z = tl.load(row_ptr + idx, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
        if NOISE:
            score = tl.where(ok, z + gumbel_tl(row, idx), float("-inf"))
        else:
            score = z
        c_best, c_arg = tl.max(score, axis=0, return_indices=True,
                               return_indices_tie_break_left=True)
        pick = tl.where(c_best > best, v0 + c_arg, pick)
        best = tl.maximum(best, c_best)
        if STATS:
            m_new = tl.maximum(m, tl.max(z, axis=0))
            # Rows whose first chunks are all -inf would give exp(-inf - -inf) = nan.
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - m_ref) + tl.sum(tl.exp(z - m_ref), axis=0)
            m = m_new
    z_pick = tl.load(row_ptr + pick).to(tl.float32) * inv_t
    return pick, z_pick, m, s


# ------------------------------------------------------------------------------------------------
# Triton: the denoising kernel
# ------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["key", "k"])
def _denoise_kernel(
    logits_ptr, tokens_ptr, masked_ptr, conf_ptr, committed_ptr,
    B, V,
    stride_ln, stride_lb, stride_tn, stride_tb, stride_mn, stride_mb, stride_cn, stride_cb,
    inv_t, key, threshold, k,
    NOISE: tl.constexpr, RULE: tl.constexpr, HAS_CONF: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    offs_b = tl.arange(0, BLOCK_B)
    in_b = offs_b < B
    m_ptrs = masked_ptr + n * stride_mn + offs_b * stride_mb
    was_masked = tl.load(m_ptrs, mask=in_b, other=0) != 0

    # Per-position results, gathered into block vectors for the selection below.
    conf = tl.full([BLOCK_B], -1.0, tl.float32)  # -1 < any confidence: "not a candidate"
    pick = tl.zeros([BLOCK_B], dtype=tl.int64)
    for b in range(0, B):
        if tl.load(masked_ptr + n * stride_mn + b * stride_mb) != 0:
            row = row_key_tl(key, n, b)
            p, z_p, m, s = row_scan_tl(logits_ptr + n * stride_ln + b * stride_lb, V, inv_t, row,
                                       NOISE, True, BLOCK_V)
            c = tl.exp(z_p - m) / s
            conf = tl.where(offs_b == b, c, conf)
            pick = tl.where(offs_b == b, p.to(tl.int64), pick)

    if RULE == 0:  # all
        commit = was_masked
    elif RULE == 1:  # threshold, plus the most confident masked position
        best = tl.argmax(conf, axis=0, tie_break_left=True)
        commit = was_masked & ((conf >= threshold) | (offs_b == best))
    else:  # top-k: rank = number of masked positions that beat b (higher, or equal and earlier)
        c_i = conf[:, None]
        c_j = conf[None, :]
        beats = (c_j > c_i) | ((c_j == c_i) & (offs_b[None, :] < offs_b[:, None]))
        beats = beats & was_masked[None, :]
        rank = tl.sum(beats.to(tl.int32), axis=1)
        commit = was_masked & (rank < k)

    tl.store(tokens_ptr + n * stride_tn + offs_b * stride_tb, pick, mask=commit)
    tl.store(m_ptrs, tl.zeros([BLOCK_B], dtype=tl.uint8), mask=commit)
    if HAS_CONF:
        tl.store(conf_ptr + n * stride_cn + offs_b * stride_cb, conf, mask=was_masked)
    tl.store(committed_ptr + n * B + offs_b, commit.to(tl.uint8), mask=in_b)


def _block_v(V: int, on_cuda: bool) -> int:
    """Vocabulary chunk: 4096 on a GPU (16 fp32 per thread at 8 warps); under the interpreter
    the cost is per operation, not per element, so bigger chunks are faster, up to 16384."""
    cap = 4096 if on_cuda else 16384
    return min(cap, triton.next_power_of_2(V))


def _denoise_triton(logits, tokens, masked, confidence, *, inv_t, key, rule_id, threshold, k,
                    block_v=None) -> torch.Tensor:
    N, B, V = logits.shape
    if logits.stride(-1) != 1:  # the kernel walks the vocabulary with unit stride
        logits = logits.contiguous()
    committed = torch.zeros((N, B), dtype=torch.bool, device=logits.device)
    if N == 0:
        return committed
    # bool tensors are passed as their bytes; views share storage, so writes land in place.
    masked_u8 = masked.view(torch.uint8)
    conf_arg = confidence if confidence is not None else logits
    c_strides = confidence.stride() if confidence is not None else (0, 0)
    block_v = block_v or _block_v(V, logits.is_cuda)
    _denoise_kernel[(N,)](
        logits, tokens, masked_u8, conf_arg, committed.view(torch.uint8),
        B, V,
        logits.stride(0), logits.stride(1), tokens.stride(0), tokens.stride(1),
        masked_u8.stride(0), masked_u8.stride(1), c_strides[0], c_strides[1],
        inv_t or 1.0, key, threshold, k,
        NOISE=inv_t is not None, RULE=rule_id, HAS_CONF=confidence is not None,
        BLOCK_B=triton.next_power_of_2(B), BLOCK_V=block_v,
        num_warps=8 if block_v >= 4096 else 4,
    )
    return committed


# ------------------------------------------------------------------------------------------------
# Torch path (vectorised over blocks; the production path on CPU)
# ------------------------------------------------------------------------------------------------


def _select_torch(conf: torch.Tensor, masked: torch.Tensor, rule_id: int, threshold: float,
                  k: int) -> torch.Tensor:
    """Commit set ``[N, B]`` from confidences ``[N, B]`` (any values where not masked)."""
    if rule_id == 0:
        return masked.clone()
    conf = torch.where(masked, conf, torch.full_like(conf, -1.0))
    B = conf.shape[-1]
    pos = torch.arange(B, device=conf.device)
    if rule_id == 1:
        # torch.argmax returns the first maximum: the lowest position wins a tie.
        best = torch.nn.functional.one_hot(conf.argmax(-1), B).bool()
        return masked & ((conf >= threshold) | best)
    c_i = conf.unsqueeze(-1)
    c_j = conf.unsqueeze(-2)
    beats = (c_j > c_i) | ((c_j == c_i) & (pos[None, :] < pos[:, None]))
    rank = (beats & masked.unsqueeze(-2)).sum(-1)
    return masked & (rank < k)


def _denoise_torch(logits, tokens, masked, confidence, *, inv_t, key, rule_id, threshold,
                   k) -> torch.Tensor:
    N, B, V = logits.shape
    z = logits.float()
    if inv_t is None:  # T == 0
        pick = glue_cpu.argmax(z)  # torch.argmax's result, in one call on a CPU
    else:
        z = z * inv_t
        n = torch.arange(N, device=z.device).view(N, 1)
        b = torch.arange(B, device=z.device).view(1, B)
        pick = gumbel_argmax_torch(z, row_keys_torch(key, n, b))
    # The same formula as the kernel: exp(z_pick - m) / sum exp(z - m).
    m = z.amax(-1, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    s = torch.exp(z - m).sum(-1)
    conf = torch.exp(z.gather(-1, pick.unsqueeze(-1)).squeeze(-1) - m.squeeze(-1)) / s

    was_masked = masked.clone()
    commit = _select_torch(conf, was_masked, rule_id, threshold, k)
    # torch.where instead of boolean indexing: no host synchronisation on a GPU.
    tokens.copy_(torch.where(commit, pick, tokens))
    masked.logical_and_(~commit)
    if confidence is not None:
        confidence.copy_(torch.where(was_masked, conf, confidence))
    return commit


# ------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------


def _check_args(logits, tokens, masked, confidence, temperature, rule, threshold, k):
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise ValueError(f"logits: expected a [N, B, V] tensor, got "
                         f"{getattr(logits, 'shape', type(logits).__name__)}")
    if logits.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"logits: expected float16, bfloat16 or float32, got {logits.dtype}")
    N, B, V = logits.shape
    if B < 1 or V < 1:
        raise ValueError(f"logits: block size and vocabulary must be >= 1, got shape {tuple(logits.shape)}")
    for name, t, dtype in (("tokens", tokens, torch.int64), ("masked", masked, torch.bool),
                           ("confidence", confidence, torch.float32)):
        if t is None and name == "confidence":
            continue
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (N, B):
            raise ValueError(f"{name}: expected shape ({N}, {B}) to match logits, got "
                             f"{tuple(getattr(t, 'shape', ()))}")
        if t.dtype != dtype:
            raise ValueError(f"{name}: expected dtype {dtype}, got {t.dtype}")
        if t.device != logits.device:
            raise ValueError(f"{name}: on {t.device}, logits on {logits.device}")
    if rule not in _RULE_ID:
        raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")
    temperature = float(temperature)
    if not temperature >= 0.0 or temperature == float("inf"):
        raise ValueError(f"temperature: expected a finite value >= 0, got {temperature}")
    if rule == "topk" and (int(k) != k or k < 1):
        raise ValueError(f"k: expected an integer >= 1, got {k}")
    if rule == "threshold" and not (0.0 <= float(threshold) <= 1.0):
        raise ValueError(f"threshold: expected a value in [0, 1], got {threshold}")


def _prepare(logits, tokens, masked, confidence, temperature, seed, rule, threshold, k) -> dict:
    """Check the arguments; the scalar arguments both paths take."""
    _check_args(logits, tokens, masked, confidence, temperature, rule, threshold, k)
    return dict(
        inv_t=f32(1.0 / temperature) if temperature > 0 else None,
        key=stream_key(seed, STREAM_DENOISE),
        rule_id=_RULE_ID[rule],
        threshold=f32(threshold),  # both paths compare against the same fp32 value
        k=int(k),
    )


def denoise_step(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    masked: torch.Tensor,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    rule: str = "threshold",
    threshold: float = 0.9,
    k: int = 1,
    confidence: torch.Tensor | None = None,
) -> torch.Tensor:
    """One denoising step for ``N`` draft blocks of ``B`` positions, in place.

    Args:
        logits: ``[N, B, V]`` float16/bfloat16/float32, the drafter's logits for every position of
            every block (any strides; the vocabulary dimension is made contiguous if it is not).
        tokens: ``[N, B]`` int64, updated in place at the committed positions.
        masked: ``[N, B]`` bool, True where a position is still masked; committed positions are
            set to False in place.
        temperature: 0 picks the argmax (lowest index on ties); ``T > 0`` samples from
            ``softmax(logits / T)``; the confidence is the probability of the picked token under
            that same distribution.
        seed: selects the random stream (reduced mod 2^32); the result is a pure function of
            (inputs, seed). Pass a different seed for each step and round, or the same noise is
            reused for the same (block index, position).
        rule: ``"threshold"`` (confidence >= ``threshold``, always at least the most confident),
            ``"topk"`` (the ``k`` most confident) or ``"all"``; ties go to the lowest position.
        confidence: optional ``[N, B]`` float32 out: the confidence of every position that was
            masked on entry (committed or not); other entries are left untouched.

    Returns:
        ``[N, B]`` bool, the positions committed by this step.

    Dispatch: the Triton kernel for CUDA tensors, the torch path otherwise (``D3D_KERNELS``
    overrides, see ``d3d.kernels``).
    """
    return _step(use_triton(logits), logits, tokens, masked, temperature, seed, rule, threshold, k, confidence)


def denoise_step_torch(logits: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor, **options) -> torch.Tensor:
    """``denoise_step`` (same arguments) on the torch path whatever the backend setting (the reference)."""
    return _step(False, logits, tokens, masked, **options)


def _step(triton_path: bool, logits, tokens, masked, temperature=0.0, seed=0, rule="threshold", threshold=0.9, k=1,
          confidence=None) -> torch.Tensor:
    kw = _prepare(logits, tokens, masked, confidence, temperature, seed, rule, threshold, k)
    fn = _denoise_triton if triton_path else _denoise_torch
    return fn(logits, tokens, masked, confidence, **kw)
