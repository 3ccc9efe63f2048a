"""Outcome hypotheses: the drafter's estimate of each verification outcome, checked by enumeration."""

from __future__ import annotations

import itertools
import math

import pytest

from d3d.decode.hypotheses import Hypothesis, matching, outcome_hypotheses


def brute_force(drafts, dists):
    """P(a, b) for every outcome by walking the drafter's distributions position by position."""
    out = {}
    for a in range(len(drafts) + 1):
        p_prefix = math.prod(dists[j][drafts[j]] for j in range(a))
        if a == len(drafts):
            out[(a, None)] = p_prefix
            continue
        for b, q in dists[a].items():
            if b != drafts[a]:
                out[(a, b)] = p_prefix * q
    return out


@pytest.mark.parametrize("fanout", [1, 2, 3])
@pytest.mark.parametrize("k", [1, 3, 20])
def test_scores_and_order_match_enumeration(k, fanout):
    dists = [{5: 0.6, 7: 0.3, 9: 0.1}, {2: 0.5, 4: 0.45, 6: 0.05}, {8: 0.9, 1: 0.06, 3: 0.04}]
    drafts = [5, 2, 8]  # the argmax at each position
    top = [sorted(d.items(), key=lambda kv: -kv[1])[:fanout + 1] for d in dists]
    hyps = outcome_hypotheses(drafts, [d[t] for d, t in zip(dists, drafts)], [[t for t, _ in tp] for tp in top],
                              [[p for _, p in tp] for tp in top], k, fanout)
    exact = brute_force(drafts, dists)
    allowed = {(a, b) for a, tp in enumerate(top) for b, _ in tp if b != drafts[a]} | {(3, None)}
    expected = sorted(((p, key) for key, p in exact.items() if key in allowed), key=lambda x: -x[0])[:k]
    assert [(h.accepted, h.bonus) for h in hyps] == [key for _, key in expected]
    for h in hyps:
        assert h.score == pytest.approx(exact[(h.accepted, h.bonus)])
    assert all(h.bonus != drafts[h.accepted] for h in hyps if h.bonus is not None)  # a rejected draft is no bonus
    assert len(hyps) == min(k, len(allowed))


def test_all_accepted_scores_the_product_of_confidences():
    hyps = outcome_hypotheses([1, 2], [0.9, 0.8], [[1, 3], [2, 4]], [[0.9, 0.1], [0.8, 0.2]], k=10, fanout=1)
    assert Hypothesis(2, None, pytest.approx(0.72)) in hyps
    assert [(h.accepted, h.bonus) for h in hyps] == [(2, None), (1, 4), (0, 3)]
    assert sum(h.score for h in hyps) == pytest.approx(1.0)  # with all alternatives listed, a distribution


def test_matching_uses_the_block_guess():
    hyps = [Hypothesis(2, None, 0.5), Hypothesis(0, 7, 0.2), Hypothesis(1, 4, 0.1)]
    guesses = [9, 7, 4]  # hypothesis 0's block guessed bonus 9
    assert matching(hyps, guesses, 2, 9) == 0
    assert matching(hyps, guesses, 2, 8) is None  # all accepted, but the guess was wrong
    assert matching(hyps, guesses, 0, 7) == 1 and matching(hyps, guesses, 1, 4) == 2
    assert matching(hyps, guesses, 1, 7) is None
    assert all(matching(hyps, guesses, a, b) is None for a, b in itertools.product(range(3), [0, 1]))
