"""Block-causal packed attention (docs/design.md §4).

One call attends the new tokens of N sequences, packed along one token axis, to each sequence's
cached keys followed by its own new keys:

    q       [T, H, D]                new-token queries; sequence n owns rows cu[n] : cu[n+1]
    k, v    [T, Hkv, D] or None      new-token keys/values (None: already in the cache, see below)
    k_cache [R, Hkv, Lmax, D]        cache rows; sequence n reads row cache_rows[n]
    out     [T, H, D]

For sequence n with c = cache_lens[n] cached keys and L = cu[n+1] - cu[n] new tokens, the keys are

    K_n = [ k_cache[row, :, 0:c] ; k[cu[n]:cu[n+1]] ]            (k given)
    K_n =   k_cache[row, :, 0:c+L]                               (k is None: the caller wrote the
                                                                  new keys at c..c+L-1 first)

and query i (0 <= i < L) of sequence n sees every cached key plus the new keys j with
``group_ids[j] <= group_ids[i]``. Group ids are non-decreasing along each sequence, so:

    causal        groups 0, 1, 2, ...            each token its own group
    block-causal  0, 1, .., c-1, c, c, c, c+1, c+1, c+1, ...
                  a causal run of clean tokens, then bidirectional blocks

With ``reach`` given ([T], ``reach[i] <= group_ids[i]``) the rule becomes: query i sees new key j
iff ``group_ids[j] == group_ids[i]`` (its own group) or ``group_ids[j] < reach[i]`` (the earlier
groups below its reach). ``reach = group_ids`` is the rule above. It lets sibling blocks branch
off one causal run at different points and ignore each other (the outcome hypotheses of async
drafting, ``d3d.draft.drafter``):

    groups  0 1 2 3 4  5 5 5  6 6 6        clean run d0..d4, then two blocks
    reach   0 1 2 3 4  2 2 2  5 5 5        block 5 sees d0, d1 (a branch after d1), block 6 d0..d4

Query head h reads kv head ``h // (H // Hkv)`` (GQA). With S_i the visible keys of query i,

    out[i, h] = sum_{j in S_i} softmax_j(scale * q[i, h] . K[j, h]) V[j, h]

computed in fp32 and cast to q.dtype.

Two implementations share one input check:

* ``packed_attention_torch``: one ``scaled_dot_product_attention`` per sequence on views of the
  cache; the production path on CPU.
* ``packed_attention_triton``: one launch for the whole packed batch, a flash-attention style
  kernel (online softmax over key tiles, fp32 accumulation) that stops at the first key tile the
  layout hides. The production path on CUDA; runs under TRITON_INTERPRET=1 in tests.

``packed_attention`` picks one with ``d3d.kernels.use_triton``.

Checks that need the *values* of the index tensors (cu_seqlens monotone, cache lengths in range,
groups non-decreasing, ...) cost a device sync. They always run for CPU tensors and on the torch
path, and for CUDA tensors on the Triton path only when ``D3D_CHECKS=1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from d3d import env
from d3d.kernels import interpreting, tl, triton, use_triton

__all__ = [
    "packed_attention",
    "packed_attention_torch",
    "packed_attention_triton",
    "torch_plan",
    "attend_torch",
    "causal_groups",
    "block_causal_groups",
    "cu_seqlens_from_lengths",
    "bd3_training_mask",
]

_LOG2E = 1.4426950408889634
_INDEX_DTYPES = (torch.int32, torch.int64)
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------------------------
# Layout helpers
# --------------------------------------------------------------------------------------------


def causal_groups(n: int, *, device=None, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Group ids of a causal run of ``n`` tokens: ``[0, 1, ..., n-1]``."""
    return torch.arange(n, device=device, dtype=dtype)


def block_causal_groups(
    n_clean: int, block_size: int, n_blocks: int = 1, *, device=None, dtype: torch.dtype = torch.int32
) -> torch.Tensor:
    """Group ids of one drafter sequence: ``n_clean`` causal tokens, then ``n_blocks``
    bidirectional blocks of ``block_size`` tokens, length ``n_clean + n_blocks * block_size``.

    >>> block_causal_groups(2, 3, 2).tolist()
    [0, 1, 2, 2, 2, 3, 3, 3]
    """
    if n_clean < 0 or block_size < 1 or n_blocks < 0:
        raise ValueError(f"block_causal_groups({n_clean}, {block_size}, {n_blocks}): bad sizes")
    clean = torch.arange(n_clean, device=device, dtype=dtype)
    blocks = n_clean + torch.arange(n_blocks, device=device, dtype=dtype).repeat_interleave(block_size)
    return torch.cat([clean, blocks])


