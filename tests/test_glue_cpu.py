"""The fused CPU glue ops (``d3d.kernels.glue_cpu``): close to the float64 loop oracle and to torch,
every row computed as alone, odd shapes and both dtypes, and named errors for what they do not take."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from d3d.kernels import glue_cpu
from d3d.kernels.naive import argmax_reference, rms_norm_reference

pytestmark = pytest.mark.skipif(not glue_cpu.available(), reason=f"glue kernel unavailable: {glue_cpu.why_unavailable()}")


@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                          (torch.bfloat16, torch.float32), (torch.float32, None)])
@pytest.mark.parametrize("shape", [(1, 896), (5, 1536), (3, 7, 64), (2, 17), (4, 1)])
def test_rms_norm_equals_its_oracle_and_torch(dtype, wdtype, shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(*shape, generator=g) * 3).to(dtype)
    w = None if wdtype is None else torch.randn(shape[-1], generator=g).to(wdtype)
    got = glue_cpu.rms_norm(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    ref = rms_norm_reference(x, w, 1e-6)
    tol = 4e-6 if dtype == torch.float32 else 1e-2
    assert (got.double() - ref).abs().max() <= tol * ref.abs().max()
    torch_ref = F.rms_norm(x.float(), (shape[-1],), None if w is None else w.float(), 1e-6).to(dtype)
    assert (got.float() - torch_ref.float()).abs().max() <= 2 * tol * ref.abs().max()


def test_rms_norm_rows_are_computed_alone():
    """A row's result does not depend on the rows beside it (a verification pass and a step agree)."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(13, 1000, generator=g), torch.randn(1000, generator=g)
    full = glue_cpu.rms_norm(x, w, 1e-6)
    for i in range(13):
        assert torch.equal(glue_cpu.rms_norm(x[i:i + 1], w, 1e-6), full[i:i + 1])
    assert torch.equal(glue_cpu.rms_norm(x[::2], w, 1e-6), full[::2])  # non-contiguous input


def test_rms_norm_refuses_what_it_does_not_take():
    with pytest.raises(RuntimeError, match="x must be a CPU fp32 or bf16"):
        glue_cpu.rms_norm(torch.randn(2, 8, dtype=torch.float64), None, 1e-6)
    with pytest.raises(RuntimeError, match=r"weight must be contiguous \[8\]"):
        glue_cpu.rms_norm(torch.randn(2, 8), torch.randn(9), 1e-6)
    with pytest.raises(RuntimeError, match="weight must be contiguous"):
        glue_cpu.rms_norm(torch.randn(2, 8), torch.randn(8, dtype=torch.bfloat16), 1e-6)


def _rope_inputs(T, H, Hkv, D, dtype, seed=0):
    from d3d.model.transformer import rope_tables
    from d3d.model.config import preset
    import dataclasses

    g = torch.Generator().manual_seed(seed)
    cfg = dataclasses.replace(preset("qwen3-tiny"), head_dim=D)
    cos, sin = rope_tables(cfg)
    pos = torch.randint(0, 100, (T,), generator=g)
    qkv = (torch.randn(T, (H + 2 * Hkv) * D, generator=g) * 2).to(dtype)
    rows, slots = torch.randint(0, 3, (T,), generator=g), torch.randperm(20, generator=g)[:T]
    return qkv, cos[pos].contiguous(), sin[pos].contiguous(), rows, slots


@pytest.mark.parametrize("T,H,Hkv,D,dtype", [(1, 14, 2, 64, torch.float32), (8, 12, 2, 128, torch.float32),
                                             (5, 4, 4, 6, torch.bfloat16), (3, 6, 2, 10, torch.float32)])
def test_rope_write_is_the_torch_path_bit_for_bit(T, H, Hkv, D, dtype):
    """q, and k and v in the cache, are exactly what apply_rope and two cache writes give, and the oracle's."""
    from d3d.kernels.naive import rope_write_reference
    from d3d.model.transformer import apply_rope

    qkv, cos, sin, rows, slots = _rope_inputs(T, H, Hkv, D, dtype)
    kc, vc = torch.zeros(3, Hkv, 20, D), torch.zeros(3, Hkv, 20, D)
    q = glue_cpu.rope_write(qkv, cos, sin, kc, vc, rows, slots, H, Hkv)
    rot = apply_rope(qkv[:, :(H + Hkv) * D].unflatten(-1, (H + Hkv, D)), cos[:, None], sin[:, None], torch.float32)
    assert torch.equal(q, rot[:, :H])
    v = qkv[:, (H + Hkv) * D:].float().view(T, Hkv, D)
    for t in range(T):
        assert torch.equal(kc[rows[t], :, slots[t]], rot[t, H:]) and torch.equal(vc[rows[t], :, slots[t]], v[t])
    kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(vc)
    assert torch.equal(rope_write_reference(qkv, cos, sin, kc2, vc2, rows, slots, H, Hkv), q)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)


