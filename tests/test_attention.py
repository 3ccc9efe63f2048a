"""Block-causal packed attention: both paths against the float64 loop oracle.

The Triton path is forced with D3D_KERNELS=triton; without a GPU it runs in the interpreter
(tests/conftest.py sets TRITON_INTERPRET=1), so shapes stay small. Every call writes into a
NaN-filled ``out`` and every cache slot outside the valid keys holds NaN, so an output element
left unwritten or a key read out of range shows up as NaN.
"""

from __future__ import annotations

import math

import pytest
import torch

from d3d.kernels import attention as attn
from d3d.kernels.attention import (
    bd3_training_mask,
    block_causal_groups,
    causal_groups,
    cu_seqlens_from_lengths,
    packed_attention,
)
from d3d.kernels.naive import bd3_training_mask_reference, packed_attention_reference

BACKENDS = ["torch", "triton"]
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}

pytestmark = pytest.mark.usefixtures("kernel_device")  # GPU when present: tests/conftest.py


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv("D3D_KERNELS", request.param)
    return request.param


def groups_of(spec):
    """spec = (n_clean, block_size, n_blocks, cache_len); block_size 0 means plain causal."""
    n_clean, block_size, n_blocks, _ = spec
    if block_size == 0:
        return causal_groups(n_clean)
    return block_causal_groups(n_clean, block_size, n_blocks)


def make_case(specs, H=4, Hkv=2, D=16, dtype=torch.float32, new_kv_in_cache=False, cache_rows=None):
    """Random inputs for sequences described by ``specs``; returns (kwargs, reference).

    The reference is always computed with k given, so the k-is-None mode is checked against
    an independent layout of the same keys.
    """
    groups = [groups_of(s) for s in specs]
    lens = [len(g) for g in groups]
    cache_lens = [s[3] for s in specs]
    N, T = len(specs), sum(lens)
    rows = list(range(N)) if cache_rows is None else cache_rows
    R = max(rows) + 1
    Lmax = max(c + L for c, L in zip(cache_lens, lens)) + 3
    cu = cu_seqlens_from_lengths(lens)

    def rand(*shape):
        return torch.randn(*shape).to(dtype)

    q, k, v = rand(T, H, D), rand(T, Hkv, D), rand(T, Hkv, D)
    k_cache = torch.full((R, Hkv, Lmax, D), math.nan, dtype=dtype)
    v_cache = torch.full((R, Hkv, Lmax, D), math.nan, dtype=dtype)
    for n in range(N):
        k_cache[rows[n], :, : cache_lens[n]] = rand(Hkv, cache_lens[n], D)
        v_cache[rows[n], :, : cache_lens[n]] = rand(Hkv, cache_lens[n], D)
    args = dict(
        q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, cu_seqlens=cu,
        cache_lens=torch.tensor(cache_lens), group_ids=torch.cat(groups).to(torch.int64),
        cache_rows=None if cache_rows is None else torch.tensor(cache_rows, dtype=torch.int32),
    )
    ref = packed_attention_reference(**args)
    if new_kv_in_cache:
        assert cache_rows is None or len(set(cache_rows)) == len(cache_rows)
        for n in range(N):
            s, e, c = int(cu[n]), int(cu[n + 1]), cache_lens[n]
            k_cache[rows[n], :, c : c + e - s] = k[s:e].transpose(0, 1)
            v_cache[rows[n], :, c : c + e - s] = v[s:e].transpose(0, 1)
        args.update(k=None, v=None)
    return args, ref


def run(args, **extra):
    out = torch.full_like(args["q"], math.nan)
    got = packed_attention(**args, out=out, **extra)
    assert got is out
    return got


def assert_close(got, ref, dtype):
    assert not got.isnan().any(), "NaN in the output: an element was not written or a bad key was read"
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), ref, atol=tol, rtol=tol)


