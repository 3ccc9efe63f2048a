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


def lookup_copy(context: list[int], min_ngram: int, max_len: int, max_ngram: int = 8,
                index: "NgramIndex | None" = None) -> Copy | None:
    """Up to ``max_len`` tokens that followed the most recent earlier occurrence of the context's
    last n tokens, for the largest n in [``min_ngram``, ``max_ngram``] that occurs; None if none does.

    context: the committed tokens (prompt + output), the last one the anchor.
    index: the context's ``NgramIndex`` (n = ``min_ngram``), kept from call to call as the context grows:
    the same answer from the earlier occurrences of the last ``min_ngram`` tokens alone. Without it, a
    plain scan of every position (the reference the tests hold the index to), whose cost grows with the
    context: 0.17 ms at 300 tokens, 2.5 ms at 4,000 (docs/results/lookup/scan_cost.txt), per sequence
    and round, where the index's stays flat (docs/results/lookup-index/).
    """
    if min_ngram < 1 or max_len < 1:
        raise ValueError(f"lookup: min_ngram and max_len must be >= 1, got {min_ngram}, {max_len}")
    L = len(context)
    if index is not None:
        return index_copy(context, index, min_ngram, max_len, min(max_ngram, L - 1))

    def copy_after(tail: list[int]) -> Copy | None:
        n = len(tail)
        for start in range(L - n - 1, -1, -1):  # most recent first; the match itself is excluded
            if context[start:start + n] == tail:
                return copy_at(context, start, n, max_len)
        return None

    return longest_suffix(context, min_ngram, min(max_ngram, L - 1), copy_after)


def copy_at(context: list[int], start: int, n: int, max_len: int) -> Copy:
    """The copy after a match of the last n tokens at ``start``, its length measured back up to ``LONG``."""
    L, m = len(context), n
    while m < LONG and start - (m - n) > 0 and context[start - (m - n) - 1] == context[L - m - 1]:
        m += 1
    return Copy(context[start + n:start + n + max_len], m)


class NgramIndex:
    """Where every n-gram of one growing token list starts (n = ``n``): a lookup reads the earlier
    occurrences of the list's last n tokens instead of scanning it. ``occurrences`` indexes what was
    appended since its last call; the list may only grow (a shorter one starts the index afresh)."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"NgramIndex: n must be >= 1, got {n}")
        self.n, self.starts, self.indexed = n, {}, 0  # starts[n-gram]: its start positions, ascending

    def occurrences(self, tokens: list[int]) -> list[int]:
        """The starts s of the earlier occurrences of ``tokens``' last n, ascending: those whose n-gram ends
        before the last token (s <= len - n - 1, as the scan's)."""
        n, end = self.n, len(tokens) - self.n  # n-grams starting before `end` end before the last token
        if end < self.indexed:
            self.starts, self.indexed = {}, 0
        for s in range(self.indexed, end):
            self.starts.setdefault(tuple(tokens[s:s + n]), []).append(s)
        self.indexed = max(self.indexed, end)
        return self.starts.get(tuple(tokens[end:]), []) if end > 0 else []


def index_copy(context: list[int], index: NgramIndex, min_ngram: int, max_len: int, top: int) -> Copy | None:
    """``lookup_copy`` through ``index``: each earlier occurrence of the last ``min_ngram`` tokens, most recent
    first, is extended back while it matches (up to ``top`` tokens); the longest wins, the most recent of
    equals, as the scan's longest n and most recent start do."""
    if index.n != min_ngram:
        raise ValueError(f"lookup: an index of {index.n}-grams for min_ngram={min_ngram}")
    L, g, best, at = len(context), min_ngram, 0, -1
    if top < g:
        return None
    for s in reversed(index.occurrences(context)):
        n = g
        while n < top and s + g - 1 - n >= 0 and context[s + g - 1 - n] == context[L - 1 - n]:
            n += 1
        if n > best:
            best, at = n, s
            if n == top:
                break
    return copy_at(context, at + g - best, best, max_len) if best else None


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


__all__ = ["lookup_chain", "lookup_copy", "NgramIndex", "longest_suffix", "copy_confidence", "Copy", "SHORT_MATCH", "LONG_MATCH", "LONG"]
