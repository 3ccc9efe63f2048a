"""Prepacked CPU matmuls (d3d.cpu.linear) and the CPU RMSNorm path: same results as the plain ops,
stale copies never used, autograd untouched."""

import pytest
import torch
import torch.nn.functional as F

from d3d.cpu import linear as cpu_linear
from d3d.model.transformer import rms_norm

needs_onednn = pytest.mark.skipif(not cpu_linear.available(), reason="this torch build has no oneDNN packing ops")


@needs_onednn
@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 0.0), (torch.float32, 1e-5)], ids=["bf16", "fp32"])
@pytest.mark.parametrize("M", [1, 3, 16, 37])
def test_packed_linear_matches_f_linear(dtype, tol, M):
    w = torch.randn(96, 40).to(dtype)
    b = torch.randn(96).to(dtype)
    x = torch.randn(2, M, 40).to(dtype)
    # bf16 packing needs avx512bw/vl/dq or avx_ne_convert: elsewhere pack declines and linear is F.linear
    assert cpu_linear.pack(w) == cpu_linear.packs(dtype)
    with torch.inference_mode():
        got = cpu_linear.linear(x, w, b)
    ref = F.linear(x, w, b)
    assert got.shape == ref.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)  # bf16: bit-identical


@needs_onednn
def test_packing_fp32_works_everywhere_and_bf16_where_the_cpu_has_it():
    """fp32 packs on every x86 CPU oneDNN supports; bf16 is probed, not assumed (AVX2-only CPUs refuse it)."""
    from d3d.hardware import cpu_flags

    assert cpu_linear.packs(torch.float32) and not cpu_linear.packs(torch.float16)
    flags = set(cpu_flags())
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        assert cpu_linear.packs(torch.bfloat16)


@needs_onednn
def test_in_place_update_repacks():
    w = torch.randn(32, 16)
    x = torch.randn(4, 16)
    cpu_linear.pack(w)
    with torch.no_grad():
        w.mul_(-2.0)  # e.g. an optimizer step or a load into the same tensor
        got = cpu_linear.linear(x, w)
    torch.testing.assert_close(got, F.linear(x, w), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_autograd_uses_the_plain_weight():
    w = torch.randn(8, 4, requires_grad=True)
    cpu_linear.pack(w)
    x = torch.randn(3, 4)
    cpu_linear.linear(x, w).sum().backward()
    torch.testing.assert_close(w.grad, x.sum(0).expand(8, 4))


def test_what_is_never_packed():
    assert not cpu_linear.pack(torch.randn(4, 4, dtype=torch.float64))
    assert not cpu_linear.pack(torch.randn(4))
    x = torch.randn(2, 4, dtype=torch.float64)
    w = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(cpu_linear.linear(x, w), F.linear(x, w))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 8e-3)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 384), (5, 3, 64), (2, 7)])
def test_cpu_rms_norm_matches_f_rms_norm(dtype, tol, shape):
    x = (torch.randn(*shape) * 3).to(dtype)
    w = torch.randn(shape[-1]).to(dtype)
    ref = F.rms_norm(x.float(), (shape[-1],), w.float(), 1e-6)
    with torch.inference_mode():
        got = rms_norm(x, w, 1e-6)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), ref, atol=tol * 4, rtol=tol)
        torch.testing.assert_close(rms_norm(x, None, 1e-6).float(), F.rms_norm(x.float(), (shape[-1],), None, 1e-6),
                                   atol=tol * 4, rtol=tol)
    with torch.no_grad():
        w.mul_(2)  # the cached [w, 0] padding must follow in-place updates
    with torch.inference_mode():
        torch.testing.assert_close(rms_norm(x, w, 1e-6).float(), ref * 2, atol=tol * 8, rtol=tol)