# a mixed packed batch: decode token, causal prefill, block-causal with block sizes 16/4/1
MIXED = [
    (1, 0, 0, 9),     # one new token over 9 cached keys
    (7, 0, 0, 0),     # causal, empty cache (SDPA is_causal on the torch path)
    (1, 16, 2, 5),    # anchor + two bidirectional blocks of 16: 33 new tokens
    (3, 4, 1, 0),     # block-causal, block 4, empty cache
    (0, 1, 5, 3),     # blocks of one token = causal, over a cache
]


# ------------------------------------------------------------------------------ correctness


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("Hkv", [4, 2, 1])
@pytest.mark.parametrize("new_kv_in_cache", [False, True], ids=["k_given", "k_in_cache"])
def test_mixed_batch(backend, dtype, Hkv, new_kv_in_cache):
    args, ref = make_case(MIXED, H=4, Hkv=Hkv, D=16, dtype=dtype, new_kv_in_cache=new_kv_in_cache)
    assert_close(run(args), ref, dtype)


@pytest.mark.parametrize("specs", [
    [(100, 0, 0, 0), (4, 16, 6, 37)],   # long causal prefill; long block-causal over a cache
    [(0, 4, 25, 0), (0, 0, 0, 0), (99, 0, 0, 1)],  # only blocks; an empty sequence; causal
], ids=["causal_and_blocks", "with_empty_sequence"])
def test_long_sequences(backend, specs):
    args, ref = make_case(specs, H=2, Hkv=1, D=32, new_kv_in_cache=True)
    assert_close(run(args, max_seqlen=100), ref, torch.float32)


@pytest.mark.parametrize("D", [64, 128, 256])
def test_head_dims(backend, D):
    args, ref = make_case([(3, 4, 1, 2)], H=2, Hkv=1, D=D)
    assert_close(run(args), ref, torch.float32)


def test_shared_cache_rows(backend):
    # sequences 0 and 1 branch from one cached prefix (row 0) with different new tokens
    specs = [(0, 4, 2, 11), (0, 4, 2, 11), (5, 0, 0, 6)]
    args, ref = make_case(specs, H=4, Hkv=2, D=16, cache_rows=[0, 0, 1])
    assert_close(run(args), ref, torch.float32)


def reach_case(dtype, Hkv=2, D=16, cached=(5, 3)):
    """Two sequences: 7 clean tokens then sibling blocks of 4 branching after 2, 7 and 0 of them
    (reach), and a plain causal run of 5 (reach = groups)."""
    n_clean, blk, branches = 7, 4, [2, 7, 0]
    g0 = list(range(n_clean)) + [n_clean + b for b in range(len(branches)) for _ in range(blk)]
    r0 = list(range(n_clean)) + [branches[b] for b in range(len(branches)) for _ in range(blk)]
    g1 = list(range(5))
    groups, reach = torch.tensor(g0 + g1), torch.tensor(r0 + g1)
    lens = [len(g0), len(g1)]
    T, H = sum(lens), 4
    R, Lmax = 2, max(c + n for c, n in zip(cached, lens)) + 2
    q, k, v = (torch.randn(T, h, D).to(dtype) for h in (H, Hkv, Hkv))
    k_cache = torch.full((R, Hkv, Lmax, D), math.nan, dtype=dtype)
    v_cache = torch.full((R, Hkv, Lmax, D), math.nan, dtype=dtype)
    for n, c in enumerate(cached):
        k_cache[n, :, :c], v_cache[n, :, :c] = torch.randn(Hkv, c, D).to(dtype), torch.randn(Hkv, c, D).to(dtype)
    args = dict(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, cu_seqlens=cu_seqlens_from_lengths(lens),
                cache_lens=torch.tensor(cached), group_ids=groups, reach=reach)
    return args, (n_clean, blk, branches)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("new_kv_in_cache", [False, True], ids=["k_given", "k_in_cache"])
