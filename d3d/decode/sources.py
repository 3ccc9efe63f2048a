"""Where a round's draft comes from: one shape, ``Draft``, whatever the source.

A source proposes, for one sequence, a chain d_1..d_n after its committed tokens with the estimated
probability of each given the ones before (``confidence``) and, where it has them, its likeliest
tokens per position (``top_ids`` / ``top_probs``: what leaves and hypotheses are made of). A round
asks, per row, until one answers (``d3d.decode.speculative.Drafting.prepare``):

    a hypothesis of the last round   ready when it matched that round's outcome (``d3d.decode.hypotheses``)
    ``ContextLookup``                the context repeats itself: copy what followed (``d3d.decode.lookup``)
    ``Datastore``                    what the target's earlier answers continued with (``d3d.decode.datastore``)
    ``ModelChain``                   a smaller model's greedy tokens, one step each (``d3d.decode.draft_model``)
    the drafter                      one batched pass for every row still without a draft

Every source but the drafter has ``origin`` (an ``Origin``: what a sequence's counts and
``GenerationStats`` file its drafts under) and ``propose(seq, max_len) -> Draft | None``: a draft after
the ``Sequence``'s committed tokens, which a source may keep an index of on it (``Sequence.ngrams``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .lookup import NgramIndex, lookup_copy


class Origin(Enum):
    """Where a round's draft came from (a sequence counts its rounds by it; ``--explain`` shows it)."""

    HYPOTHESIS = "hypothesis"  # the last round's hypothesis that matched its outcome (async)
    LOOKUP = "lookup"  # copied from the context (``ContextLookup``)
    DATASTORE = "datastore"  # the target's earlier answers (``d3d.decode.datastore``)
    MODEL = "model"  # a smaller model's greedy chain (``d3d.decode.draft_model``)
    DRAFTER = "drafter"  # one drafter pass
    STEP = "step"  # none: the batch skipped the drafter this round, a plain step


@dataclass
class Draft:
    """One sequence's draft for a round, on the host: tokens d_1..d_n, the drafter's probability of
    each, and its most probable tokens per position (what hypotheses are built from)."""

    tokens: list[int]
    confidence: list[float]
    top_ids: list[list[int]]
    top_probs: list[list[float]]
    guess: int | None = None  # the block's first token (the bonus it assumed)

    @property
    def certainty(self) -> float:
        p = 1.0
        for c in self.confidence:
            p *= c
        return p

    def likely_length(self, min_prob: float) -> int:
        """How many leading drafts the drafter believes in jointly with probability >= ``min_prob``
        (its estimate that verification accepts all of them)."""
        p, n = 1.0, 0
        for c in self.confidence:
            p *= c
            if p < min_prob:
                break
            n += 1
        return n

    def truncated(self, n: int) -> "Draft":
        return Draft(self.tokens[:n], self.confidence[:n], self.top_ids[:n], self.top_probs[:n], self.guess)


class ContextLookup:
    """Prompt lookup as a draft source: after a match of ``min_ngram``+ tokens, the tokens that
    followed, with ``d3d.decode.lookup``'s estimates as confidences (no runner-up tokens: no leaves).
    Each sequence keeps the index of its tokens' n-grams (``Sequence.ngrams``) from round to round."""

    origin = Origin.LOOKUP

    def __init__(self, min_ngram: int):
        self.min_ngram = min_ngram

    def propose(self, seq, max_len: int) -> Draft | None:
        if seq.ngrams is None or seq.ngrams.n != self.min_ngram:
            seq.ngrams = NgramIndex(self.min_ngram)
        found = lookup_copy(seq.tokens, self.min_ngram, max_len, index=seq.ngrams)
        return None if found is None else Draft(found.tokens, found.confidence, [], [])


def draft_sources(lookup: int, datastore=None, chain=None) -> list:
    """The sources a resolved spec's ``lookup``, ``datastore`` and ``draft_model`` (its ``ModelChain``) ask for, in
    the order a round asks them."""
    return [s for s in (ContextLookup(lookup) if lookup else None, datastore, chain) if s]


__all__ = ["Draft", "Origin", "ContextLookup", "draft_sources"]