def cu_seqlens_from_lengths(lengths, *, device=None) -> torch.Tensor:
    """int32 offsets ``[0, l0, l0+l1, ...]`` of sequences packed back to back."""
    lengths = torch.as_tensor(lengths, dtype=torch.int32, device=device)
    return F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def bd3_training_mask(L: int, block_size: int, *, device=None) -> torch.Tensor:
    """The BD3-LM training mask (docs/design.md §4): bool [2L, 2L], True = query (row) sees key (col).

    The input is ``x_t ⊕ x_0`` (noised half, then clean half). With ``blk(i) = (i mod L) //
    block_size``, query i sees key j iff
      same half and same block, or
      i noisy, j clean and blk(j) < blk(i), or
      both clean and blk(j) <= blk(i).
    """
    idx = torch.arange(2 * L, device=device)
    clean = idx >= L
    blk = (idx % L) // block_size
    qc, kc = clean[:, None], clean[None, :]
    qb, kb = blk[:, None], blk[None, :]
    same_block = (qc == kc) & (qb == kb)
    noisy_sees_earlier_clean = ~qc & kc & (kb < qb)
    clean_block_causal = qc & kc & (kb <= qb)
    return same_block | noisy_sees_earlier_clean | clean_block_causal


# --------------------------------------------------------------------------------------------
# Input checks (shared by both paths)
# --------------------------------------------------------------------------------------------


def _check_args(q, k, v, k_cache, v_cache, cu_seqlens, cache_lens, group_ids, cache_rows, out, triton_path=False,
                reach=None):
    """Shape / dtype / device checks; no device sync. Returns (N, Hkv)."""

    def fail(msg):
        raise ValueError(f"packed_attention: {msg}")

    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        fail(f"q must be a [T, H, D] tensor, got {getattr(q, 'shape', type(q))}")
    T, H, D = q.shape
    if q.dtype not in _FLOAT_DTYPES:
        fail(f"q dtype {q.dtype} not supported (float32, float16, bfloat16)")
    if triton_path and (D < 16 or D > 256 or D & (D - 1)):
        # tl.arange needs a power of two; the torch path takes any head_dim
        fail(f"head_dim {D} (q.shape[-1]) must be a power of two in [16, 256] for the Triton kernel")

    def same_place(name, t):
        if t.dtype != q.dtype:
            fail(f"{name} dtype {t.dtype} differs from q dtype {q.dtype}")
        if t.device != q.device:
            fail(f"{name} is on {t.device}, q on {q.device}")

    if (k is None) != (v is None):
        fail("k and v must both be given or both be None")
    if (k_cache is None) != (v_cache is None):
        fail("k_cache and v_cache must both be given or both be None")
    if k is None and k_cache is None:
        fail("k is None (new keys in the cache) but k_cache is None")

    Hkv = None
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 3 or t.shape[0] != T or t.shape[2] != D:
                fail(f"{name} shape {tuple(t.shape)} must be [T={T}, Hkv, D={D}]")
            same_place(name, t)
        if k.shape != v.shape:
            fail(f"k shape {tuple(k.shape)} differs from v shape {tuple(v.shape)}")
        Hkv = k.shape[1]
    if k_cache is not None:
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if t.dim() != 4 or t.shape[3] != D:
                fail(f"{name} shape {tuple(t.shape)} must be [R, Hkv, Lmax, D={D}]")
            same_place(name, t)
        if k_cache.shape != v_cache.shape:
            fail(f"k_cache shape {tuple(k_cache.shape)} differs from v_cache shape {tuple(v_cache.shape)}")
        if Hkv is not None and k_cache.shape[1] != Hkv:
            fail(f"k_cache has {k_cache.shape[1]} kv heads, k has {Hkv}")
        Hkv = k_cache.shape[1]
    if Hkv < 1 or H % Hkv:
        fail(f"num_heads {H} is not divisible by num_kv_heads {Hkv}")

    def index_vector(name, t, length):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in _INDEX_DTYPES:
            fail(f"{name} must be a 1-d int32/int64 tensor, got {getattr(t, 'dtype', type(t))} "
                 f"{tuple(getattr(t, 'shape', ()))}")
        if length is not None and t.shape[0] != length:
            fail(f"{name} has {t.shape[0]} entries, expected {length}")
        if t.device != q.device:
            fail(f"{name} is on {t.device}, q on {q.device}")

    index_vector("cu_seqlens", cu_seqlens, None)
    if cu_seqlens.shape[0] < 1:
        fail("cu_seqlens needs N+1 >= 1 entries")
    N = cu_seqlens.shape[0] - 1
    index_vector("cache_lens", cache_lens, N)
    index_vector("group_ids", group_ids, T)
    if reach is not None:
        index_vector("reach", reach, T)
    if cache_rows is not None:
        index_vector("cache_rows", cache_rows, N)
    if out is not None:
        if out.shape != q.shape:
            fail(f"out shape {tuple(out.shape)} differs from q shape {tuple(q.shape)}")
        same_place("out", out)
    return N, Hkv