def test_reach_sibling_blocks(backend, dtype, new_kv_in_cache):
    """``reach``: both paths match the loop oracle, and each sibling block equals that block attended
    alone over the cache plus the clean tokens up to its branch point (the meaning of the rule)."""
    args, (n_clean, blk, branches) = reach_case(dtype)
    ref = packed_attention_reference(**args)
    k, v, c0 = args["k"], args["v"], int(args["cache_lens"][0])
    prefix = {name: args[name][0:1].clone() for name in ("k_cache", "v_cache")}  # row 0 before the pass
    if new_kv_in_cache:
        cu, c = args["cu_seqlens"].tolist(), args["cache_lens"].tolist()
        for n in range(2):
            s, e = cu[n], cu[n + 1]
            args["k_cache"][n, :, c[n]:c[n] + e - s] = k[s:e].transpose(0, 1)
            args["v_cache"][n, :, c[n]:c[n] + e - s] = v[s:e].transpose(0, 1)
        args.update(k=None, v=None)
    got = run(args)
    assert_close(got, ref, dtype)
    # block b alone: its queries over row 0's cache + the clean keys before its branch point, then its own
    for b, branch in enumerate(branches):
        s = n_clean + b * blk
        kc, vc = prefix["k_cache"][:, :, :c0 + branch].clone(), prefix["v_cache"][:, :, :c0 + branch].clone()
        kc[0, :, c0:], vc[0, :, c0:] = k[:branch].transpose(0, 1), v[:branch].transpose(0, 1)
        alone = packed_attention_reference(
            q=args["q"][s:s + blk], k=k[s:s + blk], v=v[s:s + blk], k_cache=kc, v_cache=vc,
            cu_seqlens=torch.tensor([0, blk]), cache_lens=torch.tensor([c0 + branch]),
            group_ids=torch.zeros(blk, dtype=torch.int64))
        assert_close(got[s:s + blk], alone, dtype)


def test_reach_above_group_is_rejected(backend):
    args, _ = reach_case(torch.float32)
    args["reach"] = args["group_ids"].clone()
    args["reach"][3] += 1
    with pytest.raises(ValueError, match="reach must be <= group_ids"):
        packed_attention(**args)


def test_no_cache_and_custom_scale(backend):
    args, ref = make_case([(6, 0, 0, 0), (2, 8, 1, 0)], H=4, Hkv=4, D=32)
    args.update(k_cache=None, v_cache=None)
    ref = packed_attention_reference(**args, scale=0.3)
    assert_close(run(args, scale=0.3), ref, torch.float32)


def test_strided_inputs(backend):
    # q/k/v as slices of one fused projection, as the model produces them
    args, ref = make_case(MIXED, H=4, Hkv=2, D=16)
    T = args["q"].shape[0]
    fused = torch.randn(T, 8, 16)
    fused[:, :4], fused[:, 4:6], fused[:, 6:] = args["q"], args["k"], args["v"]
    args.update(q=fused[:, :4], k=fused[:, 4:6], v=fused[:, 6:])
    assert_close(run(args), ref, torch.float32)


def test_without_max_seqlen_hint_and_without_out(backend):
    args, ref = make_case(MIXED[:3], new_kv_in_cache=True)
    got = packed_attention(**args)
    assert got.dtype == args["q"].dtype
    assert_close(got, ref, torch.float32)


def test_triton_stops_at_hidden_key_tiles(monkeypatch):
    """A NaN value in a key tile the layout hides from a query tile must not reach it: the
    kernel stops before that tile (a masked load of a visible tile would multiply 0 * NaN)."""
    monkeypatch.setenv("D3D_KERNELS", "triton")
    args, ref = make_case([(48, 0, 0, 0)], H=2, Hkv=1, D=16)
    args["v"][40] = math.nan
    got = attn.packed_attention_triton(**args, block_m=16, block_n=16)
    torch.testing.assert_close(got[:32].double(), ref[:32], atol=1e-4, rtol=1e-4)
    assert got[40:].isnan().all()


