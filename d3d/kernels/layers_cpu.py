"""The decoder layers of a CPU decoding pass in one call (``layers_cpu.cpp``): Qwen2 layers over int8-activation
matrices, each step the kernel the Python layers call, reached through its address, in the same order with the
same ATen ops between them, so the bits are the Python layers'.

Why: a decoding step of the real 0.5B made ~220 module calls and ~100 small torch ops around its matmuls, about a
twelfth of the step (docs/results/layers-cpu/). Torch reference: ``d3d.model.transformer.DecoderLayer``, which
``Transformer.forward`` runs wherever this does not apply (``d3d.model.transformer.bind_cpu_layers`` says where).
"""

from __future__ import annotations

import functools
from pathlib import Path

from .cpp import AVX2_FLAGS, build

SOURCE = Path(__file__).with_name("layers_cpu.cpp")


@functools.cache
def _load():
    """(module, None) or (None, why not)."""
    return build("d3d_layers_cpu", SOURCE, AVX2_FLAGS)


def available() -> bool:
    """Whether this and the kernels it calls (the int8 matmul, glue_cpu, attend_cpu) are built."""
    return why_unavailable() is None


def why_unavailable() -> str | None:
    from . import attention_cpu, glue_cpu, quant

    for what, why in (("layers_cpu.cpp", _load()[1]), ("the int8 matmul", quant.why_int8_unavailable()),
                      ("glue_cpu.cpp", glue_cpu.why_unavailable()), ("attend_cpu.cpp", attention_cpu.why_unavailable())):
        if why is not None:
            return f"{what}: {why}"
    return None


def new_layers(heads: int, kv_heads: int, head_dim: int, eps: float):
    """An empty ``Layers`` of this shape, calling this CPU's int8 matmul (``quant.int8_kernel``), glue_cpu's
    rms_norm and rope_write and attend_cpu's attend; fill it with ``add_layer``, ``add_part`` and ``set_bias``,
    then ``run`` a pass."""
    from . import attention_cpu, glue_cpu, quant

    why = why_unavailable()
    if why is not None:
        raise RuntimeError(f"d3d.kernels.layers_cpu: unavailable: {why}")
    glue = glue_cpu._load()[0].addresses()
    return _load()[0].Layers(quant.int8_kernel().address(), glue["rms_norm"], glue["rope_write"],
                             attention_cpu._load()[0].address(), heads, kv_heads, head_dim, eps)


__all__ = ["available", "why_unavailable", "new_layers"]