def _check_values(q, k, k_cache, cu, cached, rows, max_seqlen):
    """Checks on index values, given as host lists (reading them is the device sync).

    ``cu``, ``cached`` and ``rows`` are ``cu_seqlens``, ``cache_lens`` and ``cache_rows``
    (or None) as Python lists. Group ids are checked by ``_check_groups``.
    """

    def fail(msg):
        raise ValueError(f"packed_attention: {msg}")

    T = q.shape[0]
    if cu[0] != 0:
        fail(f"cu_seqlens[0] = {cu[0]}, must be 0")
    lens = [e - s for s, e in zip(cu[:-1], cu[1:])]
    if any(L < 0 for L in lens):
        fail("cu_seqlens must be non-decreasing")
    if cu[-1] != T:
        fail(f"cu_seqlens[-1] = {cu[-1]} differs from the number of tokens T = {T}")
    if lens and max_seqlen is not None and max(lens) > max_seqlen:
        fail(f"max_seqlen = {max_seqlen} is smaller than the longest sequence ({max(lens)})")
    if any(c < 0 for c in cached):
        fail("cache_lens must be >= 0")
    if k_cache is None:
        if any(cached):
            fail("cache_lens must be all 0 when k_cache is None")
        return
    R, Lmax = k_cache.shape[0], k_cache.shape[2]
    needed = [c + L for c, L in zip(cached, lens)] if k is None else cached
    if needed and max(needed) > Lmax:
        what = "cache_lens + new tokens" if k is None else "cache_lens"
        fail(f"{what} reaches {max(needed)} > cache length Lmax = {Lmax}")
    if rows is None:
        if len(cached) > R:
            fail(f"{len(cached)} sequences but only R={R} cache rows (pass cache_rows)")
    elif any(r < 0 or r >= R for r in rows):
        fail(f"cache_rows must lie in [0, R={R})")


def _check_groups(group_ids, cu, reach=None):
    """group_ids non-decreasing inside every sequence (a step down is fine where one starts);
    reach (if given) at most the group (the kernel bounds each tile's keys by its largest group)."""
    if reach is not None and bool((reach > group_ids).any()):
        raise ValueError("packed_attention: reach must be <= group_ids at every token")
    T = group_ids.shape[0]
    if T < 2:
        return
    down = group_ids[1:] < group_ids[:-1]
    starts = [s for s in cu[1:-1] if 0 < s < T]
    if starts:
        down[torch.tensor(starts, device=down.device) - 1] = False
    if down.any().item():
        raise ValueError("packed_attention: group_ids must be non-decreasing inside each sequence")


def _debug_checks() -> bool:
    return env.read("D3D_CHECKS")


# --------------------------------------------------------------------------------------------
# Torch path
# --------------------------------------------------------------------------------------------


@dataclass
class SeqPlan:
    """How the torch path attends one sequence: queries ``start:end`` over cache row ``row``'s
    first ``cached`` keys and then the sequence's new keys (in the cache after them, or
    ``k[start:end]`` when given), with SDPA's ``mask`` or ``causal``."""

    start: int
    end: int
    row: int
    cached: int
    mask: torch.Tensor | None
    causal: bool


