"""Prepacked CPU matmuls: weights reordered once into oneDNN's blocked layout.

``F.linear`` hands the CPU library a plain row-major weight on every call, and the library
re-blocks it on the fly. oneDNN can instead keep a weight in its own blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, what torch.compile's CPU backend uses after
freezing) and multiply with it directly (``torch.ops.mkldnn._linear_pointwise``). On the skinny
matmuls of decoding that is faster than ``F.linear`` at 1 and at 16 rows, bit-identical to it in bf16
and within an ulp in fp32 (docs/results.md, "Measurements behind the code"),
and a packed weight gives each row the same result whatever the number of rows M (checked for
M = 1..48 at reduction sizes up to 1024): a 16-token verification pass and 16 one-token steps
round alike, which is what keeps low-precision speculative decoding token-exact.

fp32 on AVX2 CPUs without AVX-512 takes the panels of ``d3d.kernels.skinny`` instead (row-invariant
for every M by construction; ``D3D_CPU_MATMUL=onednn|panels`` overrides): there oneDNN's fp32 kernels
stream weights slowly at 2-8 rows, the rows of a verification pass: the panels' passes of the 0.5B
target cost less at every row count (docs/results/panels/passes.json, ``python -m bench passes
--cpu-matmul panels onednn``).

The packed copy is a second copy of every matrix (the plain weight stays: training, saving, the
embedding lookup and ``d3d.decode.packed`` read it); ``Transformer.pack_for_cpu`` makes it at load time
on CPU. A packed copy is used only without autograd and only while its weight is unchanged
(``_version`` moves on every in-place update; a stale copy is rebuilt on its next use).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..kernels import quant as quant_kernel, skinny

BATCH_HINT = 16  # the layout oneDNN picks for 16 rows was row-count invariant; the one for 1 row was not (fp32)

ATTR = "_d3d_packed"  # the packed copy lives on the weight tensor itself: same lifetime, no registry


def available() -> bool:
    """Whether this torch build has oneDNN with the packing ops."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PanelWeight:
    """``weight`` [out, in] fp32 in the panels of ``d3d.kernels.skinny``: row-invariant for every
    number of rows, and faster than oneDNN at the 2-8 rows of verification passes on AVX2 CPUs."""

    def __init__(self, weight: torch.Tensor):
        self.version = weight._version
        self.out_features = weight.shape[0]
        self.packed = skinny.pack(weight)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = skinny.matmul_packed(x.reshape(-1, x.shape[-1]), self.packed, self.out_features)
        if bias is not None:
            y += bias
        return y.view(*x.shape[:-1], self.out_features)


class PackedWeight:
    """A oneDNN-blocked copy of ``weight`` [out, in] (fp32 or bf16, CPU)."""

    def __init__(self, weight: torch.Tensor, hint: int = BATCH_HINT):
        self.version = weight._version
        self.out_features = weight.shape[0]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), hint)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.dim() == 2:  # packed passes: [T, d]
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), self.packed, bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)


@functools.cache
def packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights of ``dtype`` on this CPU. bf16 needs avx512bw/vl/dq or
    avx_ne_convert: an AVX2-only CPU refuses it ("bf16 path needs the cpu support ..."), and
    there bf16 runs unpacked through ``F.linear`` (slowly: fp32 is the dtype policy's choice there)."""
    if dtype not in (torch.float32, torch.bfloat16) or not available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), BATCH_HINT)
    except RuntimeError:
        return False
    return True


def pack(weight: torch.Tensor) -> bool:
    """Register ``weight`` for packed matmuls; False (nothing done) where packing does not apply."""
    if not isinstance(weight, torch.Tensor) or weight.device.type != "cpu" or weight.dim() != 2:
        return False
    panels = weight.dtype == torch.float32 and skinny.wanted()
    if not panels and not packs(weight.dtype):
        return False
    p = getattr(weight, ATTR, None)
    if p is None or p.version != weight._version:
        setattr(weight, ATTR, PanelWeight(weight) if panels else PackedWeight(weight))
    return True


def packed(weight: torch.Tensor) -> "PackedWeight | PanelWeight | None":
    """``weight``'s packed copy (made again if the weight was updated in place since), or None where it has none."""
    p = getattr(weight, ATTR, None)
    if p is not None and p.version != weight._version:  # updated in place since packing: repack
        pack(weight)
        p = getattr(weight, ATTR)
    return p


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through the packed copy of ``weight`` when it has one, or the
    quantized kernel when ``weight`` is a ``d3d.cpu.quant`` matrix."""
    if not isinstance(weight, torch.Tensor):
        return weight.linear(x, bias)
    p = None if torch.is_grad_enabled() or x.dtype != weight.dtype else packed(weight)
    return F.linear(x, weight, bias) if p is None else p(x, bias)



def matmul_path(model) -> str:
    """Which code multiplies ``model``'s matrices here, in a few words (the summary line and
    ``generate --json`` name it, so a default that depends on a kernel build is never silent)."""
    if model.device.type != "cpu":
        return f"torch on {model.device.type}"
    if model.quantized:
        return ("int8 activations, " + ("VNNI (quant_vnni.cpp)" if quant_kernel.vnni_available() else
                                         "AVX2 (quant_maddubs.cpp)")) if model.int8_activations else \
            "quantized panels, fp32 activations (quant_gemm.cpp)"
    if model.dtype == torch.float32 and skinny.wanted():
        return "fp32 panels (skinny_gemm.cpp)"
    return f"oneDNN {str(model.dtype).removeprefix('torch.')}" if available() else "torch"


__all__ = ["available", "packs", "pack", "packed", "linear", "matmul_path", "PackedWeight", "PanelWeight"]
