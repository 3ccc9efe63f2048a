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


def scored_outcomes(drafts: list[int], confidence: list[float], top_ids: list[list[int]], top_probs: list[list[float]],
                    n: int, per_position: int | None = None) -> tuple[list[Hypothesis], float]:
    """Every outcome (a, b) of verifying d_1..d_n with b among the drafter's top tokens at a+1, scored
    P(a, b) = c_1 ... c_a * q_(a+1)(b) (module docstring), and c_1 ... c_m, the chance that all m
    positions looked at are accepted. For a < n, b is not d_(a+1) (a rejected draft is never the
    bonus); for a = n < len(drafts) (drafts the verification leaves out) b may be d_(n+1) itself.
    ``per_position``: at most this many b per a (all the top tokens given: None). No top tokens (a
    copied draft): no outcomes."""
    candidates, prefix = [], 1.0
    for a in range(min(n + 1, len(drafts), len(top_ids))):
        others = [(b, p) for b, p in zip(top_ids[a], top_probs[a]) if a == n or b != drafts[a]]
        candidates.extend(Hypothesis(a, b, prefix * p) for b, p in others[:per_position])
        prefix *= confidence[a]
    return candidates, prefix


def outcome_hypotheses(drafts: list[int], confidence: list[float], top_ids: list[list[int]],
                       top_probs: list[list[float]], k: int, fanout: int) -> list[Hypothesis]:
    """The ``k`` most probable outcomes of verifying all ``drafts``, ``fanout`` bonus candidates per
    accept length and "all accepted" (bonus None: the drafter guesses it), most probable first; what
    async drafts successor blocks for.

    drafts, confidence: [n] the drafted tokens and the drafter's probability of each.
    top_ids, top_probs: [n][fanout + 1] its most probable tokens at each position (the draft among
        them at T = 0) and their probabilities.
    """
    candidates, all_accepted = scored_outcomes(drafts, confidence, top_ids, top_probs, len(drafts), fanout)
    candidates.append(Hypothesis(len(drafts), None, all_accepted))
    return sorted(candidates, key=lambda h: -h.score)[:k]


def bonus_leaves(drafts: list[int], confidence: list[float], top_ids: list[list[int]], top_probs: list[list[float]],
                 n: int, k: int) -> list[Hypothesis]:
    """The ``k`` likeliest outcomes of verifying d_1..d_n (n <= len(drafts)) whose bonus is a token
    the drafter proposed, to verify as one-token leaves beside the drafts (most probable first).
    When the target's bonus after accepting a drafts is such a leaf b, the leaf is accepted too and
    its own logits give the next token: the round commits a + 2 tokens instead of a + 1.
    """
    return sorted(scored_outcomes(drafts, confidence, top_ids, top_probs, n)[0], key=lambda h: -h.score)[:k]


def matching(hypotheses: list[Hypothesis], guesses: list[int], accepted: int, bonus: int) -> int | None:
    """Index of the hypothesis the outcome (accepted, bonus) matches, or None. ``guesses[m]``: the
    bonus hypothesis m's block put at its first position (its own for an all-accepted guess)."""
    for m, (h, g) in enumerate(zip(hypotheses, guesses)):
        if h.accepted == accepted and g == bonus:
            return m
    return None


__all__ = ["Hypothesis", "scored_outcomes", "outcome_hypotheses", "bonus_leaves", "matching"]