def torch_plan(cu: list[int], cached: list[int], rows, group_ids: torch.Tensor,
               row_invariant: bool = False, reach: torch.Tensor | None = None) -> list[SeqPlan]:
    """Per-sequence SDPA arguments, built once per pass and reused by every layer.

    Per sequence the cheapest SDPA form: no mask for a single new token, ``is_causal`` for a
    causal layout with an empty cache, and otherwise a boolean mask ``[L, c+L]`` (cached columns
    all True, new columns ``g[None, :] <= g[:, None]``, or with ``reach`` r: ``g[None, :] == g[:, None]
    | g[None, :] < r[:, None]``).

    ``row_invariant``: a causal run after a non-empty cache (a verification pass) is planned as L
    one-query calls, query i over keys 0..c+i: exactly the call a one-token decoding step makes.
    SDPA's result for a row depends on how many query rows share the call, so only this makes
    a 16-token verification and 16 decoding steps round alike (low-precision losslessness).
    """
    plan = []
    for n, (s, e, c) in enumerate(zip(cu[:-1], cu[1:], cached)):
        L = e - s
        if L == 0:
            continue
        mask, causal = None, False
        if L > 1 and reach is not None:
            g, r = group_ids[s:e], reach[s:e]
            mask = torch.ones(L, c + L, dtype=torch.bool, device=group_ids.device)
            mask[:, c:] = (g[None, :] == g[:, None]) | (g[None, :] < r[:, None])
        elif L > 1:
            g = group_ids[s:e]
            step = int((g[1:] - g[:-1]).min())  # also the group check: one op per sequence
            if step < 0:
                raise ValueError("packed_attention: group_ids must be non-decreasing inside each sequence")
            if step > 0 and c == 0:
                causal = True  # strictly increasing groups: SDPA's top-left causal mask is exact
            elif step > 0 and row_invariant:
                plan.extend(SeqPlan(s + i, s + i + 1, rows[n], c + i, None, False) for i in range(L))
                continue
            else:
                mask = torch.ones(L, c + L, dtype=torch.bool, device=group_ids.device)
                mask[:, c:] = g[None, :] <= g[:, None]
        plan.append(SeqPlan(s, e, rows[n], c, mask, causal))
    return plan


def attend_torch(q, k, v, k_cache, v_cache, plan: list[SeqPlan], scale: float, out=None) -> torch.Tensor:
    """Packed attention from a ``torch_plan``: one ``scaled_dot_product_attention`` per sequence.

    Keys are views of the cache when ``k`` is None (no copy); with ``k`` given and a non-empty
    cache the two parts are concatenated. No checks: the plan comes from a checked layout.
    """
    gqa = q.shape[1] != (k if k is not None else k_cache).shape[1]  # [T, Hkv, D] or [R, Hkv, Lmax, D]
    if out is None and len(plan) == 1 and plan[0].start == 0 and plan[0].end == q.shape[0]:
        return _attend_one(q, k, v, k_cache, v_cache, plan[0], scale, gqa)  # the common case: no copy into out
    out = torch.empty_like(q) if out is None else out
    for p in plan:
        out[p.start:p.end] = _attend_one(q, k, v, k_cache, v_cache, p, scale, gqa)
    return out


def _attend_one(q, k, v, k_cache, v_cache, p: SeqPlan, scale: float, gqa: bool) -> torch.Tensor:
    s, e, c = p.start, p.end, p.cached
    qn = q[s:e].transpose(0, 1)  # [H, L, D]
    if k is None:
        kn = k_cache[p.row, :, : c + e - s]  # [Hkv, c+L, D], a view
        vn = v_cache[p.row, :, : c + e - s]
    else:
        kn, vn = k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)
        if c > 0:
            kn = torch.cat([k_cache[p.row, :, :c], kn], dim=1)
            vn = torch.cat([v_cache[p.row, :, :c], vn], dim=1)
    # 4-d inputs: with 3-d ones CPU SDPA falls back to its slow math kernel
    o = F.scaled_dot_product_attention(qn[None], kn[None], vn[None], attn_mask=p.mask, is_causal=p.causal,
                                       scale=scale, enable_gqa=gqa)
    return o[0].transpose(0, 1)  # [L, H, D]


