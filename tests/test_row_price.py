"""The row price (``d3d.decode.row_price``): verify a draft while its chance beats R * b, measured as it runs.

The threshold depends on timing, so the engine tests fix it with a scripted price; the estimate
itself is tested on given rows, seconds and tokens."""

from __future__ import annotations

import pytest
import torch

import d3d.decode.speculative as speculative
from d3d.decode.row_price import BATCH_DRAFT_LIMIT, RowPrice
from test_engines import PROMPTS, generate, random_drafter, reference, tiny_target
from d3d.decode.config import SpecConfig, resolved_spec
from d3d.decode.sequence import Sequence


def feed(price, widths, step=0.1, per_row=0.01, rate=20.0):
    """Rounds whose verification costs ``step + per_row * rows`` and whose round commits ``rate``
    tokens per second."""
    for w in widths:
        seconds = step + per_row * w
        price.observe(w, seconds, 4, 4 / rate)


def test_threshold_is_rate_times_seconds_per_row():
    p = RowPrice(prior=0.05, warmup=8)
    feed(p, [16, 3, 5, 16, 2, 4, 16, 3][:7])
    assert p.min_prob() == 0.05  # 7 rounds: still the prior
    feed(p, [3])
    assert p.seconds_per_row() == pytest.approx(0.01) and p.rate() == pytest.approx(20.0)
    assert p.min_prob() == pytest.approx(0.2)  # 20 tok/s x 10 ms a row
    feed(p, [16, 3, 5, 16] * 20, per_row=0.0)  # rows became free (bf16 on AMX): verify everything
    assert p.min_prob() < 0.01


def test_equal_widths_keep_the_prior_and_the_ceiling_holds():
    p = RowPrice(prior=0.07)
    feed(p, [5] * 30)
    assert p.seconds_per_row() is None and p.min_prob() == 0.07  # no spread of widths: no slope
    q = RowPrice(ceiling=0.4)
    feed(q, [2, 16] * 10, per_row=1.0)  # rows dearer than whole rounds: capped
    assert q.min_prob() == 0.4
    r = RowPrice()
    for w in [2, 16] * 10:  # wider passes measured *faster* (noise): the slope is 0, not negative
        r.observe(w, 0.3 - 0.01 * w, 4, 0.2)
    assert r.seconds_per_row() == 0.0 and r.min_prob() == 0.0


def test_bad_arguments_are_named():
    for kw, what in ((dict(prior=1.5), "prior=1.5"), (dict(decay=0), "decay=0"), (dict(ceiling=0), "ceiling=0")):
        with pytest.raises(ValueError, match=what):
            RowPrice(**kw)
    with pytest.raises(ValueError, match="rows=0"):
        RowPrice().observe(0, 0.1, 1, 0.1)


class Scripted(RowPrice):
    """A price whose thresholds are given (cycled), recording what it observed."""

    script = [0.0]
    seen: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.k = 0

    def min_prob(self):
        self.k += 1
        return self.script[(self.k - 1) % len(self.script)]

    def observe(self, rows, verify_seconds, tokens, round_seconds, drafted=True):
        Scripted.seen.append((rows, tokens))
        super().observe(rows, verify_seconds, tokens, round_seconds, drafted)

    def draft(self, rows):  # every round drafts: the cuts are what is tested
        return True


