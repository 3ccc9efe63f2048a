"""The fp32 panel matmul (d3d.kernels.skinny): the fma chain it documents, bit for bit; row invariance
for every row count and thread count; odd shapes; named errors; how d3d.cpu.linear picks it."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from d3d.cpu import linear as cpu_linear
from d3d.kernels import skinny
from d3d.kernels.naive import skinny_matmul_reference

needs_kernel = pytest.mark.skipif(not skinny.available(),
                                  reason=f"panel matmul unavailable: {skinny.why_unavailable()}")


def test_builds_where_the_cpu_and_a_compiler_allow():
    """Not a silent skip: on an AVX2+FMA CPU with a C++ compiler the kernel must build."""
    if {"avx2", "fma"} <= skinny.cpu_flags() and shutil.which("c++") and shutil.which("ninja"):
        assert skinny.available(), skinny.why_unavailable()
    else:
        assert not skinny.available() and skinny.why_unavailable()


@needs_kernel
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (3, 17, 5), (7, 33, 300), (13, 16, 257), (2, 50, 513), (6, 48, 64)])
def test_equals_the_fma_chain_bit_for_bit(M, N, K):
    """K = 257, 300, 513 cross the kernel's 256-wide k blocks: the blocking must not change the chain."""
    g = torch.Generator().manual_seed(M * 1000 + N * 10 + K)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    got = skinny.matmul(x, skinny.pack(w), N)
    assert got.shape == (M, N) and got.dtype == torch.float32
    assert torch.equal(got, skinny_matmul_reference(x, w))
    torch.testing.assert_close(got.double(), x.double() @ w.double().T, atol=1e-4 * K ** 0.5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("N,K", [(37, 19), (96, 896), (200, 600)])
def test_every_row_count_rounds_each_row_alike(N, K):
    g = torch.Generator().manual_seed(N + K)
    x, w = torch.randn(20, K, generator=g), torch.randn(N, K, generator=g)
    panels = skinny.pack(w)
    full = skinny.matmul(x, panels, N)
    for M in range(1, 21):
        assert torch.equal(skinny.matmul(x[:M], panels, N), full[:M]), M
    for i in range(20):
        assert torch.equal(skinny.matmul(x[i:i + 1], panels, N), full[i:i + 1]), i
    perm = torch.randperm(20, generator=g)
    assert torch.equal(skinny.matmul(x[perm], panels, N), full[perm])


@needs_kernel
def test_thread_count_does_not_change_a_bit():
    x, w = torch.randn(9, 128), torch.randn(300, 128)
    panels = skinny.pack(w)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = skinny.matmul(x, panels, 300)
        torch.set_num_threads(2)
        two = skinny.matmul(x, panels, 300)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


@needs_kernel
def test_zero_rows_and_non_contiguous_input():
    w = torch.randn(24, 10)
    panels = skinny.pack(w)
    assert skinny.matmul(torch.randn(0, 10), panels, 24).shape == (0, 24)
    assert torch.equal(skinny.matmul(torch.randn(3, 0), skinny.pack(torch.randn(24, 0)), 24), torch.zeros(3, 24))
    x = torch.randn(10, 5).T  # [5, 10], not contiguous
    assert torch.equal(skinny.matmul(x, panels, 24), skinny.matmul(x.contiguous(), panels, 24))


@needs_kernel
def test_bad_arguments_are_named():
    w = torch.randn(20, 8)
    panels = skinny.pack(w)
    with pytest.raises(ValueError, match="x must be a 2-D fp32"):
        skinny.matmul(torch.randn(2, 8, dtype=torch.float64), panels, 20)
    with pytest.raises(ValueError, match="does not fit panels"):
        skinny.matmul(torch.randn(2, 9), panels, 20)
    with pytest.raises(ValueError, match="n=40 does not fit 2 panels"):
        skinny.matmul(torch.randn(2, 8), panels, 40)
    with pytest.raises(ValueError, match="weight must be a 2-D fp32"):
        skinny.pack(w.bfloat16())
    shifted = torch.cat([torch.zeros(1), panels.flatten()])[1:].view(panels.shape)  # 4 bytes off alignment
    with pytest.raises(RuntimeError, match="32-byte aligned"):
        skinny.matmul(torch.randn(2, 8), shifted, 20)


def test_choice_follows_d3d_cpu_matmul(monkeypatch):
    monkeypatch.setenv("D3D_CPU_MATMUL", "onednn")
    assert not skinny.wanted()
    monkeypatch.setenv("D3D_CPU_MATMUL", "fast")
    with pytest.raises(ValueError, match="D3D_CPU_MATMUL='fast'"):
        skinny.wanted()
    monkeypatch.setenv("D3D_CPU_MATMUL", "panels")
    assert skinny.wanted() == skinny.available()


@needs_kernel
@pytest.mark.parametrize("choice,kind", [("panels", cpu_linear.PanelWeight), ("onednn", cpu_linear.PackedWeight)])
def test_cpu_linear_packs_fp32_as_chosen(monkeypatch, choice, kind):
    monkeypatch.setenv("D3D_CPU_MATMUL", choice)
    if kind is cpu_linear.PackedWeight and not cpu_linear.available():
        pytest.skip("this torch build has no oneDNN packing ops")
    w, b = torch.randn(40, 24), torch.randn(40)
    assert cpu_linear.pack(w)
    assert isinstance(getattr(w, cpu_linear.ATTR), kind)
    x = torch.randn(2, 3, 24)
    with torch.inference_mode():
        got = cpu_linear.linear(x, w, b)
    assert got.shape == (2, 3, 40)
    torch.testing.assert_close(got, F.linear(x, w, b), atol=1e-5, rtol=1e-5)
    if kind is cpu_linear.PanelWeight:
        assert torch.equal(got, (skinny_matmul_reference(x.reshape(6, 24), w) + b).view(2, 3, 40))


def test_without_the_kernel_onednn_stays(monkeypatch):
    """A CPU or machine that cannot build the kernel: a warning that says why, and oneDNN's copy."""
    if not cpu_linear.available():
        pytest.skip("this torch build has no oneDNN packing ops")
    monkeypatch.setattr(skinny, "_load", lambda: (None, "this CPU lacks avx2"))
    monkeypatch.setenv("D3D_CPU_MATMUL", "panels")
    skinny._wanted.cache_clear()
    try:
        w = torch.randn(16, 8)
        with pytest.warns(UserWarning, match="unavailable \\(this CPU lacks avx2\\); using oneDNN"):
            assert cpu_linear.pack(w)
        assert isinstance(getattr(w, cpu_linear.ATTR), cpu_linear.PackedWeight)
    finally:
        skinny._wanted.cache_clear()
