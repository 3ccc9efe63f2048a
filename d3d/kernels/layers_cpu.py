"""The decoder layers of a CPU decoding pass in one call (``layers_cpu.cpp``): Qwen2 and Qwen3 layers over quantized
(int8-activation), fp32-panel or oneDNN-blocked matrices, each step the kernel the Python layers call, in the same
order with the same ATen ops between them, so the bits are the Python layers'.

Why: a decoding step of the real 0.5B made ~220 module calls and ~100 small torch ops around its matmuls; in
one call it is 16% shorter, the bundled target's 44% (docs/results/layers-cpu/). Torch reference:
``d3d.model.transformer.DecoderLayer``, which ``Transformer.forward`` runs wherever this does not apply
(``d3d.model.transformer.bind_cpu_layers`` says where).
"""

from __future__ import annotations

import functools
from pathlib import Path

from .cpp import AVX2_FLAGS, build

SOURCE = Path(__file__).with_name("layers_cpu.cpp")
INT8, PANELS, ONEDNN = 0, 1, 2  # a matrix's kind (Part in layers_cpu.cpp)


@functools.cache
def _load():
    """(module, None) or (None, why not)."""
    return build("d3d_layers_cpu", SOURCE, AVX2_FLAGS)


def available() -> bool:
    """Whether this and the kernels every layer calls (glue_cpu, attend_cpu) are built."""
    return why_unavailable() is None


def why_unavailable() -> str | None:
    from . import attention_cpu, glue_cpu

    for what, why in (("layers_cpu.cpp", _load()[1]), ("glue_cpu.cpp", glue_cpu.why_unavailable()),
                      ("attend_cpu.cpp", attention_cpu.why_unavailable())):
        if why is not None:
            return f"{what}: {why}"
    return None


def new_layers(heads: int, kv_heads: int, head_dim: int, eps: float):
    """An empty ``Layers`` of this shape, calling this CPU's int8 matmul (``quant.int8_kernel``, where built),
    the fp32 panels' (``skinny``, where built), glue_cpu's rms_norm and rope_write and attend_cpu's attend; fill
    it with ``add_layer``, ``add_part`` (a matrix of a kind the CPU has a kernel for) and ``set_bias``, then
    ``run`` a pass."""
    from . import attention_cpu, glue_cpu, quant, skinny

    why = why_unavailable()
    if why is not None:
        raise RuntimeError(f"d3d.kernels.layers_cpu: unavailable: {why}")
    glue = glue_cpu._load()[0].addresses()
    int8 = quant.int8_kernel()
    panels = skinny._load()[0]
    return _load()[0].Layers(int8.address() if int8 else 0, panels.address() if panels else 0, glue["rms_norm"],
                             glue["rope_write"], attention_cpu._load()[0].address(), heads, kv_heads, head_dim, eps)


__all__ = ["available", "why_unavailable", "new_layers", "INT8", "PANELS", "ONEDNN"]
