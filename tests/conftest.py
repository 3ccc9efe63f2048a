"""Test-wide setup.

Triton kernels run in the interpreter when there is no GPU. TRITON_INTERPRET must be set before
any module defining a kernel is imported, so it is set here, first thing.
"""

import os

try:
    import torch

    _cuda = torch.cuda.is_available()
except Exception:  # pragma: no cover - torch missing is a broken install, reported by imports
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Exact token-equality tests (speculative == autoregressive) run in fp32 (docs/design.md §6):
# the dtype policy would pick bf16 on a CPU with fast bf16 matmuls, where a 16-row and a 1-row
# pass may round a near-tie differently. tests/test_precision.py tests the policy itself.
os.environ.setdefault("D3D_DTYPE", "float32")
# ... and with dense weights (the weights policy could pick int8 for a model that outgrows the
# cache); tests/test_quant.py loads quantized models by asking for them.
os.environ.setdefault("D3D_WEIGHTS", "dense")

import pytest  # noqa: E402

# Test shapes are tiny: one intra-op thread is as fast, and it avoids OpenMP spin-wait stalls
# (measured: 8 ms per tiny SDPA call instead of ~30 us) when another process holds the other core.
torch.set_num_threads(1)


@pytest.fixture
def kernel_device():
    """Kernel tests (``pytestmark = pytest.mark.usefixtures("kernel_device")``) build their tensors
    on the GPU when there is one, so the real Triton compiler runs; on the CPU otherwise, where
    TRITON_INTERPRET=1 (above) runs the kernels in the interpreter."""
    if _cuda:
        with torch.device("cuda"):
            yield torch.device("cuda")
    else:
        yield torch.device("cpu")


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield
