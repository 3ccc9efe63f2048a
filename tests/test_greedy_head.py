"""The greedy head (``d3d.cpu.greedy_head``): an int8 LM head read in two stages gives each row's argmax exactly.

Its logits are the full head's, bit for bit, at every column it computes (the kernel itself, on those panels), -inf
elsewhere, and every row's maximum is among the computed ones; so greedy decoding equals the full head's token for
token. Tested on random matrices with exact ties and near ties, NaN input, the matrices it refuses, and decoders."""

from __future__ import annotations

import pytest
import torch

import d3d.cpu.greedy_head as greedy_head
from d3d.cpu.greedy_head import GreedyHead
from d3d.cpu.quant import QuantWeight, quantize
from d3d.decode.config import SpecConfig
from d3d.kernels import glue_cpu, quant as kernel
from d3d.kernels.glue_cpu import argmax
from test_engines import generate, random_drafter, reference, tiny_target

pytestmark = pytest.mark.skipif(not (kernel.int8_available() and glue_cpu.available()),
                                reason="the int8 kernels or glue_cpu do not build here")


def q8_0(w: torch.Tensor) -> QuantWeight:
    """A dense [N, K] matrix as Q8_0 holds it: int8 values, an fp16 scale per group of 32."""
    n, k = w.shape
    g = w.view(n, k // 32, 32)
    s = (g.abs().amax(-1) / 127).half().float().clamp(min=1e-6)
    return QuantWeight((g / s[..., None]).round().clamp(-128, 127).to(torch.int8).view(n, k), s)


@pytest.mark.parametrize("N, K", [(200, 64), (517, 96), (64, 32)])
@pytest.mark.parametrize("T", [1, 3, 4])
def test_logits_are_the_full_heads_where_computed_and_the_argmax_is_its_own(N, K, T):
    g = torch.Generator().manual_seed(N * K + T)
    w = torch.randn(N, K, generator=g)
    x = torch.randn(T, K, generator=g)
    full0 = q8_0(w).linear(x)
    top = argmax(full0)
    w[top[0] - 1 if top[0] > 0 else 1] = w[top[0]]  # an exact tie for row 0: the lower index must win
    w[5] = w[top[-1]] * (1 + 1e-6)  # a near tie for the last row
    head = q8_0(w)
    full, fast = head.linear(x), GreedyHead(head).logits(x)
    done = torch.isfinite(fast)
    assert torch.equal(fast[done], full[done]) and (fast[~done] == float("-inf")).all()
    assert torch.equal(argmax(fast), argmax(full))
    if N > 64 and T == 1:
        assert done.sum() < N  # it left columns out


def test_nan_takes_the_full_head_and_refused_matrices_are_named():
    head = q8_0(torch.randn(40, 64))
    x = torch.randn(2, 64)
    x[1, 3] = float("nan")
    assert torch.equal(GreedyHead(head).logits(x).isnan(), head.linear(x).isnan())
    assert not GreedyHead.fits(torch.randn(40, 64))
    assert not GreedyHead.fits(quantize(torch.randn(40, 64), "int4"))
    negative = QuantWeight(torch.ones(16, 64, dtype=torch.int8), -torch.ones(16, 2))
    assert not GreedyHead.fits(negative)
    with pytest.raises(ValueError, match="GreedyHead"):
        GreedyHead(negative)


def with_q8_head(seed=0):
    target = tiny_target(seed=seed)
    target.set_weight("embed_tokens.weight", q8_0(target.embed_tokens.weight.detach()))  # tied: the head too
    return target


def test_greedy_passes_take_it_and_decoding_is_unchanged(monkeypatch):
    """In decoders: greedy passes of up to its ``rows`` rows take the greedy head; ar and sync decode what they do
    with the full head (and what plain greedy decoding does), token for token; sampling never takes it."""
    target = with_q8_head()
    drafter = random_drafter(target, 4, seed=5)
    calls = []
    logits = GreedyHead.logits
    monkeypatch.setattr(GreedyHead, "logits", lambda self, x: calls.append(len(x)) or logits(self, x))
    prompts = [list(range(3, 15)), list(range(20, 29))]
    target.greedy_heads = False
    want = reference(target, prompts, 12)
    for spec in (SpecConfig(mode="ar"), SpecConfig(mode="sync", lookup=0, leaves=0)):
        target.greedy_heads = True
        calls.clear()
        on = generate(target, prompts, max_new_tokens=12, spec=spec, drafter=drafter, stop_ids=[]).tokens
        assert calls and max(calls) <= target.greedy_head().rows
        target.greedy_heads = False
        assert on == generate(target, prompts, max_new_tokens=12, spec=spec, drafter=drafter, stop_ids=[]).tokens == want
    target.greedy_heads, calls[:] = True, []
    out = target(torch.tensor([3, 4, 5]), target.new_cache(1, 8).layout([3]))  # not greedy: the full head
    assert not calls and torch.isfinite(out).all()