def scripted_run(mode, monkeypatch, script, leaves):
    """sync/async with verify_min_prob="auto" and the price's thresholds scripted (cycling through
    ``script``): the output, checked against ar, and the rounds."""
    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    monkeypatch.setattr(speculative, "RowPrice", Scripted)
    monkeypatch.setattr(Scripted, "script", script)
    Scripted.seen = []
    rounds = []
    out = generate(target, PROMPTS[:1], max_new_tokens=30, stop_ids=[], drafter=drafter, on_round=rounds.append,
                   spec=SpecConfig(mode=mode, leaves=leaves, verify_min_prob="auto"))
    assert out.tokens == reference(target, PROMPTS[:1], 30)
    return out, rounds


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_auto_cuts_each_round_at_the_measured_threshold_and_keeps_greedy_output(mode, monkeypatch):
    """verify_min_prob="auto": each round's drafts are cut at the price's threshold of that round
    (scripted here: all, none, a cut), every round is observed, and the output equals ar."""
    out, rounds = scripted_run(mode, monkeypatch, [0.0, 1.0, 0.3], leaves=0)
    assert [r.min_prob for r in rounds] == [[0.0, 1.0, 0.3][k % 3] for k in range(len(rounds))]
    assert all(len(r.draft) == (4 if r.min_prob == 0 else 0) for r in rounds if r.min_prob != 0.3)
    assert [rows for rows, _ in Scripted.seen] == [1 + len(r.draft) for r in rounds]
    assert sum(tokens for _, tokens in Scripted.seen) == out.stats.total_generated - 1  # the prefill's token aside


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_auto_prices_leaves_like_drafts(mode, monkeypatch):
    """Under "auto" a leaf is verified only when its estimated hit probability reaches the round's
    threshold: all leaves at 0, none at 1 (a random drafter is never that sure), fewer in all. The
    output stays ar's."""
    out, rounds = scripted_run(mode, monkeypatch, [0.0, 1.0, 0.2], leaves=3)
    leaves = [rows - 1 - len(r.draft) for (rows, _), r in zip(Scripted.seen, rounds)]
    assert all(n == 3 for n, r in zip(leaves, rounds) if r.min_prob == 0.0)
    assert all(n == 0 for n, r in zip(leaves, rounds) if r.min_prob == 1.0)
    assert out.stats.verified_leaves == sum(leaves) < 3 * len(rounds)


def test_leaf_score_cut_keeps_the_ranking():
    """Leaves scored 1 x 0.3 (the rival of d_1), 0.5 x 0.1 and 0.5 x 0.8 x 0.05: a cut at 0.2 keeps the first."""
    from d3d.decode.hypotheses import Hypothesis

    top_ids, top_probs = [[9, 7], [8, 4], [9, 3]], [[0.3, 0.5], [0.8, 0.1], [0.9, 0.05]]
    side = speculative.Drafting.__new__(speculative.Drafting)
    side.L = 4
    draft = speculative.Draft([7, 8, 9], [0.5, 0.8, 0.9], top_ids=top_ids, top_probs=top_probs)
    first = Hypothesis(0, 9, pytest.approx(0.3))
    assert side.leaves(draft, 3) == [first, Hypothesis(1, 4, pytest.approx(0.05)), Hypothesis(2, 3, pytest.approx(0.02))]
    assert side.leaves(draft, 3, 0.2) == [first]


def test_auto_measures_and_refuses_nonsense():
    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    rounds = []
    out = generate(target, PROMPTS, max_new_tokens=30, stop_ids=[], drafter=drafter, on_round=rounds.append,
                   spec=SpecConfig(mode="sync", verify_min_prob="auto"))
    assert out.tokens == reference(target, PROMPTS, 30)
    n, p = len(PROMPTS), RowPrice().prior_at(max(map(len, PROMPTS)) + 1)  # the prior first, at the longest context
    assert all(0 <= r.min_prob <= 1 for r in rounds) and rounds[0].min_prob == pytest.approx(n * p / (1 - p + n * p))
    with pytest.raises(ValueError, match="verify_min_prob='sometimes'"):
        generate(target, PROMPTS, max_new_tokens=3, drafter=drafter,
                 spec=SpecConfig(mode="sync", verify_min_prob="sometimes"))


def test_the_prior_grows_with_the_context_a_row_attends_over():
    """Before b is measured, one row's share of a pass grows with the context: a verified row attends over every
    cached token, as the step does. At 2,000 tokens it is about a fifth (a 16-row copy had taken 4x a step's time
    under the short-context prior); a short prompt keeps about the prior validation chose. Measured, R * b is what it
    is at any context."""
    p = RowPrice(prior=0.05)
    assert p.prior_at(0) == 0.05 and p.min_prob() == 0.05
    assert 0.05 < p.prior_at(200) < 0.075 and 0.17 < p.prior_at(2000) < 0.21 and 0.3 < p.prior_at(10 ** 7) < 0.5
    p.context = 2000
    assert p.min_prob() == p.prior_at(2000)
    p.batch = 4
    assert p.min_prob() == pytest.approx(4 * p.prior_at(2000) / (1 + 3 * p.prior_at(2000)))
    p.batch = 1
    feed(p, [16, 3, 5, 16, 2, 4, 16, 3])
    assert p.min_prob() == pytest.approx(0.2)  # 20 tok/s x 10 ms a row, whatever the context


