"""The CPU decoding attention (``d3d.kernels.attention_cpu``): close to the float64 loop oracle and to
SDPA, and row-invariant bit for bit: a query's output is what a one-token step over the same keys
gives, whatever else shares the pass or which keys a mask hides (leaves, sibling blocks)."""

from __future__ import annotations

import pytest
import torch

from d3d.hardware import cpu_flags
from d3d.kernels import attention_cpu as ac
from d3d.kernels.attention import packed_attention_torch
from d3d.kernels.naive import packed_attention_reference

pytestmark = pytest.mark.skipif(not ac.available(), reason=f"CPU attention kernel unavailable: {ac.why_unavailable()}")
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def cache(R, Hkv, Lmax, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(R, Hkv, Lmax, D, generator=g).to(dtype), (3 * torch.randn(R, Hkv, Lmax, D, generator=g)).to(dtype))


def packed(lens, cached):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return cu, torch.cat([torch.arange(c, c + n) for c, n in zip(cached, lens)]).int()


def step(q_row, kc, vc, row, keys, D):
    """The one-token decoding step of query ``q_row`` [H, D] over the first ``keys`` keys of ``row``."""
    plan = ac.cpu_plan([0, 1], [keys - 1], [row], torch.tensor([keys - 1]))
    return ac.attend_cpu(q_row[None], kc, vc, plan, D ** -0.5)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,Hkv,D", [(14, 2, 64), (4, 4, 8), (6, 2, 128), (16, 1, 24)])
