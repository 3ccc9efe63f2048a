"""Outcome hypotheses: the verification outcomes async D3D drafts a successor block for.

A round verifies n = B-1 drafts d_1..d_n. Its outcome is (a, b): the target accepts the first a
drafts and commits its own token b after them (the bonus). If the next round's draft is to be ready
when verification ends, it must be drafted *before* (a, b) is known, so async drafts it for the
likeliest outcomes and keeps the one that happens, if any (SSD / Saguaro, Kumar, Dao, May 2026,
pre-draft per (accept length, bonus) in the same way).

The drafter's own distributions q_j at each draft position estimate the outcome probabilities.
With c_j = q_j(d_j) (its confidence in its draft):

    P(a, b) = c_1 ... c_a * q_(a+1)(b)      a < n, b != d_(a+1)   (accept a, reject d_(a+1), bonus b)
    P(n)    = c_1 ... c_n                                          (all accepted; bonus guessed later)

A rejected draft is never the bonus (at T = 0 the target's argmax differs from it; at T > 0 the
residual distribution max(0, p - q) is zero there), so b ranges over the drafter's most probable
tokens at position a+1 other than d_(a+1): ``fanout`` of them per accept length. For "all accepted"
the successor is an all-mask block whose first position guesses the bonus.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hypothesis:
    accepted: int  # a: the verification accepts the first a drafts
    bonus: int | None  # b: the target's token after them; None: all accepted, the drafter guesses b
    score: float  # the drafter's estimate of P(outcome)


def outcome_hypotheses(drafts: list[int], confidence: list[float], top_ids: list[list[int]],
                       top_probs: list[list[float]], k: int, fanout: int) -> list[Hypothesis]:
    """The ``k`` most probable outcomes of verifying ``drafts`` (most probable first).

    drafts, confidence: [n] the drafted tokens and the drafter's probability of each.
    top_ids, top_probs: [n][fanout + 1] its most probable tokens at each position (the draft among
        them at T = 0) and their probabilities.
    """
    candidates, prefix = [], 1.0  # prefix = c_1 ... c_a
    for a, (d, c, ids, probs) in enumerate(zip(drafts, confidence, top_ids, top_probs)):
        others = [(b, p) for b, p in zip(ids, probs) if b != d][:fanout]
        candidates.extend(Hypothesis(a, b, prefix * p) for b, p in others)
        prefix *= c
    candidates.append(Hypothesis(len(drafts), None, prefix))
    return sorted(candidates, key=lambda h: -h.score)[:k]


def bonus_leaves(drafts: list[int], confidence: list[float], top_ids: list[list[int]], top_probs: list[list[float]],
                 n: int, k: int) -> list[Hypothesis]:
    """The ``k`` likeliest outcomes of verifying d_1..d_n (n <= len(drafts)) whose bonus is a token
    the drafter proposed, to verify as one-token leaves beside the drafts (most probable first).

    A leaf (a, b) is the token b at position a+1 after d_1..d_a, scored as above: for a < n, b is
    among the top tokens at a+1 other than the verified d_(a+1); for a = n < len(drafts) (the drafts
    the verification leaves out, ``verify_min_prob``) b may be any of them, d_(n+1) included.
    When the target's bonus after accepting a drafts is b, the leaf is accepted too and its own
    logits give the next token: the round commits a + 2 tokens instead of a + 1.
    """
    candidates, prefix = [], 1.0
    for a in range(min(n + 1, len(drafts), len(top_ids))):  # no top tokens (a copied draft): no leaves
        candidates.extend(Hypothesis(a, b, prefix * p) for b, p in zip(top_ids[a], top_probs[a])
                          if a == n or b != drafts[a])
        prefix *= confidence[a]
    return sorted(candidates, key=lambda h: -h.score)[:k]


def matching(hypotheses: list[Hypothesis], guesses: list[int], accepted: int, bonus: int) -> int | None:
    """Index of the hypothesis the outcome (accepted, bonus) matches, or None. ``guesses[m]``: the
    bonus hypothesis m's block put at its first position (its own for an all-accepted guess)."""
    for m, (h, g) in enumerate(zip(hypotheses, guesses)):
        if h.accepted == accepted and g == bonus:
            return m
    return None


__all__ = ["Hypothesis", "outcome_hypotheses", "bonus_leaves", "matching"]