def play(price, rounds, drafting_rate, step_rate=10.0, rows=1):
    """``rounds`` rounds as ``price.draft`` chooses them: drafting rounds commit ``drafting_rate`` tokens a
    second, plain steps ``step_rate``; returns the choices."""
    kinds = []
    for _ in range(rounds):
        kind = price.draft(rows)
        price.observe(rows, 0.1, (drafting_rate if kind else step_rate) * 0.1, 0.1, drafted=kind)
        kinds.append(kind)
    return kinds


def test_a_batch_starts_from_the_prior_scaled_to_its_rows_and_no_ceiling_caps_the_price():
    """Before a slope is measured a batch of n rows starts at R * b = n b / (a + n b), a step costing a + n b,
    from one row's prior p = b / (a + b): n p / (1 - p + n p). Measured, R * b is not capped below 1."""
    p = RowPrice(prior=0.05)
    assert p.min_prob() == 0.05
    p.draft(16)
    assert p.min_prob() == pytest.approx(16 * 0.05 / (0.95 + 16 * 0.05))  # 0.457
    q = RowPrice()
    feed(q, [16, 24] * 10, per_row=0.04)  # 20 tok/s x 40 ms a row
    assert q.min_prob() == pytest.approx(0.8)


def test_a_batch_asks_no_drafter_while_a_verified_row_costs_too_much():
    """``BATCH_DRAFT_LIMIT``: where R * b is 0.3 or more, a batch takes plain steps and never probes drafting,
    however fast it would be (a 2-core CPU at batch 16); below it the gate decides; one sequence has no limit."""
    assert RowPrice(prior=0.2).draft(8) is False  # the prior scaled to 8 rows: 0.67
    assert not any(play(RowPrice(prior=0.2), 40, 30.0, rows=8))
    assert sum(play(RowPrice(prior=0.02), 40, 30.0, rows=8)) > 30  # 0.14: tried, kept (drafting 3x as fast)
    assert sum(play(RowPrice(prior=0.2), 40, 30.0, rows=1)) > 30
    q = RowPrice(min_rows=2)
    feed(q, [8, 12] * 10, per_row=0.02)  # measured: 20 tok/s x 20 ms a row = 0.4
    assert q.min_prob() >= BATCH_DRAFT_LIMIT and not any(q.draft(8) for _ in range(100))
    q.observe(8, 0.1, 1, 0.1, drafted=False)  # plain steps: 10 tok/s, drafting's rounds 20
    feed(q, [8, 12] * 40, per_row=0.001)  # rows became cheap: after probe_every rounds in a row the gate decides
    assert q.min_prob() < BATCH_DRAFT_LIMIT
    assert [q.draft(8) for _ in range(q.probe_every)] == [False] * (q.probe_every - 1) + [True]


def test_a_batch_drafts_while_drafting_rounds_commit_faster_than_plain_steps():
    """``RowPrice.draft``: below ``min_rows`` always draft; else try both kinds once, then take the
    faster, probing the other every ``probe_every``-th round (here never backing off), and follow a
    change of which is faster. A batch counts every round (its first drafting round too: a batch's
    rounds were validated that way) and probes for one round, its old rate kept."""
    p = RowPrice(probe_every=4, probe_most=4, min_rows=2, prior=0.02)
    assert all(p.draft(1) for _ in range(10))
    assert p.draft(8) is True
    p.observe(8, 0.1, 8, 0.1, drafted=True)  # drafting: 80 tok/s
    assert p.draft(8) is False
    p.observe(8, 0.1, 20, 0.1, drafted=False)  # plain steps: 200 tok/s
    kinds = [p.draft(8) for _ in range(8)]
    assert kinds.count(True) == 2 and kinds[3] is True and kinds[7] is True  # steps, a drafting probe every 4th
    for _ in range(12):
        p.observe(8, 0.2, 100, 0.2, drafted=True)  # drafting became faster (500 tok/s)
    assert p.draft(8) is True