def test_equals_oracle_and_each_row_is_its_own_step(dtype, H, Hkv, D):
    lens, cached, rows = [5, 1, 9, 3], [100, 37, 0, 13], [2, 0, 1, 3]
    kc, vc = cache(4, Hkv, 160, D, dtype)
    cu, g = packed(lens, cached)
    q = torch.randn(cu[-1], H, D, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = ac.attend_cpu(q, kc, vc, ac.cpu_plan(cu, cached, rows, g), D ** -0.5)
    assert out.dtype == dtype and out.shape == q.shape
    ref = packed_attention_reference(q, None, None, kc, vc, torch.tensor(cu), torch.tensor(cached), g,
                                     torch.tensor(rows))
    assert (out.double() - ref).abs().max() <= TOL[dtype] * ref.abs().max()
    sdpa = packed_attention_torch(q, None, None, kc, vc, torch.tensor(cu).int(), torch.tensor(cached).int(), g,
                                  torch.tensor(rows).int())
    assert (out.float() - sdpa.float()).abs().max() <= 2 * TOL[dtype] * ref.abs().max()
    for n, (c, L) in enumerate(zip(cached, lens)):
        for i in range(L):
            t = cu[n] + i
            assert torch.equal(step(q[t], kc, vc, rows[n], c + i + 1, D), out[t]), (n, i)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_masked_key_is_as_if_absent(dtype):
    """A leaf (a query whose mask hides some of the run's keys) equals a step over the visible keys
    laid out contiguously: what the leaf's token sees once its prefix is committed."""
    H, Hkv, D, c = 8, 2, 32, 40
    kc, vc = cache(1, Hkv, 64, D, dtype, seed=3)
    # a run d0..d5 then two leaves after d2 and after d5: groups 40..45, then 46 (reach 43) and 47 (reach 46)
    g = torch.tensor([40, 41, 42, 43, 44, 45, 46, 47]).int()
    reach = torch.tensor([40, 41, 42, 43, 44, 45, 43, 46]).int()
    q = torch.randn(8, H, D, generator=torch.Generator().manual_seed(4)).to(dtype)
    out = ac.attend_cpu(q, kc, vc, ac.cpu_plan([0, 8], [c], [0], g, reach), D ** -0.5)
    for leaf, prefix in ((6, 3), (7, 6)):
        keys = list(range(c + prefix)) + [c + leaf]  # the cache, the run's first `prefix` tokens, the leaf itself
        k2, v2 = kc[:, :, keys].contiguous(), vc[:, :, keys].contiguous()
        assert torch.equal(step(q[leaf], k2, v2, 0, len(keys), D), out[leaf]), leaf


def test_pass_of_many_rows_and_sequences_is_row_invariant():
    """Every query of a 3-sequence pass equals the same query in a pass of its sequence alone, and in a
    pass where the sequences come in another order."""
    H, Hkv, D = 4, 2, 16
    kc, vc = cache(3, Hkv, 80, D, torch.bfloat16, seed=5)
    lens, cached, rows = [4, 7, 2], [10, 20, 30], [0, 1, 2]
    cu, g = packed(lens, cached)
    q = torch.randn(cu[-1], H, D, generator=torch.Generator().manual_seed(6)).bfloat16()
    out = ac.attend_cpu(q, kc, vc, ac.cpu_plan(cu, cached, rows, g), D ** -0.5)
    for n in range(3):
        s, e = cu[n], cu[n + 1]
        alone = ac.attend_cpu(q[s:e], kc, vc, ac.cpu_plan([0, e - s], [cached[n]], [rows[n]], g[s:e]), D ** -0.5)
        assert torch.equal(alone, out[s:e]), n
    order = [2, 0, 1]
    q2 = torch.cat([q[cu[n]:cu[n + 1]] for n in order])
    cu2, g2 = packed([lens[n] for n in order], [cached[n] for n in order])
    out2 = ac.attend_cpu(q2, kc, vc, ac.cpu_plan(cu2, [cached[n] for n in order], [rows[n] for n in order], g2),
                         D ** -0.5)
    assert torch.equal(out2, torch.cat([out[cu[n]:cu[n + 1]] for n in order]))


needs_avx512 = pytest.mark.skipif(not {"avx512f", "avx512dq", "avx512vl", "avx512bw"} <= cpu_flags(),
                                  reason="the AVX-512 path needs avx512f/dq/vl/bw")


@needs_avx512
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,Hkv,D", [(14, 2, 64), (12, 2, 128), (7, 7, 24), (16, 1, 40), (3, 1, 8), (6, 3, 256)])
def test_avx512_gives_the_avx2_bits(kv_dtype, H, Hkv, D):
    """The AVX-512 path (heads in pairs, 16 dims a register) computes the AVX2 path's sums in its order:
    odd head counts, head dims that are not a multiple of 16, keys not a multiple of 8, a mask, bf16."""
    q_dtype = torch.bfloat16 if kv_dtype == torch.bfloat16 and D == 40 else torch.float32
    lens, cached, rows = [5, 1, 3], [61, 0, 13], [1, 0, 2]
    kc, vc = cache(3, Hkv, 80, D, kv_dtype, seed=D)
    cu, g = packed(lens, cached)
    reach = torch.tensor([61, 62, 63, 64, 62, 0, 13, 14, 15]).int()
    q = torch.randn(cu[-1], H, D, generator=torch.Generator().manual_seed(H)).to(q_dtype)
    plan = ac.cpu_plan(cu, cached, rows, g, reach)
    wide = ac.attend_cpu(q, kc, vc, plan, D ** -0.5, isa="avx512")
    assert torch.equal(wide, ac.attend_cpu(q, kc, vc, plan, D ** -0.5, isa="avx2"))


def test_isa_is_named():
    with pytest.raises(ValueError, match="isa='sse'"):
        ac.attend_cpu(torch.zeros(1, 1, 8), torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8),
                      ac.cpu_plan([0, 1], [2], [0], torch.tensor([2])), 1.0, isa="sse")


def test_far_below_the_max_scores_weigh_zero():
    """Scores 100+ below the max: exp underflows to 0 (no NaN, no inf), the output is the top key's value."""
    kc = torch.zeros(1, 1, 8, 8)
    vc = torch.arange(64.).view(1, 1, 8, 8)
    kc[0, 0, 3] = 40.0
    q = torch.ones(1, 1, 8)
    out = ac.attend_cpu(q, kc, vc, ac.cpu_plan([0, 1], [7], [0], torch.tensor([7])), 1.0)
    assert torch.equal(out[0, 0], vc[0, 0, 3])


