"""Kernel backend choice.

Every kernel in this package has two implementations: a hand-written Triton kernel and a plain
torch path. The torch path is the production path on CPU (it must be fast there); the Triton
kernel is the production path on CUDA. The choice is made once per call from the device of the
inputs, with one override for tests and studies:

    D3D_KERNELS=auto    (default) Triton for CUDA tensors, torch otherwise
    D3D_KERNELS=torch   always the torch path
    D3D_KERNELS=triton  always the Triton kernel; on a CPU this needs TRITON_INTERPRET=1 set
                        before the kernel modules are imported (tests/conftest.py does that)
"""

from __future__ import annotations

import os

import torch

_CHOICES = ("auto", "torch", "triton")


def backend() -> str:
    """The override from the environment, validated."""
    choice = os.environ.get("D3D_KERNELS", "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"D3D_KERNELS={choice!r}: expected one of {', '.join(_CHOICES)}")
    return choice


def interpreting() -> bool:
    """True when Triton kernels run in the interpreter (CPU tensors allowed)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(t: torch.Tensor) -> bool:
    """Whether a kernel called on tensor ``t`` should take its Triton path."""
    choice = backend()
    if choice == "torch":
        return False
    if choice == "triton":
        if not t.is_cuda and not interpreting():
            raise RuntimeError(
                "D3D_KERNELS=triton on CPU tensors needs TRITON_INTERPRET=1 set before "
                "d3d.kernels modules are imported"
            )
        return True
    return t.is_cuda
