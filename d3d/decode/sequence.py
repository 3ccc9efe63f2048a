"""One request from admission to its last token: a ``Sequence``.

Every decoder (``d3d.decode.engines.ArDecoder``, ``d3d.decode.speculative.SpeculativeDecoder``,
``d3d.decode.dflash.DFlashDecoder``) holds the Sequences it decodes, one per cache row, and every
caller (``generate``, the server's scheduler, continuous batching) makes them. A Sequence carries
what its request asked (the prompt, the token limit, the stop ids, its ``Sampling`` and, once
admitted, the resolved ``SpecConfig`` it decodes with), what decoding has made of it (the committed
tokens, the draft it holds for its next round and where that came from, whether it ended and why),
where it lives (its cache row, its random stream) and its own counts (``Tally``), which the
generation's statistics sum (``GenerationStats.add``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import Sampling
from .lookup import NgramIndex
from .sources import Draft, Origin

if TYPE_CHECKING:
    import torch

    from .config import SpecConfig


class Tally:
    """What one sequence's speculative rounds did; lists sized for ``block_size`` B (accept lengths 0..B-1)."""

    def __init__(self, block_size: int = 0):
        self.rounds = 0
        self.accept_hist = [0] * block_size  # accept_hist[a]: rounds that accepted a drafts
        self.verified_drafts = self.verified_leaves = 0
        self.leaf_hits = 0  # rounds whose bonus was a verified leaf
        self.drafts = dict.fromkeys(Origin, 0)  # rounds by where their draft came from
        self.successor_hits = 0  # async: rounds whose outcome a hypothesis had drafted
        self.fallbacks = 0  # async: rounds with hypotheses none of which matched
        self.hits_by_accept = [0] * block_size  # async: hits_by_accept[a]: hits in rounds accepting a

    @property
    def tau(self) -> float:
        return mean_tokens_per_round(self.accept_hist, self.rounds)


def mean_tokens_per_round(accept_hist: list[int], rounds: int) -> float:
    """τ: the tokens a round committed (accepted drafts + 1), on average over ``rounds``."""
    return sum((a + 1) * c for a, c in enumerate(accept_hist)) / rounds if rounds else 0.0


class Sequence:
    """One request's state (module docstring). ``tokens``: the committed tokens, prompt first; the last
    is the anchor. ``id``: the caller's name for it (``generate``: the prompt's index), what ``stream``
    and ``RoundInfo.seq`` report. ``gen``: its random stream at T > 0; sequences may share one
    (``generate``'s batch draws from one stream), else it gets its own, seeded by ``sampling.seed``,
    when admitted."""

    def __init__(self, prompt: list[int], max_new: int, sampling: Sampling = Sampling(),
                 stop_ids: set[int] | frozenset[int] = frozenset(), id: int = 0,
                 gen: "torch.Generator | None" = None):
        self.tokens, self.num_prompt = list(prompt), len(prompt)
        self.max_new, self.sampling, self.stop_ids, self.id, self.gen = max_new, sampling, stop_ids, id, gen
        self.spec: "SpecConfig | None" = None  # the resolved spec of the decoder that admitted it (None: ar)
        self.row: int | None = None  # its cache row in that decoder
        self.draft: Draft | None = None  # the draft it holds for its next round
        self.origin: Origin | None = None  # ... and where that came from
        self.draft_from = 0  # the first committed token its drafter cache holds (d3d.decode.speculative.DRAFT_WINDOW)
        self.ngrams: NgramIndex | None = None  # context lookup's index of the tokens' n-grams (d3d.decode.sources)
        self.stopped = False  # ended on a stop token (else at max_new, or dropped)
        self.done = False
        self.tally = Tally()

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def output(self) -> list[int]:
        """The generated tokens (a stop token, when hit, is the last)."""
        return self.tokens[self.num_prompt:]

    def output_since(self, n: int) -> list[int]:
        """The generated tokens after the first ``n``."""
        return self.tokens[self.num_prompt + n:]

    def commit(self, new: list[int]) -> list[int]:
        """Append ``new``, cut at the first stop token or at ``max_new`` tokens; returns what was kept."""
        new = new[:self.max_new - self.num_output]
        for j, t in enumerate(new):
            if t in self.stop_ids:
                new = new[:j + 1]
                self.stopped = True
                break
        self.tokens.extend(new)
        if self.stopped or self.num_output >= self.max_new:
            self.done = True
        return new


def all_greedy(seqs: list[Sequence]) -> bool:
    """Whether every one of ``seqs`` decodes greedily: a pass for them needs each row's argmax only
    (``Transformer.forward(greedy=True)``)."""
    return all(s.sampling.temperature == 0 for s in seqs)


__all__ = ["Sequence", "Tally", "mean_tokens_per_round", "all_greedy"]