def test_probes_back_off_while_the_faster_kind_stays_and_restart_when_it_changes():
    """One sequence too (min_rows 1), the defaults: drafting is tried first (its catch-up pass, then 4
    counted rounds), then a step; plain steps are probed a round at a time after 4, 8, 16 rounds while
    drafting stays faster; once plain steps are faster, drafting is probed afresh (its catch-up pass and 4
    counted rounds) after 8, then 16 rounds."""
    p = RowPrice(probe_every=4, probe_most=16)
    kinds = play(p, 48, 30.0)
    assert [i for i, k in enumerate(kinds) if not k] == [5, 9, 17, 33]
    kinds = play(p, 60, 5.0)  # drafting slowed down to 5 tok/s: the mean of 10 rounds follows it
    assert [i for i, k in enumerate(kinds) if k][-15:] == [*range(23, 28), *range(35, 40), *range(55, 60)]
    with pytest.raises(ValueError, match="drafting_samples"):
        RowPrice(drafting_samples=0)


def test_the_drafters_catch_up_passes_count_as_neither_kind():
    """The drafter's first pass (it feeds its cache the prompt) and its first after plain steps (their
    tokens) cost what no steady drafting round does: neither kind's rate moves. Before, the prompt's
    prefill alone made drafting look 2-3x slower than steps (docs/results/cut-batch1/)."""
    p = RowPrice()
    p.observe(1, 0.1, 1, 1.0, drafted=True)  # the prefill: 1 tok/s
    assert p.by_kind[True] == [None, None] and p.draft(1) is True
    p.observe(1, 0.1, 3, 0.1, drafted=True)
    p.observe(1, 0.1, 1, 0.1, drafted=False)
    p.observe(1, 0.1, 1, 0.9, drafted=True)  # the catch-up after the step
    assert p.by_kind[True] == [3, 0.1]
    p.observe(1, 0.1, 16, 0.1, drafted=None)  # copies do not make the drafter's cache stale
    p.observe(1, 0.1, 2, 0.1, drafted=True)
    assert p.by_kind[True] == [pytest.approx(2.5), pytest.approx(0.1)]  # a mean of the first rounds


def test_the_first_drafting_round_of_a_generation_does_not_count():
    """In a decoder: the round whose drafter pass fed the prompt leaves drafting's rate unmeasured; the
    next drafting round counts; the output is ar's."""
    target = tiny_target(seed=3)
    drafter = random_drafter(target, 4, seed=4)
    prompt = list(range(1, 13))
    spec = resolved_spec(target, drafter, SpecConfig(mode="sync", lookup=0, leaves=0, verify_min_prob="auto"))
    dec = speculative.SpeculativeDecoder(target, drafter, spec, 1, len(prompt) + 16)
    seq = Sequence(prompt, 8)
    dec.admit([seq])
    dec.step()
    assert dec.price.rounds == 1 and dec.price.by_kind[True] == [None, None]
    dec.step()
    assert dec.price.by_kind[True][0] is not None
    while dec.step():
        pass
    dec.close()
    assert seq.output == reference(target, [prompt], 8)[0]


def test_rounds_of_copies_only_count_as_neither_kind():
    """A round whose every row had a copied draft (``drafted=None``) moves neither kind's rate."""
    p = RowPrice()
    for _ in range(3):  # the drafter's catch-up pass, then two counted rounds
        p.observe(1, 0.1, 3, 0.1, drafted=True)
    p.observe(1, 0.1, 1, 0.1, drafted=False)
    before = {k: list(v) for k, v in p.by_kind.items()}
    for _ in range(10):
        p.observe(1, 0.1, 16, 0.1, drafted=None)  # long cheap copies
    assert p.by_kind == before and p.draft(1) is True


def test_a_batch_whose_drafts_never_pay_takes_plain_steps_and_equals_ar():
    """Rows told to step get an empty draft (a verification of the anchor alone): the output stays ar's."""
    target = tiny_target(seed=3)
    drafter = random_drafter(target, 4, seed=4)
    ref = reference(target, PROMPTS, 24)
    rounds = []
    out = generate(target, PROMPTS, max_new_tokens=24, stop_ids=[], drafter=drafter, on_round=rounds.append,
                   spec=SpecConfig(mode="sync", lookup=0, leaves=0, verify_min_prob="auto"))
    assert out.tokens == ref
    assert any(not r.draft for r in rounds) and any(r.draft for r in rounds)  # both kinds ran
    assert not any(r.successor_used for r in rounds)