def test_auto_dispatch_on_cpu_uses_torch(monkeypatch):
    monkeypatch.setenv("D3D_KERNELS", "auto")

    def no_triton(*a, **kw):
        raise AssertionError("Triton path taken for CPU tensors under D3D_KERNELS=auto")

    monkeypatch.setattr(attn, "packed_attention_triton", no_triton)
    args, ref = make_case(MIXED)
    assert_close(run(args), ref, torch.float32)


# ------------------------------------------------------------------------------ layouts


def test_group_helpers():
    assert causal_groups(4).tolist() == [0, 1, 2, 3]
    assert block_causal_groups(2, 3, 2).tolist() == [0, 1, 2, 2, 2, 3, 3, 3]
    assert block_causal_groups(0, 4).tolist() == [0, 0, 0, 0]
    assert cu_seqlens_from_lengths([3, 0, 5]).tolist() == [0, 3, 3, 8]
    with pytest.raises(ValueError):
        block_causal_groups(1, 0, 1)


@pytest.mark.parametrize("L,block_size", [(8, 4), (10, 4), (6, 1), (16, 16), (12, 5)])
def test_bd3_training_mask(L, block_size):
    assert torch.equal(bd3_training_mask(L, block_size), bd3_training_mask_reference(L, block_size))


# ------------------------------------------------------------------------------ bad inputs


def _bad(**changes):
    def mutate(a):
        for key, fn in changes.items():
            a[key] = fn(a)
        return a
    return mutate


