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

import pytest  # noqa: E402

# Test shapes are tiny: one intra-op thread is as fast, and it avoids OpenMP spin-wait stalls
# (measured: 8 ms per tiny SDPA call instead of ~30 us) when another process holds the other core.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield
