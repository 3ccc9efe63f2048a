"""One batch, per-row sampling (what d3d serve's one decoder per mode rests on): rows of different
temperatures in one speculative decoder each follow the target's distribution at their own temperature
(chi-square, with a control that verifies every row at one temperature and must fail), and greedy rows
in the same batch equal ``generate`` alone."""

import pytest
import torch

import d3d.decode.speculative as speculative
from d3d.decode.config import Sampling, SpecConfig
from d3d.decode.engines import ArDecoder, generate, resolved_spec
from d3d.decode.sequence import Sequence
from d3d.decode.speculative import SpeculativeDecoder
from test_engines import chi2, chi2_threshold, random_drafter, tiny_target

PROMPT = [1, 2]
TEMPS = (1.0, 0.5)
N = 3000  # rows per temperature
GREEDY = 8  # greedy rows mixed in


def marginals(target, temperature: float):
    """P(x2), P(x3) after PROMPT at ``temperature``, by enumeration (the first token at T as well)."""
    vocab = target.cfg.vocab_size
    with torch.no_grad():
        p1 = (target(torch.tensor([PROMPT]))[0, -1] / temperature).softmax(-1)
        seqs = torch.tensor([PROMPT + [a, b] for a in range(vocab) for b in range(vocab)])
        probs = (target(seqs) / temperature).softmax(-1)
    joint12 = p1[:, None] * probs[::vocab, len(PROMPT)]
    p3 = (joint12[:, :, None] * probs[:, len(PROMPT) + 1].view(vocab, vocab, vocab)).sum((0, 1))
    return joint12.sum(0).double(), p3.double()


def mixed_batch(target, drafter, mode: str) -> tuple[list[list[int]], list[Sampling]]:
    """N rows at each of TEMPS and GREEDY greedy rows, interleaved, in one decoder: 3 tokens each."""
    settings = [Sampling(t, seed=k) for k in range(N) for t in TEMPS] + [Sampling()] * GREEDY
    order = torch.randperm(len(settings), generator=torch.Generator().manual_seed(3)).tolist()
    settings = [settings[k] for k in order]
    if mode == "ar":
        dec = ArDecoder(target, len(settings), len(PROMPT) + 4)
    else:
        spec = resolved_spec(target, drafter, SpecConfig(mode, lookup=0, verify_min_prob=0.05, successor_threshold=0.0))
        dec = SpeculativeDecoder(target, drafter, spec, len(settings), len(PROMPT) + 4)
    seqs = [Sequence(PROMPT, 3, s, id=i) for i, s in enumerate(settings)]
    dec.admit(seqs)
    while dec.step():
        pass
    dec.close()
    return [s.output for s in seqs], settings


def worst_chi2(tokens, settings, target) -> float:
    """The largest chi-square / threshold over temperatures and tokens 2, 3 (< 1: every one passes)."""
    worst = 0.0
    for t in TEMPS:
        toks = torch.tensor([x for x, s in zip(tokens, settings) if s.temperature == t])
        for col, probs in zip((1, 2), marginals(target, t)):
            stat, dof = chi2(toks[:, col], probs)
            worst = max(worst, stat / chi2_threshold(dof))
    return worst


@pytest.mark.parametrize("mode", ["sync", "async", "ar"])
def test_rows_of_mixed_temperatures_each_follow_their_own(mode, monkeypatch):
    target = tiny_target(seed=11, vocab=6, std=0.5)
    drafter = random_drafter(target, 3, seed=12)
    tokens, settings = mixed_batch(target, drafter, mode)
    assert worst_chi2(tokens, settings, target) < 1
    greedy = generate(target, PROMPT, max_new_tokens=3, stop_ids=[]).tokens[0]
    assert all(x == greedy for x, s in zip(tokens, settings) if s.temperature == 0)
    if mode == "ar":  # the control below is the speculative verification's
        return
    real = speculative.accept
    with monkeypatch.context() as m:  # the control: every row verified at the first temperature of the batch
        m.setattr(speculative, "accept", lambda d, lg, temperature=0.0, seed=0: real(d, lg, temperature=TEMPS[0],
                                                                                      seed=seed))
        biased, settings = mixed_batch(target, drafter, mode)
    assert worst_chi2(biased, settings, target) > 1
