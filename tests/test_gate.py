"""The gate (``d3d.decode.gate``): plain target steps where drafting rounds measure slower.

Its choices depend on timing, so the engine tests fix them with a scripted gate; the choice
itself is tested on given tokens and seconds."""

from __future__ import annotations

import pytest

import d3d.decode.speculative as speculative
from d3d.decode.engines import generate as library_generate
from d3d.decode.gate import DRAFT, STEP, Gate
from test_engines import PROMPTS, assert_samples_follow_target, generate, random_drafter, reference, tiny_target


def test_each_kind_is_measured_first_then_the_faster_wins_and_the_other_is_probed():
    g = Gate(probe_every=4, decay=0.5)
    assert g.choose() == DRAFT
    g.update(DRAFT, 1, 0.3)  # a weak drafter: 1 token in 0.3 s
    assert g.choose() == STEP
    g.update(STEP, 1, 0.2)  # a step: 1 token in 0.2 s
    assert g.rate(DRAFT) == pytest.approx(1 / 0.3) and g.rate(STEP) == pytest.approx(5.0)
    assert [g.choose() for _ in range(8)] == [STEP, STEP, STEP, DRAFT] * 2
    g.update(DRAFT, 9, 0.3)  # drafting starts to pay: (1 + 9) / 2 tokens in 0.3 s
    assert g.rate(DRAFT) == pytest.approx(5 / 0.3)
    assert [g.choose() for _ in range(4)] == [DRAFT, DRAFT, DRAFT, STEP]


def test_rates_are_ratios_of_averages_not_averages_of_ratios():
    g = Gate(decay=0.5)
    g.update(DRAFT, 10, 1.0)
    g.update(DRAFT, 0, 0.001)  # a round timed at ~0: its ratio would be meaningless
    assert g.rate(DRAFT) == pytest.approx(5 / 0.5005)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="probe_every=1"):
        Gate(probe_every=1)
    with pytest.raises(ValueError, match="decay=0"):
        Gate(decay=0)
    with pytest.raises(ValueError, match="kind='leaf'"):
        Gate().update("leaf", 1, 1.0)


class Scripted(Gate):
    """A gate whose choices are given (cycled), recording what it was told."""

    script = [DRAFT]
    told: list = []

    def __init__(self):
        super().__init__()
        self.n = 0

    def choose(self):
        self.n += 1
        return self.script[(self.n - 1) % len(self.script)]

    def update(self, kind, tokens, seconds):
        Scripted.told.append((kind, tokens, seconds))
        super().update(kind, tokens, seconds)


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(speculative, "Gate", Scripted)
    Scripted.told = []
    return Scripted


@pytest.mark.parametrize("script", [[STEP], [DRAFT, STEP], [STEP, STEP, DRAFT]])
@pytest.mark.parametrize("lookup", [0, 1])
def test_greedy_with_steps_equals_ar(scripted, script, lookup):
    """Steps between drafting rounds (the drafter cache catching up on the tokens they committed),
    beside copied drafts, in a batch: the output is ar's."""
    scripted.script = script
    target = tiny_target(seed=3)
    drafter = random_drafter(target, 4, seed=4)
    rounds = []
    out = generate(target, PROMPTS, max_new_tokens=30, stop_ids=[], mode="sync", drafter=drafter, gate=True,
                   lookup=lookup, on_round=rounds.append)
    assert out.tokens == reference(target, PROMPTS, 30)
    steps = [r for r in rounds if r.step]
    assert len(steps) == out.stats.steps > 0
    assert all(r.draft == [] and r.accepted == 0 and r.sync_draft_seconds == 0 for r in steps)
    assert (out.stats.drafter_forwards == 0) == (script == [STEP])
    if lookup == 0 and script == [STEP]:  # nothing drafted, nothing copied: every round a step
        assert out.stats.steps == out.stats.rounds and out.stats.tau == 1.0
    kinds = [k for k, _, _ in scripted.told]
    assert set(kinds) == set(script) and all(t >= 1 and s > 0 for _, t, s in scripted.told)


def test_the_gate_is_told_the_tokens_of_the_rows_it_chose_for(scripted):
    """One row: each round reports the tokens that row committed, a + 1 (a + 2 after a hit leaf)."""
    target = tiny_target(seed=3)
    drafter = random_drafter(target, 4, seed=4)
    rounds = []
    scripted.script = [DRAFT, STEP]
    generate(target, PROMPTS[:1], max_new_tokens=25, stop_ids=[], mode="sync", drafter=drafter, gate=True,
             leaves=2, on_round=rounds.append)
    assert [(k, t) for k, t, _ in scripted.told] == [(STEP if r.step else DRAFT, len(r.committed)) for r in rounds]


def test_a_losing_drafter_gives_way_to_steps(monkeypatch):
    """Given the rates of a drafter that never pays, the engine takes steps in all but the probe rounds."""

    class Losing(Gate):
        def update(self, kind, tokens, seconds):  # drafting rounds measured 3x slower than steps
            super().update(kind, tokens, seconds * (3.0 if kind == DRAFT else 1.0) + (1.0 if kind == DRAFT else 0.3))

    target = tiny_target(seed=3)
    drafter = random_drafter(target, 4, seed=4)
    monkeypatch.setattr(speculative, "Gate", Losing)
    out = generate(target, PROMPTS[:1], max_new_tokens=60, stop_ids=[], mode="sync", drafter=drafter, gate=True)
    assert out.tokens == reference(target, PROMPTS[:1], 60)
    drafting = out.stats.rounds - out.stats.steps
    assert out.stats.steps >= 0.75 * out.stats.rounds and 1 <= drafting <= 2 + out.stats.rounds // 8


def test_sampling_with_steps_follows_the_target_distribution(monkeypatch, scripted):
    """A step samples the bonus from the target at T like a drafting round that accepted nothing:
    the output keeps the target's distribution (control: acceptance that ignores T must fail)."""
    scripted.script = [STEP, DRAFT, DRAFT]
    target = tiny_target(seed=11, vocab=6, std=0.5)
    drafter = random_drafter(target, 3, seed=12)
    out = assert_samples_follow_target(target, [0, 1, 2], monkeypatch, mode="sync", drafter=drafter, gate=True)
    assert out.stats.steps > 0


def test_gate_defaults_and_errors():
    from d3d.decode.overlap import default_gate
    import torch

    assert not any(default_gate(torch.device(d), m) for d in ("cpu", "cuda") for m in ("sync", "async"))
    target = tiny_target(seed=3)
    drafter = random_drafter(target, 4, seed=4)
    ref = reference(target, PROMPTS, 20)
    for gate in (None, True):  # the default (off), and on with the engine's own timing
        out = library_generate(target, PROMPTS, max_new_tokens=20, stop_ids=[], mode="sync", drafter=drafter, gate=gate)
        assert out.tokens == ref
        assert gate or out.stats.steps == 0
    with pytest.raises(ValueError, match="gate=True with mode='async'"):
        library_generate(target, PROMPTS, max_new_tokens=5, mode="async", drafter=drafter, gate=True)
    with pytest.raises(ValueError, match="gate=1: must be True or False"):
        library_generate(target, PROMPTS, max_new_tokens=5, mode="sync", drafter=drafter, gate=1)
