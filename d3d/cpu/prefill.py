"""A prompt's prefill through AMX's bf16 tiles: the passes of many rows that only a prefill makes.

A prefill pass multiplies every prompt token by every matrix. The int8-activation kernels that decode
(``d3d.kernels.quant.matmul_vnni``) are bound there by their multiply-adds, ~0.3 T a second on 2 cores for any
row count past ~8; AMX's bf16 tiles multiply at ~1.5 T flops a second once a panel is dequantized to bf16
(``d3d.kernels.quant_dense``). On an AMX Xeon a 128-token prefill of the 1.5B took 722 ms through the int8 kernels
and 418 through the tiles; at 48 tokens 1.06-1.26x, slower below 40 (docs/results/prefill-tiles/).

The tiles' numerics are not the int8 kernels' (bf16 weights and activations, fp32 sums), so which rows take them
is decided by each row's own sequence, never by what else shares its pass: the rows of a prompt of ``MIN_ROWS``
tokens or more, read in a pass that ``tiles()`` marks (``d3d.decode.generation.prefill``, ``ArDecoder``'s passes,
where a newcomer's prompt may ride beside others' decoding steps). Every other row, and every pass not marked
(decoding, verification, the drafter), takes the int8 kernels. Each row's tile sums depend on that row alone, so a
prompt gets the same bits whatever shares its pass, and every engine reads a prompt the same way: speculative
output still equals ar's.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

from .. import env
from ..kernels import quant_dense

MIN_ROWS = 48  # a prompt's tokens before its rows take the tiles (docs/results/prefill-tiles/min_rows_*.json)
_ROWS = contextvars.ContextVar("d3d_prefill_rows", default=None)  # the marked pass's rows that take the tiles


@functools.cache
def _amx() -> bool:
    return quant_dense.amx_usable()


def usable() -> bool:
    """Whether prompts take the tiles here: ``D3D_PREFILL_TILES`` (auto: where AMX-BF16 runs; on: an error where it
    cannot)."""
    choice = env.read("D3D_PREFILL_TILES")
    if choice == "off":
        return False
    if choice == "on" and not _amx():
        raise RuntimeError(f"D3D_PREFILL_TILES=on, but AMX's bf16 tiles cannot run here: {quant_dense.why_no_tiles()}")
    return _amx()


@contextlib.contextmanager
def tiles(lengths: list[int], prompts: list[bool] | None = None):
    """Marks the pass run inside, of feeds of ``lengths`` tokens in order (``prompts[i]``: feed i is a prompt's
    tokens; default all): the rows of prompts of ``MIN_ROWS`` tokens or more take the tiles where ``usable()``."""
    takes = [n >= MIN_ROWS and (prompts is None or prompts[i]) for i, n in enumerate(lengths)]
    rows = None
    if any(takes) and usable():
        rows = torch.repeat_interleave(torch.tensor(takes), torch.tensor(lengths))
    token = _ROWS.set(rows)
    try:
        yield
    finally:
        _ROWS.reset(token)


def rows(n: int) -> torch.Tensor | None:
    """Which of a matrix's ``n`` rows take the tiles (a bool mask), or None: none (outside a marked pass, or a
    matrix of fewer rows than the pass: a last layer that carries only the rows whose logits are read)."""
    mask = _ROWS.get()
    return mask if mask is not None and len(mask) == n else None


def marked() -> bool:
    """Whether some row of the pass running here takes the tiles (the fused CPU layers then stand aside)."""
    return _ROWS.get() is not None


__all__ = ["MIN_ROWS", "usable", "tiles", "rows", "marked"]
