"""Drafting by lookup: when the text repeats itself, copy the draft from the context.

A chat model asked to complete a function restates the header and docstring it was given; code
repeats names, signatures and whole lines. Prompt lookup decoding (Saxena, 2023) drafts those
stretches for free: find the most recent earlier occurrence of the last n committed tokens and
propose the tokens that followed it. Nothing is learned and nothing runs on the device.

    context   ... def add(a, b):  # Add a and b. ... <|im_start|>assistant ... def add(a, b
    n = 3     the last three tokens "add", "(a", ", b" occurred before: propose what followed them,
              "):", "  #", " Add", ... (up to B-1 tokens)

The engines (``d3d.decode.speculative``, ``lookup=n``) use a copied chain instead of the drafter's block
whenever the last n tokens (or more, up to ``max_ngram``; the longest match wins) occurred before,
and the drafter otherwise. Verification keeps it lossless like any draft.

Measured (offline, the shipped Qwen drafter's sync rounds on 8 validation chat requests, 421 rounds):
a chain copied after a 3-token match exists in 47% of rounds, and there it accepts far more than the
drafter's block (τ over all rounds 2.02 for the drafter alone, 5.2 if the copied chain, capped at 15,
replaced the block whenever one existed; an upper-bound estimate, the rounds would fall differently).

How far a copy holds (``copy_confidence``, the chain's ``Draft.confidence``, which ``verify_min_prob``
cuts by): measured offline on 3,072 of the target's own answers (the answer store's chunks 7-9, 23,919
copied rounds; docs/results/copy-length/probe.txt). A copy after a match of 16 or more tokens is a
restatement: each copied token was accepted 97% of the time (11.4 a round). After a shorter match (3-15
tokens, 85% of the rounds) the first copied token was accepted 59% of the time and each later one more
often the longer the copy had held (0.65, 0.73, ... 0.95): 2.6 a round, so 15 verified copies mostly
cost rows for nothing where rows cost time.
"""

from __future__ import annotations

from dataclasses import dataclass

# P(copied token k accepted | tokens 1..k-1 accepted), k = 1..15, after a match of 3-15 tokens
# (docs/results/copy-length/probe.txt; positions past 15 keep the last value)
SHORT_MATCH = (0.59, 0.65, 0.73, 0.77, 0.80, 0.83, 0.86, 0.89, 0.90, 0.91, 0.93, 0.93, 0.94, 0.96, 0.95)
LONG_MATCH, LONG = 0.97, 16  # the same after a match of LONG or more tokens, at every position


@dataclass
class Copy:
    """A copied chain and the length of the match it follows (extended back past ``max_ngram``,
    up to ``LONG``): what its estimates depend on."""

    tokens: list[int]
    match: int

    @property
    def confidence(self) -> list[float]:
        return copy_confidence(self.match, len(self.tokens))


def copy_confidence(match: int, n: int) -> list[float]:
    """The estimated chance that each of n copied tokens is accepted given the ones before it were,
    after a match of ``match`` tokens (module docstring)."""
    if match >= LONG:
        return [LONG_MATCH] * n
    return [SHORT_MATCH[min(k, len(SHORT_MATCH) - 1)] for k in range(n)]


def lookup_copy(context: list[int], min_ngram: int, max_len: int, max_ngram: int = 8) -> Copy | None:
    """Up to ``max_len`` tokens that followed the most recent earlier occurrence of the context's
    last n tokens, for the largest n in [``min_ngram``, ``max_ngram``] that occurs; None if none does.

    context: the committed tokens (prompt + output), the last one the anchor.

    A plain scan, most recent position first: even with no match (the worst case) over thousands
    of tokens of context it is small beside a CPU round of the 0.5B target
    (docs/results/lookup/scan_cost.txt). An index of n-grams kept per sequence would make it
    constant per round, for long contexts on a GPU.
    """
    if min_ngram < 1 or max_len < 1:
        raise ValueError(f"lookup: min_ngram and max_len must be >= 1, got {min_ngram}, {max_len}")
    L = len(context)

    def copy_after(tail: list[int]) -> Copy | None:
        n = len(tail)
        for start in range(L - n - 1, -1, -1):  # most recent first; the match itself is excluded
            if context[start:start + n] == tail:
                m = n  # how far the match reaches back
                while m < LONG and start - (m - n) > 0 and context[start - (m - n) - 1] == context[L - m - 1]:
                    m += 1
                return Copy(context[start + n:start + n + max_len], m)
        return None

    return longest_suffix(context, min_ngram, min(max_ngram, L - 1), copy_after)


def longest_suffix(context: list[int], min_ngram: int, max_ngram: int, propose):
    """N-gram retrieval's one rule, for the context (``lookup_copy``) and the datastore
    (``d3d.decode.datastore``) alike: ``propose(suffix)`` for the context's suffixes of ``max_ngram``
    tokens down to ``min_ngram``; the first proposal that is not None (the longest match wins), or None."""
    for n in range(min(max_ngram, len(context)), min_ngram - 1, -1):
        found = propose(context[len(context) - n:])
        if found is not None:
            return found
    return None


def lookup_chain(context: list[int], min_ngram: int, max_len: int, max_ngram: int = 8) -> list[int]:
    """``lookup_copy``'s tokens; [] if nothing matched."""
    found = lookup_copy(context, min_ngram, max_len, max_ngram)
    return found.tokens if found else []


__all__ = ["lookup_chain", "lookup_copy", "longest_suffix", "copy_confidence", "Copy", "SHORT_MATCH", "LONG_MATCH", "LONG"]