def test_rope_write_refuses_what_it_does_not_take():
    qkv, cos, sin, rows, slots = _rope_inputs(2, 4, 2, 8, torch.float32)
    kc = vc = torch.zeros(3, 2, 20, 8)
    with pytest.raises(RuntimeError, match=r"qkv must be contiguous fp32 or bf16 \[2, 64\]"):
        glue_cpu.rope_write(qkv[:, :60], cos, sin, kc, vc, rows, slots, 4, 2)
    with pytest.raises(RuntimeError, match="the caches must be contiguous fp32"):
        glue_cpu.rope_write(qkv, cos, sin, kc.bfloat16(), vc.bfloat16(), rows, slots, 4, 2)
    with pytest.raises(RuntimeError, match="token 1 goes to row 0 slot 20 of a cache of 3 rows of 20"):
        glue_cpu.rope_write(qkv, cos, sin, kc, vc, torch.tensor([0, 0]), torch.tensor([0, 20]), 4, 2)
    with pytest.raises(RuntimeError, match="cos and sin must be contiguous fp32"):
        glue_cpu.rope_write(qkv, cos.double(), sin, kc, vc, rows, slots, 4, 2)


def test_a_qwen2_pass_is_the_same_with_and_without_the_fused_ops(monkeypatch):
    """A Qwen2-shaped model (no QK norms, q/k/v biases): prefill and a verification pass give the same
    logits and cache through rope_write as through the torch path."""
    import dataclasses

    from d3d.model.config import preset
    from d3d.model.transformer import Attention, Transformer

    torch.manual_seed(0)
    cfg = dataclasses.replace(preset("qwen3-tiny"), qk_norm=False, attention_bias=True)
    model = Transformer(cfg).eval().requires_grad_(False)
    ids, more = torch.randint(0, cfg.vocab_size, (2, 11)), torch.randint(0, cfg.vocab_size, (2, 5))

    def run():
        cache = model.new_cache(2, 32)
        with torch.no_grad():
            return model(ids, cache=cache), model(more, cache=cache), cache.k[0].clone(), cache.v[-1].clone()

    with torch.no_grad():
        assert all(layer.self_attn.fused_rope_write(torch.zeros(2, cfg.hidden_size), torch.zeros(1))
                   for layer in model.layers)
    fused = run()
    monkeypatch.setattr(Attention, "fused_rope_write", lambda self, x, k: False)
    for a, b in zip(fused, run()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(1, 151936), (9, 16384), (3, 1), (2, 7), (4, 33), (2, 3, 65)])
def test_argmax_equals_its_oracle_and_torch(shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g)
    got = glue_cpu.argmax(x)
    assert got.dtype == torch.int64 and got.shape == x.shape[:-1]
    assert torch.equal(got, x.argmax(-1))
    if x.numel() < 20_000:
        assert torch.equal(got, argmax_reference(x))


def test_argmax_takes_the_first_of_ties_and_of_nans_as_torch_does():
    n = 100
    x = torch.zeros(8, n)
    x[0, [5, 40, 99]] = 3.0  # ties: the first
    x[1, [37, 38]] = float("inf")
    x[2] = float("-inf")  # all -inf: index 0
    x[3, 70], x[3, 90], x[3, 10] = float("nan"), float("nan"), 5.0  # a NaN counts as the maximum, the first one
    x[4, 2] = float("nan")  # in the vector part, before the maximum
    x[5, 99] = float("nan")  # in the scalar tail
    x[6, 64], x[6, 0] = -0.0, -1.0  # zeros of both signs tie: the first
    x[6] = x[6] - 1.0
    x[6, [3, 64]] = torch.tensor([-0.0, 0.0])
    x[7, 97] = 1e-30  # the maximum in the scalar tail
    got = glue_cpu.argmax(x)
    assert torch.equal(got, x.argmax(-1)), (got, x.argmax(-1))
    assert torch.equal(got, argmax_reference(x))
    assert got.tolist()[:6] == [5, 37, 0, 70, 2, 99]


def test_argmax_every_row_as_alone_and_named_errors():
    x = torch.randn(13, 1000, generator=torch.Generator().manual_seed(3))
    full = glue_cpu.argmax(x)
    assert all(glue_cpu.argmax(x[i : i + 1]).item() == full[i].item() for i in range(13))
    assert torch.equal(glue_cpu.argmax(x[:, ::2]), x[:, ::2].argmax(-1))  # not contiguous
    assert torch.equal(glue_cpu.argmax(x.double()), x.double().argmax(-1))  # not fp32: torch's
    with pytest.raises(RuntimeError, match="glue_cpu.argmax"):
        glue_cpu._module().argmax(x.to(torch.bfloat16))
