"""A prompt's prefill through AMX's bf16 tiles (d3d.kernels.quant_dense, d3d.cpu.prefill): the kernel's values are the
dequantized matrix's bit for bit, its products the bf16 reference's up to fp32 sums, each row's alone; which rows
take it is decided by each row's own prompt, so an output never depends on what shares a pass, and speculative
output still equals ar's. The plumbing runs everywhere through a torch stand-in for the tiles; the kernel where
the CPU has AMX."""

import numpy as np
import pytest
import torch

import d3d
from d3d.cpu import prefill
from d3d.cpu.quant import QuantWeight, Stacked, quantize
from d3d.kernels import quant as kernel, quant_dense
from test_quant import random_blocks

needs_tiles = pytest.mark.skipif(not quant_dense.amx_usable(),
                                 reason=f"no AMX bf16 tiles here: {quant_dense.why_no_tiles()}")
needs_module = pytest.mark.skipif(not quant_dense.available(), reason=f"quant_dense: {quant_dense.why_unavailable()}")
needs_kernel = pytest.mark.skipif(not kernel.available(), reason=f"no quant kernel: {kernel.why_unavailable()}")
KINDS = ["Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "int8", "int4"]


def weight(kind: str, n: int, k: int):
    """A QuantWeight of ``kind``: GGUF blocks as d3d keeps them, or made from dense weights."""
    if kind in ("int8", "int4"):
        return quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(n)), kind)
    from d3d.model.gguf import quant_weight

    return quant_weight(random_blocks(kind, n, k, np.random.default_rng(n + k)), kind, (n, k))


def reference(x: torch.Tensor, w) -> torch.Tensor:
    """The tiles' products in torch: bf16 weights and activations, fp32 sums."""
    return x.to(torch.bfloat16).float() @ w.dequantize().to(torch.bfloat16).float().T


@needs_module
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [16, 45])
def test_values_are_the_dequantized_matrix_bit_for_bit(kind, n):
    """What the tiles multiply by (before bf16), on every AVX-512 CPU (the module builds there; AMX runs ``matmul``)."""
    w = weight(kind, n, 512)
    a = w.kernel_args()
    got = quant_dense.dequantize(a["q"], a["h"], a["s"], a["m"], n, 512, a["group"], a["bits"], a["sd"], a["md"])
    assert torch.equal(got, w.dequantize().T)


@needs_tiles
@pytest.mark.parametrize("kind", KINDS)
def test_products_equal_the_bf16_reference_and_each_row_alone(kind):
    """Odd row and column counts (tiles of 16 rows padded, a last panel of 13 columns); each row of a 130-row
    product equals that row's product alone, bit for bit."""
    w = weight(kind, 45, 512)
    x = torch.randn(130, 512, generator=torch.Generator().manual_seed(1))
    y = quant_dense.matmul(x, **w.kernel_args())
    ref = reference(x, w)
    assert y.shape == (130, 45) and y.dtype == torch.float32
    assert (y - ref).abs().max() <= 1e-5 * ref.abs().max()
    for m in (0, 17, 129):
        assert torch.equal(quant_dense.matmul(x[m:m + 1], **w.kernel_args())[0], y[m])


def stand_in(monkeypatch, model):
    """The tiles' kernel replaced by its torch reference for ``model``'s matrices, where no AMX is needed: the
    plumbing's test (which rows take it, ``QuantWeight.with_tiles`` splitting a pass between it and the int8
    kernels). Returns the row counts the kernel got."""
    monkeypatch.setattr(prefill, "_amx", lambda: True)
    weights, calls = {}, []
    for module in model.modules():
        w = getattr(module, "weight", None)
        for part in w.parts if isinstance(w, Stacked) else [w]:
            if isinstance(part, QuantWeight):
                weights[id(part.q)] = part

    def bound(q, **_):
        w = weights[id(q)]
        return lambda x: calls.append(len(x)) or reference(x, w)

    monkeypatch.setattr(quant_dense, "bound", bound)
    return calls


def test_only_the_rows_of_long_prompts_in_a_marked_pass(monkeypatch):
    """The rows that take the tiles: a prompt's of MIN_ROWS tokens or more, in a marked pass; none outside one,
    none of a decoding row or a short prompt beside them, none where D3D_PREFILL_TILES=off; on where AMX cannot run
    is an error naming the variable."""
    monkeypatch.setattr(prefill, "_amx", lambda: True)
    n = prefill.MIN_ROWS
    assert prefill.rows(3) is None and not prefill.marked()
    with prefill.tiles([3, n, 1], [True, True, False]):
        mask = prefill.rows(n + 4)
        assert mask.tolist() == [False] * 3 + [True] * n + [False] and prefill.marked()
        assert prefill.rows(3) is None  # a last layer that carries only the rows whose logits are read
    with prefill.tiles([n - 1, 5]):
        assert prefill.rows(n + 4) is None and not prefill.marked()
    monkeypatch.setenv("D3D_PREFILL_TILES", "off")
    with prefill.tiles([n]):
        assert prefill.rows(n) is None
    monkeypatch.setenv("D3D_PREFILL_TILES", "on")
    monkeypatch.setattr(prefill, "_amx", lambda: False)
    with pytest.raises(RuntimeError, match="D3D_PREFILL_TILES=on"):
        with prefill.tiles([n]):
            pass


@needs_kernel
def test_long_prompts_take_the_tiles_and_speculative_output_still_equals_ar(monkeypatch):
    """The bundled pair quantized, the tiles' stand-in: a long prompt's prefill takes them (its rows only) in ar and
    sync alike, so their outputs are equal; a prompt's output is the same alone and batched with a short one."""
    from pathlib import Path

    models = Path(__file__).resolve().parents[1] / "models"
    target = d3d.load_model(models / "target-16m", weights="int8")
    calls = stand_in(monkeypatch, target)
    drafter = d3d.load_drafter(models / "d3d-drafter-16m", target=target)
    tok = d3d.load_tokenizer(models / "target-16m")
    long = tok.encode("import os\nimport sys\n\n\ndef read_lines(path):\n    " * 6)
    short = tok.encode("class Config:\n")
    assert len(long) >= prefill.MIN_ROWS > len(short)
    ar = d3d.generate(target, [long, short], max_new_tokens=24, stop_ids=[]).tokens
    assert calls and set(calls) == {len(long)}  # the long prompt's rows, never the short one's
    alone = d3d.generate(target, [long], max_new_tokens=24, stop_ids=[]).tokens
    assert alone[0] == ar[0]
    for mode in ("sync", "async"):
        before = len(calls)
        assert d3d.generate(target, [long, short], max_new_tokens=24, stop_ids=[], drafter=drafter,
                            spec=mode).tokens == ar, mode
        assert len(calls) > before and set(calls[before:]) == {len(long)}, mode  # its prefill took them too