@pytest.mark.parametrize("case,match", [
    ("odd_head_dim", "head dim 12"),
    ("row_out_of_range", "query 0: row 5"),
    ("too_many_keys", "query 0: row 0, 99 keys"),
    ("int_q", "q must be a contiguous fp32 or bf16"),
])
def test_bad_inputs_are_named(case, match):
    module = ac._load()[0]
    D = 12 if case == "odd_head_dim" else 8
    q = torch.zeros(1, 2, D, dtype=torch.int32 if case == "int_q" else torch.float32)
    kc = torch.zeros(1, 1, 16, D)
    rows = torch.tensor([5 if case == "row_out_of_range" else 0])
    nkeys = torch.tensor([99 if case == "too_many_keys" else 4])
    with pytest.raises(RuntimeError, match=match):
        module.attend(q, kc, kc, rows, nkeys, torch.tensor([3]), torch.ones(1, 1, dtype=torch.bool), 1.0)


def test_shapes_the_kernel_cannot_take_stay_on_sdpa():
    """A head dim that is not a multiple of 8 (or over 256), or more than 16 query heads per kv head:
    the model attends with SDPA and does not claim row invariance (test_drafter runs such a model)."""
    from d3d.model.config import ModelConfig

    assert ac.fits(64, 14, 2) and ac.fits(128, 12, 2)
    assert not ac.fits(12, 4, 2) and not ac.fits(264, 4, 2) and not ac.fits(64, 34, 2)
    odd = ModelConfig(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64)
    assert not ac.row_invariant(torch.device("cpu"), odd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,Hkv,D", [(14, 2, 64), (12, 2, 128), (6, 3, 40), (16, 1, 24)])
def test_blocks_of_keys_give_each_rows_own_step(dtype, H, Hkv, D):
    """Keys are taken a block at a time for all the rows of a sequence: whatever the block (8 keys, an odd
    count, one block for all), the ISA, or how the rows are split among threads (one sequence, one kv head),
    each row is its own one-token step; leaves see through their masks."""
    lens, cached, rows = [9, 1, 5], [600, 0, 333], [2, 0, 1]
    kc, vc = cache(3, Hkv, 700, D, dtype, seed=7)
    cu, g = packed(lens, cached)
    reach = g.clone()
    reach[7], reach[8] = reach[3], reach[5]  # the first sequence's last two tokens: leaves after d2 and after d4
    q = torch.randn(cu[-1], H, D, generator=torch.Generator().manual_seed(8)).to(dtype)
    plan = ac.cpu_plan(cu, cached, rows, g, reach)
    size = D * kc.element_size()
    outs = [ac.attend_cpu(q, kc, vc, plan, D ** -0.5, isa=isa, block_bytes=b)
            for isa in ("avx2", "auto") for b in (0, 8 * size, 200 * size, 1 << 30)]
    assert all(torch.equal(o, outs[0]) for o in outs)
    out = outs[0]
    for n, (c, L) in enumerate(zip(cached, lens)):
        for i in range(L if n else 7):
            assert torch.equal(step(q[cu[n] + i], kc, vc, rows[n], c + i + 1, D), out[cu[n] + i]), (n, i)
    for leaf, prefix in ((7, 3), (8, 5)):
        keys = list(range(cached[0] + prefix)) + [cached[0] + leaf]
        k2, v2 = kc[2:3, :, keys].contiguous(), vc[2:3, :, keys].contiguous()
        assert torch.equal(step(q[leaf], k2, v2, 0, len(keys), D), out[leaf]), leaf
    alone = ac.attend_cpu(q[:9], kc, vc, ac.cpu_plan([0, 9], [600], [2], g[:9], reach[:9]), D ** -0.5)
    assert torch.equal(alone, out[:9])  # one sequence: its rows split among the threads
    with pytest.raises(RuntimeError, match="block_bytes=-1"):
        ac.attend_cpu(q, kc, vc, plan, D ** -0.5, block_bytes=-1)
