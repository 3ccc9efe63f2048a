"""The fused CPU glue ops (``d3d.kernels.glue_cpu``): close to the float64 loop oracle and to torch,
every row computed as alone, odd shapes and both dtypes, and named errors for what they do not take."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from d3d.kernels import glue_cpu
from d3d.kernels.naive import rms_norm_reference

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