def test_plain_greedy_steps_take_the_targets_argmax_as_ar_does(monkeypatch):
    """Rounds that all take plain steps skip acceptance (nothing to accept) and take the argmax ar takes:
    the output is ar's, in fp32 and bf16, in a batch and for one sequence."""
    monkeypatch.setattr(RowPrice, "draft", lambda self, rows: False)
    for dtype in (torch.float32, torch.bfloat16):
        target = tiny_target(seed=5).to(dtype)
        drafter = random_drafter(target, 4, seed=6)
        drafter.model.to(dtype)
        rounds = []
        out = generate(target, PROMPTS, max_new_tokens=12, stop_ids=[], drafter=drafter, on_round=rounds.append,
                       spec=SpecConfig(mode="sync", lookup=0, leaves=0, verify_min_prob="auto"))
        assert out.tokens == reference(target, PROMPTS, 12) and rounds and not any(r.draft for r in rounds)
        one = generate(target, PROMPTS[2:3], max_new_tokens=12, stop_ids=[], drafter=drafter,
                       spec=SpecConfig(mode="sync", lookup=0, leaves=0, verify_min_prob="auto"))
        assert one.tokens == reference(target, PROMPTS[2:3], 12)


def test_the_successor_threshold_is_the_exposed_pass_over_the_draft_it_saves():
    p = RowPrice()
    assert p.successor_threshold() == 0.5  # nothing measured: the prior
    p.observe_drafter("draft", 0.010, 1)
    assert p.successor_threshold() == 0.5
    p.observe_drafter("hypotheses", 0.009, 1)
    assert p.successor_threshold() == pytest.approx(0.9)  # a CPU: the pass costs about what a hit saves
    for _ in range(30):
        p.observe_drafter("hypotheses", 0.0, 2)  # hidden behind verification (a second CUDA stream)
    assert p.successor_threshold() < 0.01
    p.observe_drafter("draft", 0.5, 0)  # no rows: nothing learned
    assert p.per_row["draft"] == pytest.approx(0.010)


def test_auto_successor_threshold_keeps_greedy_output():
    target = tiny_target(seed=8)
    drafter = random_drafter(target, 4, seed=9)
    out = generate(target, PROMPTS, max_new_tokens=20, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode="async", successor_threshold="auto", lookup=0, verify_min_prob=0.0))
    assert out.tokens == reference(target, PROMPTS, 20)
    assert SpecConfig.parse("async successor_threshold=auto").successor_threshold == "auto"
    with pytest.raises(ValueError, match="successor_threshold"):
        SpecConfig(mode="async", successor_threshold="sometimes").check()


def test_the_drafter_catching_up_is_left_out_of_the_rate():
    """R is the rate of the rounds to come: one sequence's round whose drafter pass caught its cache up (the first
    drafting round, or the first after plain steps) does not enter it, though its rows still time b."""
    price = RowPrice()
    price.batch = 1
    price.observe(rows=3, verify_seconds=0.02, tokens=1, round_seconds=0.65, drafted=True)  # a long prompt's catch-up
    price.observe(rows=1, verify_seconds=0.015, tokens=1, round_seconds=0.016, drafted=False)
    assert price.rate() == pytest.approx(1 / 0.016)
    price.observe(rows=3, verify_seconds=0.02, tokens=2, round_seconds=0.03, drafted=True)  # catches up after a step
    assert price.rate() == pytest.approx(1 / 0.016) and price.rated == 1  # ... and is not a round of the rate either
    price.observe(rows=3, verify_seconds=0.02, tokens=2, round_seconds=0.04, drafted=True)  # a drafting round counts
    assert 2 / 0.04 < price.rate() < 1 / 0.016 and price.rated == 2
    batch = RowPrice()
    batch.batch = 4  # batches keep what they were validated with: every round counts
    batch.observe(rows=8, verify_seconds=0.05, tokens=4, round_seconds=0.6, drafted=True)
    assert batch.rate() == pytest.approx(4 / 0.6)