BAD_INPUTS = {
    "q_not_3d": (_bad(q=lambda a: a["q"][0]), "q must be"),
    "q_int": (_bad(q=lambda a: a["q"].int()), "q dtype"),
    "v_missing": (_bad(v=lambda a: None), "k and v"),
    "v_cache_missing": (_bad(v_cache=lambda a: None), "k_cache and v_cache"),
    "nothing_to_attend": (_bad(k=lambda a: None, v=lambda a: None, k_cache=lambda a: None,
                               v_cache=lambda a: None), "k_cache is None"),
    "k_wrong_tokens": (_bad(k=lambda a: a["k"][1:]), "k shape"),
    "k_dtype": (_bad(k=lambda a: a["k"].double()), "k dtype"),
    "k_device": (_bad(k=lambda a: a["k"].to("meta")), "k is on meta"),
    "v_shape": (_bad(v=lambda a: a["v"][:, :1]), "differs from v shape"),
    "k_cache_3d": (_bad(k_cache=lambda a: a["k_cache"][0]), "k_cache shape"),
    "v_cache_dtype": (_bad(v_cache=lambda a: a["v_cache"].half()), "v_cache dtype"),
    "cache_heads": (_bad(k_cache=lambda a: a["k_cache"][:, :1], v_cache=lambda a: a["v_cache"][:, :1]),
                    "kv heads"),
    "heads_not_divisible": (_bad(q=lambda a: torch.randn(a["q"].shape[0], 3, 16)), "not divisible"),
    "cu_seqlens_float": (_bad(cu_seqlens=lambda a: a["cu_seqlens"].float()), "cu_seqlens must be"),
    "cu_seqlens_device": (_bad(cu_seqlens=lambda a: a["cu_seqlens"].to("meta")), "cu_seqlens is on"),
    "cache_lens_length": (_bad(cache_lens=lambda a: a["cache_lens"][1:]), "cache_lens has"),
    "group_ids_length": (_bad(group_ids=lambda a: a["group_ids"][1:]), "group_ids has"),
    "cache_rows_length": (_bad(cache_rows=lambda a: torch.zeros(7, dtype=torch.int64)), "cache_rows has"),
    "out_dtype": (_bad(out=lambda a: torch.empty_like(a["q"], dtype=torch.float16)), "out dtype"),
    "out_shape": (_bad(out=lambda a: a["q"][1:].clone()), "out shape"),
    "cu_not_from_zero": (_bad(cu_seqlens=lambda a: a["cu_seqlens"] + 1), r"cu_seqlens\[0\]"),
    "cu_decreasing": (_bad(cu_seqlens=lambda a: torch.tensor([0, 5, 3, 20, 40, 53])), "non-decreasing"),
    "cu_last_not_T": (_bad(cu_seqlens=lambda a: torch.tensor([0, 1, 2, 3, 4, 5])), "T = "),
    "max_seqlen_small": (_bad(max_seqlen=lambda a: 2), "max_seqlen"),
    "cache_lens_negative": (_bad(cache_lens=lambda a: a["cache_lens"] - 1), "cache_lens must be >= 0"),
    "cache_lens_without_cache": (_bad(k_cache=lambda a: None, v_cache=lambda a: None),
                                 "all 0 when k_cache is None"),
    "cache_overflow": (_bad(cache_lens=lambda a: a["cache_lens"] + 40), "Lmax"),
    "cache_rows_range": (_bad(cache_rows=lambda a: torch.tensor([0, 1, 2, 3, 5])), "cache_rows must lie"),
    "too_few_rows": (_bad(k_cache=lambda a: a["k_cache"][:4], v_cache=lambda a: a["v_cache"][:4]),
                     "pass cache_rows"),
    "groups_decreasing": (_bad(group_ids=lambda a: a["group_ids"].flip(0)), "group_ids must be non-decreasing"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs(backend, case):
    args, _ = make_case(MIXED, H=4, Hkv=2, D=16)
    args["max_seqlen"] = None
    mutate, message = BAD_INPUTS[case]
    args = mutate(args)
    with pytest.raises(ValueError, match=message):
        packed_attention(**args)


TRITON_ONLY_BAD_INPUTS = {
    "head_dim_not_pow2": (_bad(q=lambda a: a["q"][..., :12], k=lambda a: a["k"][..., :12],
                               v=lambda a: a["v"][..., :12], k_cache=lambda a: a["k_cache"][..., :12],
                               v_cache=lambda a: a["v_cache"][..., :12]), "head_dim 12"),
    "head_dim_too_small": (_bad(q=lambda a: a["q"][..., :8], k=lambda a: a["k"][..., :8],
                                v=lambda a: a["v"][..., :8], k_cache=lambda a: a["k_cache"][..., :8],
                                v_cache=lambda a: a["v_cache"][..., :8]), "head_dim 8"),
}


@pytest.mark.parametrize("case", list(TRITON_ONLY_BAD_INPUTS))
def test_head_dim_limits(backend, case):
    """The Triton kernel needs a power-of-two head_dim in [16, 256]; the torch path takes any."""
    args, ref = make_case(MIXED, H=4, Hkv=2, D=16)
    mutate, message = TRITON_ONLY_BAD_INPUTS[case]
    args = mutate(args)
    if backend == "triton":
        with pytest.raises(ValueError, match=message):
            packed_attention(**args)
    else:
        D = args["q"].shape[-1]
        expected = packed_attention_reference(**{k: args[k] for k in (
            "q", "k", "v", "k_cache", "v_cache", "cu_seqlens", "cache_lens", "group_ids", "cache_rows")})
        assert_close(packed_attention(**args), expected, torch.float32)
        assert D in (8, 12)


def test_cache_overflow_counts_new_tokens_in_cache(backend):
    args, _ = make_case(MIXED, new_kv_in_cache=True)
    args["cache_lens"] = args["cache_lens"] + 4  # fits alone, but not with the new tokens
    with pytest.raises(ValueError, match=r"cache_lens \+ new tokens"):
        packed_attention(**args)


def test_groups_may_restart_between_sequences(backend):
    # every sequence starts its groups at 0: a step down at a sequence boundary is fine
    args, ref = make_case([(5, 0, 0, 0), (2, 4, 1, 1), (3, 0, 0, 2)])
    assert args["group_ids"].tolist()[:7] == [0, 1, 2, 3, 4, 0, 1]
    assert_close(run(args), ref, torch.float32)
