"""Kernel backend choice.

Every kernel in this package has two implementations: a hand-written Triton kernel and a plain
torch path. The torch path is the production path on CPU (it must be fast there); the Triton
kernel is the production path on CUDA. The choice is made once per call from the device of the
inputs, with one override for tests and studies:

    D3D_KERNELS=auto    (default) Triton for CUDA tensors, torch otherwise
    D3D_KERNELS=torch   always the torch path
    D3D_KERNELS=triton  always the Triton kernel; on a CPU this needs TRITON_INTERPRET=1 set
                        before the kernel modules are imported (tests/conftest.py does that)

Triton itself is optional (pyproject installs it on Linux only): without it the kernel modules
still import (``triton``/``tl`` below are stand-ins whose kernels refuse to launch), the torch
paths serve every device, and asking for the Triton path says what is missing.
"""

from __future__ import annotations

import torch

from .. import env

NO_TRITON = ("Triton is not installed (pip install triton; Linux only): the Triton kernels are unavailable, "
             "the torch paths (D3D_KERNELS=torch, the default without Triton) need none")


class _Unavailable:
    """A kernel defined without Triton: launching it (``kernel[grid](...)``) raises."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        raise RuntimeError(f"{NO_TRITON} (kernel {self.fn.__name__})")


class _NoTriton:
    """Stands in for ``triton`` and ``triton.language`` so that kernel modules import without
    Triton: ``jit`` keeps the function (its body never runs), the two launch-size helpers work."""

    @staticmethod
    def jit(fn=None, **_):
        return _Unavailable(fn) if fn is not None else _Unavailable

    @staticmethod
    def next_power_of_2(n: int) -> int:
        return 1 << max(0, int(n) - 1).bit_length()

    @staticmethod
    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    def __getattr__(self, name):
        raise RuntimeError(f"{NO_TRITON} (triton.{name})")


try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:
    triton = tl = _NoTriton()
    HAVE_TRITON = False


def backend() -> str:
    """The override from the environment, validated."""
    return env.read("D3D_KERNELS")


def interpreting() -> bool:
    """True when Triton kernels run in the interpreter (CPU tensors allowed)."""
    return env.read("TRITON_INTERPRET")


def use_triton(t: torch.Tensor) -> bool:
    """Whether a kernel called on tensor ``t`` should take its Triton path."""
    choice = backend()
    if choice == "torch":
        return False
    if choice == "triton":
        if not HAVE_TRITON:
            raise RuntimeError(f"D3D_KERNELS=triton: {NO_TRITON}")
        if not t.is_cuda and not interpreting():
            raise RuntimeError(
                "D3D_KERNELS=triton on CPU tensors needs TRITON_INTERPRET=1 set before "
                "d3d.kernels modules are imported"
            )
        return True
    return t.is_cuda and HAVE_TRITON
