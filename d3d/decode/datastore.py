"""Drafting from a datastore: the target's own earlier text, indexed for lookup (REST, He et al. 2024).

Copying from the context (``d3d.decode.lookup``) drafts what this answer repeats. A datastore drafts what
the target tends to say: its greedy answers to many requests (an answer store,
``d3d.data.answers``) hold its phrasing ("Here's the completed function:", "This function
takes ...", "    return ") far more often than a 2-layer drafter predicts it. Where the context's
last k tokens (the longest k in [``min_ngram``, ``max_ngram``] the store holds) occurred in the
store, the draft is the continuation most of those occurrences share, token by token:

    matches   the occurrences of the last k tokens (an evenly spaced sample of at most ``sample``)
    d_1       the commonest next token among them; confidence c_1 = its share
    d_2 ...   the commonest next token among the occurrences that agreed so far; c_2 its share there

The confidences are the draft's ``Draft.confidence``: ``verify_min_prob`` cuts the chain where their
product falls below it, and a chain whose c_1 is below ``min_confidence`` is not used (the drafter
drafts that row). Like any draft it is verified, so the output stays the target's.

Offline probe (``docs/results/datastore/probe.py``; index: the store's first 23,224 answers, 2.50M
tokens; probe: the target's answers to requests about other functions, walked as the engine would;
figures in docs/results/datastore/README.md): outside the rounds a context copy takes, the store
proposes a chain in about half the rounds; chains with a high c_1 accept more drafts than the
drafter's rounds do, those with a low one few, and a store lookup costs far less than a drafter
pass. On validation requests (docs/results/datastore/) sync with the store is a little faster than
without on code and explanations, at about the same τ, by skipping half the drafter passes. With
raw shares as estimates (prior 0) and no leaves it had been slower: chains backed by one occurrence
claimed certainty and 8-10 drafts a round were verified.

Index: the store's tokens (answers, each followed by a separator) and the positions of every token
sorted by the ``max_ngram`` tokens that start there (stable sorts, least significant first); the
occurrences of a k-gram (k <= ``max_ngram``) are one contiguous range of that order, found by
binary search. 2.5M tokens: ~20 MB of ``array('i')``, built in a few seconds.
"""

from __future__ import annotations

import copy
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .lookup import longest_suffix
from .sources import Draft, Origin

SEPARATOR = -1  # between answers: never matched, never drafted


@dataclass
class Chain:
    """A datastore's draft: tokens d_1..d_n, the estimated probability of each given the ones before
    (``confidence``), the likeliest tokens per position with theirs (``top_ids`` / ``top_probs``, the
    draft's token first: what bonus leaves are built from), and the evidence: ``support[d]`` =
    (occurrences that agreed up to d, those of them that continue with d's token)."""

    tokens: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_probs: list[list[float]] = field(default_factory=list)
    support: list[tuple[int, int]] = field(default_factory=list)


class Datastore:
    """Token sequences (``docs``: lists of ids) indexed for ``chain`` lookups.

    ``min_ngram`` / ``max_ngram``: the shortest / longest context suffix matched (the longest found
    wins); ``sample``: occurrences considered per lookup; ``prior``: the estimate of a draft's
    probability is c / (n + prior) for c of n agreeing occurrences. A single occurrence is weak
    evidence: its continuation was accepted at 52% of 15,518 drafted positions, 2 of 2 at 71%, 10+
    unanimous at 91-97%; prior 1 fits best (mean squared error 0.196 against 0.286 for the raw share
    and 0.208 / 0.241 for priors 2 / 4; ``docs/results/datastore/calibrate.txt``); ``min_confidence``: the least estimate for
    the first draft (else no chain: the drafter drafts); ``top``: likeliest tokens kept per position."""

    def __init__(self, docs: list[list[int]], min_ngram: int = 3, max_ngram: int = 8, sample: int = 256,
                 prior: float = 1.0, min_confidence: float = 0.0, top: int = 3):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"Datastore: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if sample < 1 or top < 1:
            raise ValueError(f"Datastore: sample={sample} and top={top} must be >= 1")
        if any(t < 0 for d in docs for t in d):
            raise ValueError("Datastore: token ids must be >= 0")
        self.min_ngram, self.max_ngram, self.sample, self.top = min_ngram, max_ngram, sample, top
        self.min_confidence, self.prior = check_estimates(min_confidence, prior)
        flat = [t for d in docs for t in (*d, SEPARATOR)]
        self.tokens = array("i", flat)
        self.order = array("i", sorted_starts(torch.tensor(flat, dtype=torch.int32), max_ngram).tolist())
        self.num_docs = len(docs)

    def at(self, min_confidence: float | None = None, prior: float | None = None) -> "Datastore":
        """The same index with another ``min_confidence`` / ``prior`` (the arrays are shared, not copied)."""
        other = copy.copy(self)
        other.min_confidence, other.prior = check_estimates(
            self.min_confidence if min_confidence is None else min_confidence, self.prior if prior is None else prior)
        return other

    def __len__(self) -> int:
        return len(self.tokens) - self.num_docs

    def occurrences(self, gram: list[int]) -> range:
        """The range of ``order`` whose positions start with ``gram`` (len(gram) <= max_ngram)."""
        k, key = len(gram), array("i", gram)
        lo = bisect_left(self.order, key, key=lambda p: self.tokens[p:p + k])
        hi = bisect_right(self.order, key, lo=lo, key=lambda p: self.tokens[p:p + k])
        return range(lo, hi)

    def chain(self, context: list[int], max_len: int) -> Chain:
        """Up to ``max_len`` drafts after ``context`` (module docstring), from the longest suffix of
        ``context`` (``min_ngram``+ tokens) that occurs with something after it; an empty ``Chain``
        where none does, or where the first draft's estimate is below ``min_confidence``."""
        def walk_after(suffix: list[int]) -> Chain | None:
            found = self.occurrences(suffix)
            step = max(1, len(found) / self.sample)
            starts = [self.order[found.start + int(i * step)] + len(suffix) for i in range(min(len(found), self.sample))]
            walk = majority_walk([self.tokens[s:s + max_len] for s in starts], self.top)
            return self.estimate(walk) if walk else None  # else no occurrence, or each ended its answer

        chain = longest_suffix(context, self.min_ngram, self.max_ngram, walk_after)
        return chain if chain and chain.confidence[0] >= self.min_confidence else Chain()

    origin = Origin.DATASTORE  # a draft source (d3d.decode.sources): counted as GenerationStats.datastore_drafts

    def propose(self, seq, max_len: int) -> Draft | None:
        """``chain`` after the tokens of ``seq`` (a ``d3d.decode.sequence.Sequence``) as a draft source's
        ``Draft`` (its estimates, and its runner-up tokens for leaves)."""
        found = self.chain(seq.tokens, max_len)
        return Draft(found.tokens, found.confidence, found.top_ids, found.top_probs) if found.tokens else None

    def estimate(self, walk: list[tuple[int, list[tuple[int, int]]]]) -> Chain:
        """A ``majority_walk``'s counts as probabilities c / (n + prior)."""
        chain = Chain()
        for n, column in walk:
            chain.tokens.append(column[0][0])
            chain.confidence.append(column[0][1] / (n + self.prior))
            chain.top_ids.append([t for t, _ in column])
            chain.top_probs.append([c / (n + self.prior) for _, c in column])
            chain.support.append((n, column[0][1]))
        return chain