def packed_attention_torch(
    q, k, v, k_cache, v_cache, cu_seqlens, cache_lens, group_ids,
    cache_rows=None, scale=None, max_seqlen=None, out=None, reach=None,
) -> torch.Tensor:
    """Packed attention with one ``scaled_dot_product_attention`` call per sequence (``torch_plan``
    + ``attend_torch`` after the input checks). Lengths are read on the host (free on CPU)."""
    N, Hkv = _check_args(q, k, v, k_cache, v_cache, cu_seqlens, cache_lens, group_ids, cache_rows, out, reach=reach)
    cu, cached = cu_seqlens.tolist(), cache_lens.tolist()
    rows = cache_rows.tolist() if cache_rows is not None else None
    _check_values(q, k, k_cache, cu, cached, rows, max_seqlen)
    if reach is not None:
        _check_groups(group_ids, cu, reach)
    plan = torch_plan(cu, cached, rows if rows is not None else range(N), group_ids, reach=reach)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if out is None:
        out = torch.empty_like(q)
    return attend_torch(q, k, v, k_cache, v_cache, plan, scale, out)


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------


@triton.jit
def _softmax_tile(acc, m_i, l_i, q, kT, v, visible, qk_scale, DOT_PRECISION: tl.constexpr):
    """One online-softmax step over a key tile.

    q [BM, D], kT [D, BN], v [BN, D], visible [BM, BN]. Scores live in the log2 domain
    (qk_scale = scale * log2 e) so exp2 can be used. m_i starts at a finite -1e30, not -inf:
    a row that sees nothing in this tile then gets p = 0 and alpha = 1 instead of NaN.
    """
    s = tl.dot(q, kT, input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _packed_attention_kernel(
    Q, K, V, KC, VC, O,
    CU, CACHE_LENS, GROUPS, REACH, ROWS,
    qk_scale, tiles_per_seq, search_steps,
    stride_qt, stride_qh, stride_qd,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcr, stride_kch, stride_kcl, stride_kcd,
    stride_vcr, stride_vch, stride_vcl, stride_vcd,
    stride_ot, stride_oh, stride_od,
    GQA_RATIO: tl.constexpr,       # H // Hkv
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_CACHE: tl.constexpr,       # False: k_cache is None, cache lengths are all 0
    NEW_KV_IN_CACHE: tl.constexpr, # True: k is None, new keys sit at k_cache[row, :, c:c+L]
    HAS_ROWS: tl.constexpr,        # False: sequence n reads cache row n
    HAS_REACH: tl.constexpr,       # True: a new key is visible in its own group or below the query's reach
    UPCAST: tl.constexpr,          # interpreter: compute on fp32 copies of every load
    DOT_PRECISION: tl.constexpr,
):
    """Program (n * tiles_per_seq + m, h): query tile m of sequence n, query head h."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    n = pid // tiles_per_seq
    m0 = (pid % tiles_per_seq) * BLOCK_M
    start = tl.load(CU + n).to(tl.int64)
    L = (tl.load(CU + n + 1) - start).to(tl.int32)
    if m0 >= L:  # the grid is sized for the longest sequence
        return
    hkv = h // GQA_RATIO

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_in = offs_m < L

    q = tl.load(Q + (start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :] * stride_qd,
                mask=q_in[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    # padded query rows take the group of the tile's last query, so they stay well defined
    q_last = tl.minimum(m0 + BLOCK_M, L) - 1
    q_groups = tl.load(GROUPS + start + tl.minimum(offs_m, q_last))
    if HAS_REACH:
        q_reach = tl.load(REACH + start + tl.minimum(offs_m, q_last))
    g_max = tl.load(GROUPS + start + q_last)

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    c = 0
    if HAS_CACHE:
        c = tl.load(CACHE_LENS + n).to(tl.int32)
        row = n.to(tl.int64)
        if HAS_ROWS:
            row = tl.load(ROWS + n).to(tl.int64)
        KC += row * stride_kcr + hkv * stride_kch
        VC += row * stride_vcr + hkv * stride_vch
        # cached keys: visible to every query, only the tail tile needs a mask
        for j0 in range(0, c, BLOCK_N):
            k_in = (j0 + offs_n) < c
            kT = tl.load(KC + (j0 + offs_n)[None, :] * stride_kcl + offs_d[:, None] * stride_kcd,
                         mask=k_in[None, :], other=0.0)
            v = tl.load(VC + (j0 + offs_n)[:, None] * stride_vcl + offs_d[None, :] * stride_vcd,
                        mask=k_in[:, None], other=0.0)
            if UPCAST:
                kT = kT.to(tl.float32)
                v = v.to(tl.float32)
            acc, m_i, l_i = _softmax_tile(acc, m_i, l_i, q, kT, v, k_in[None, :], qk_scale, DOT_PRECISION)

    # New keys. Groups are non-decreasing, so the keys any query of this tile can see are a
    # prefix [0, key_end): key_end is the first index past q_last whose group exceeds g_max.
    # A binary search (scalar loads) finds it; the loop below then never touches a hidden tile.
    lo = q_last + 1
    hi = L
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        g_mid = tl.load(GROUPS + start + tl.minimum(mid, L - 1))
        searching = lo < hi
        hidden = g_mid > g_max
        hi = tl.where(searching & hidden, mid, hi)
        lo = tl.where(searching & ~hidden, mid + 1, lo)
    key_end = lo

    if NEW_KV_IN_CACHE:
        k_base = KC + c.to(tl.int64) * stride_kcl
        v_base = VC + c.to(tl.int64) * stride_vcl
        s_kt, s_kd, s_vt, s_vd = stride_kcl, stride_kcd, stride_vcl, stride_vcd
    else:
        k_base = K + start * stride_kt + hkv * stride_kh
        v_base = V + start * stride_vt + hkv * stride_vh
        s_kt, s_kd, s_vt, s_vd = stride_kt, stride_kd, stride_vt, stride_vd
    for j0 in range(0, key_end, BLOCK_N):
        k_in = (j0 + offs_n) < key_end
        kT = tl.load(k_base + (j0 + offs_n)[None, :] * s_kt + offs_d[:, None] * s_kd,
                     mask=k_in[None, :], other=0.0)
        v = tl.load(v_base + (j0 + offs_n)[:, None] * s_vt + offs_d[None, :] * s_vd,
                    mask=k_in[:, None], other=0.0)
        if UPCAST:
            kT = kT.to(tl.float32)
            v = v.to(tl.float32)
        k_groups = tl.load(GROUPS + start + j0 + offs_n, mask=k_in, other=0)
        if HAS_REACH:
            visible = (k_groups[None, :] == q_groups[:, None]) | (k_groups[None, :] < q_reach[:, None])
        else:
            visible = k_groups[None, :] <= q_groups[:, None]
        visible = visible & k_in[None, :]
        acc, m_i, l_i = _softmax_tile(acc, m_i, l_i, q, kT, v, visible, qk_scale, DOT_PRECISION)

    o = acc / l_i[:, None]  # every query sees itself: l_i > 0
    tl.store(O + (start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :] * stride_od,
             o.to(O.dtype.element_ty), mask=q_in[:, None])


# --------------------------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------------------------


def _tile_config(head_dim: int, max_seqlen: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): untuned defaults for Ampere/Hopper.

    Query tiles never exceed the longest sequence rounded up to a power of two (a verification
    pass has 16 new tokens per sequence: one 16-row tile, not a 128-row one mostly masked).
    fp32 tiles are halved: twice the bytes per element, in shared memory and registers.
    Under the interpreter each program costs the same whatever its tile size, so tiles are kept at
    the minimum dot size (16) to exercise multi-tile paths with short test sequences.
    """
    if interpreting():
        return 16, 16, 1, 1
    wide = dtype == torch.float32
    block_m = min(max(16, triton.next_power_of_2(max_seqlen)), 128 if head_dim <= 64 and not wide else 64)
    block_n = 64 if head_dim <= 128 and not wide else 32
    num_warps = 4 if block_m * head_dim <= 64 * 64 else 8
    return block_m, block_n, num_warps, 2 if head_dim > 128 or wide else 3


def packed_attention_triton(
    q, k, v, k_cache, v_cache, cu_seqlens, cache_lens, group_ids,
    cache_rows=None, scale=None, max_seqlen=None, out=None, reach=None,
    *, block_m: int | None = None, block_n: int | None = None,
) -> torch.Tensor:
    """Packed attention in one Triton launch over grid (N * cdiv(max_seqlen, BLOCK_M), H).

    No device sync when ``max_seqlen`` is given and the tensors are on CUDA (value checks then
    run only with ``D3D_CHECKS=1``). Without ``max_seqlen`` it is computed from cu_seqlens:
    one sync. ``block_m``/``block_n`` override the tile sizes (tests, studies).
    """
    N, Hkv = _check_args(q, k, v, k_cache, v_cache, cu_seqlens, cache_lens, group_ids, cache_rows, out,
                         triton_path=True, reach=reach)
    if not q.is_cuda or _debug_checks():
        cu = cu_seqlens.tolist()
        rows = cache_rows.tolist() if cache_rows is not None else None
        _check_values(q, k, k_cache, cu, cache_lens.tolist(), rows, max_seqlen)
        _check_groups(group_ids, cu, reach)
    T, H, D = q.shape
    out = torch.empty_like(q) if out is None else out
    if T == 0 or N == 0:
        return out
    if max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())  # the one sync
    if max_seqlen <= 0:
        return out
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)

    bm, bn, num_warps, num_stages = _tile_config(D, max_seqlen, q.dtype)
    bm, bn = block_m or bm, block_n or bn
    tiles_per_seq = triton.cdiv(max_seqlen, bm)
    # steps for a binary search over at most max_seqlen keys
    search_steps = max(1, int(max_seqlen).bit_length())

    has_cache = k_cache is not None
    kc = k_cache if has_cache else q.new_empty(1, 1, 1, 1)
    vc = v_cache if has_cache else kc
    kn = k if k is not None else q.new_empty(1, 1, 1)
    vn = v if v is not None else kn
    rows = cache_rows if cache_rows is not None else cu_seqlens  # dummy pointer when unused

    grid = (N * tiles_per_seq, H)
    _packed_attention_kernel[grid](
        q, kn, vn, kc, vc, out,
        cu_seqlens, cache_lens, group_ids, reach if reach is not None else group_ids, rows,
        scale * _LOG2E, tiles_per_seq, search_steps,
        *q.stride(), *kn.stride(), *vn.stride(), *kc.stride(), *vc.stride(), *out.stride(),
        GQA_RATIO=H // Hkv,
        HEAD_DIM=D,
        BLOCK_M=bm,
        BLOCK_N=bn,
        HAS_CACHE=has_cache,
        NEW_KV_IN_CACHE=k is None,
        HAS_ROWS=cache_rows is not None,
        HAS_REACH=reach is not None,
        UPCAST=interpreting(),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    cache_lens: torch.Tensor,
    group_ids: torch.Tensor,
    cache_rows: torch.Tensor | None = None,
    scale: float | None = None,
    max_seqlen: int | None = None,
    out: torch.Tensor | None = None,
    reach: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of packed new tokens to their cached and new keys (see the module docstring).

    Args:
        q: [T, H, D] queries of the new tokens of all N sequences, packed.
        k, v: [T, Hkv, D] new keys/values, or None when the caller already wrote them into
            the cache at ``k_cache[row, :, cache_lens[n] : cache_lens[n] + L_n]``.
        k_cache, v_cache: [R, Hkv, Lmax, D], or None when nothing is cached (k given).
        cu_seqlens: int [N+1], offsets of each sequence's new tokens (0, ..., T).
        cache_lens: int [N], keys cached for sequence n before this pass.
        group_ids: int [T], visibility groups, non-decreasing inside each sequence.
        cache_rows: int [N], the cache row of each sequence (default: row n). Rows may repeat.
        scale: softmax scale, default 1/sqrt(D).
        max_seqlen: host-side bound on new tokens per sequence; saves the Triton path a sync.
        out: optional [T, H, D] output buffer (dtype and device of q).
        reach: optional int [T], ``reach[i] <= group_ids[i]``: query i then sees the new keys of its
            own group and of groups below ``reach[i]`` (sibling blocks; see the module docstring).

    Returns:
        [T, H, D] in q.dtype (``out`` if given).
    """
    fn = packed_attention_triton if use_triton(q) else packed_attention_torch
    return fn(q, k, v, k_cache, v_cache, cu_seqlens, cache_lens, group_ids,
              cache_rows=cache_rows, scale=scale, max_seqlen=max_seqlen, out=out, reach=reach)