def check_estimates(min_confidence: float, prior: float) -> tuple[float, float]:
    if not 0 <= min_confidence <= 1:
        raise ValueError(f"Datastore: min_confidence={min_confidence} must be in [0, 1]")
    if prior < 0:
        raise ValueError(f"Datastore: prior={prior} must be >= 0")
    return min_confidence, prior


def majority_walk(continuations: list, top: int = 1) -> list[tuple[int, list[tuple[int, int]]]]:
    """Depth by depth, among the continuations that agreed so far (n of them): the ``top`` commonest
    next tokens with their counts, commonest first (ties: the smaller id), the first being the
    walk's token; stops at the end of every continuation (a separator or the store's end).
    Returns [(n, [(token, count), ...]) per depth]."""
    walk, rows = [], continuations
    for d in range(max((len(c) for c in continuations), default=0)):
        column = Counter(c[d] for c in rows if d < len(c) and c[d] != SEPARATOR)
        if not column:
            break
        ranked = sorted(column.items(), key=lambda tc: (-tc[1], tc[0]))[:top]
        walk.append((len(rows), ranked))
        rows = [c for c in rows if d < len(c) and c[d] == ranked[0][0]]
    return walk


def sorted_starts(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """Every position of ``tokens`` (int32 [N]) ordered by the ``width`` tokens starting there
    (past the end: below every token), ties by position: LSD radix order by stable sorts."""
    n = tokens.numel()
    padded = torch.cat([tokens.long(), torch.full((width,), -2, dtype=torch.long)])
    order = torch.arange(n)
    for j in range(width - 1, -1, -1):
        order = order[torch.sort(padded[order + j], stable=True).indices]
    return order


def load_datastore(paths, target=None, **kw) -> Datastore:
    """A datastore of the answers in one answer store directory (``d3d.data.answers``) or several, in order; with
    ``target``, refused unless every store's answers are that target's: its fingerprint, or the real model it was
    loaded as (``d3d.fetch``) where the manifest names the one that answered (another checkpoint of it: the HF
    weights against the GGUF's blocks)."""
    from ..data.answers import read_manifest, sealed_answers, target_fingerprint
    from ..fetch import real_model_name

    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not paths:
        raise ValueError("load_datastore: no answer store directory given")
    mine = target_fingerprint(target) if target is not None else None
    name = real_model_name(target.source) if target is not None else None
    answers = []
    for path in paths:
        manifest = read_manifest(path)
        if mine is not None and manifest["target"] != mine and (name is None or manifest.get("model") != name):
            raise ValueError(f"{path}: the answers of another model (fingerprint {manifest['target']}, model "
                             f"{manifest.get('model')}; this target's {mine}, {name}); its phrasing would not be "
                             "this target's")
        answers += [a.answer for a in sealed_answers(path, manifest)]
    return Datastore(answers, **kw)


__all__ = ["Datastore", "Chain", "load_datastore", "majority_walk", "sorted_starts", "SEPARATOR"]
