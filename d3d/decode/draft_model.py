"""A smaller model of the target's tokenizer as a draft source (``draft_model``; the 1.5B's default beside the 0.5B,
``d3d.draft.pick.default_draft_model``): its greedy tokens, a step each, while they are likely enough to pay.

Classic speculative decoding (a draft model; Leviathan et al. 2023, Chen et al. 2023) as one more source of
``d3d.decode.sources``, asked after copies and before the block drafter. Beside Qwen2.5-Coder-1.5B its 0.5B sibling
takes the 1.5B's greedy token at 0.70 of free-writing positions and 0.91 of code ones, where the drafter's τ is
~1.05 / ~1.4; over the rows ``chain_vocabulary`` keeps, its step costs 0.31-0.40 of the 1.5B's. On validation prose
it gained 3.7% on average, code even (docs/results/draft-model/start/).

After the first token (always drafted) the chain takes another step while its joint probability times ``EXPECT``
(the next token's expected probability: the step that shows it costs a step) is at least

    R * (c + b),

R the committed tokens per second (``RowPrice.rate``), c the seconds of one of its steps (measured here), b those
of one more verified row (``RowPrice.seconds_per_row``): ``d3d.decode.row_price``'s rule with the step's price
added. The cache follows the sequence's committed tokens by content: a proposal crops it to the longest prefix it
shares with them and feeds the rest in one pass (the anchor at least). It proposes for one sequence a round only
(``most_rows``): in a batch its steps would run a sequence at a time.

Its drafts carry each step's runners-up (``top``), so the spec's ``leaves`` verify them as they do the drafter's.
Not by default on the real targets (int8 activations: no leaves): chains with one or two leaves measured even on
validation prose, τ +3-7% and each round as much dearer (docs/results/draft-model/leaves/).

A sequence's chain starts late (``ModelChain.starts``): after ``START_ROUNDS`` rounds that committed fewer than
``START_TAU`` tokens each, its first proposal feeding the whole sequence. Fed at admission, the prompt had cost a
third of the target's prefill on every request, and code, served by copies and the drafter, lost by it (validation
code end to end: 1.557x ar with chains from the first round, 1.670x with the late start, 1.646x without chains;
docs/results/draft-model/start/).
"""

from __future__ import annotations

import time
import weakref

import torch

from ..draft.drafter import draft_head
from ..model.transformer import Transformer
from .sources import Draft, Origin

START_ROUNDS = 4  # a sequence's chain starts after this many rounds ...
START_TAU = 1.5  # ... where they committed fewer tokens a round than this (copies and the drafter serve it poorly)
STEP_DECAY = 0.25  # the weight of a new step in the small model's seconds per step
EXPECT = 0.8  # the probability a further step's token is expected to have (taking a step to see it costs the step)
PRIOR_MIN_PROB = 0.5  # the cut until the row price has a rate and a step is timed (a prior, not measured)
LOW_IDS = 32768  # the chain drafts over the tokenizer's lowest ids (BPE merges in order: the most frequent) and ...


def chain_vocabulary(vocab_size: int, also: torch.Tensor | None = None,
                     special_from: int | None = None) -> torch.Tensor:
    """The ids a chain drafts over (sorted): the ``LOW_IDS`` lowest, the ids from ``special_from`` on (the end-of-turn
    and other special tokens), and ``also`` (the block drafter's drafting vocabulary, chosen from the answers it was
    trained on). For the 0.5B beside the 1.5B, 38,814 rows: its step 0.72-0.75 of one with every row, its greedy
    token the 1.5B's at 0.701 of free-writing positions against 0.717 with every id (docs/results/draft-model/)."""
    ids = [torch.arange(min(LOW_IDS, vocab_size))]
    if special_from is not None and special_from < vocab_size:
        ids.append(torch.arange(special_from, vocab_size))
    if also is not None:
        ids.append(also.to("cpu", torch.long))
    return torch.unique(torch.cat(ids))


_HEADS: "weakref.WeakKeyDictionary[Transformer, tuple[torch.Tensor, torch.nn.Module]]" = weakref.WeakKeyDictionary()


def chain_head(model: Transformer, vocab: torch.Tensor) -> torch.nn.Module:
    """``model``'s head over the rows ``vocab`` (``draft_head``), kept for its next chains with the same rows: the
    copy of 38,814 rows of the 0.5B took 50-70 ms, ~3% of a 128-token code request."""
    kept = _HEADS.get(model)
    if kept is None or not torch.equal(kept[0], vocab):
        kept = _HEADS[model] = (vocab, draft_head(model, vocab))
    return kept[1]


def check_draft_model(model: Transformer, target: Transformer) -> None:
    """A draft model must speak the target's tokens: the same vocabulary rows, on the same device."""
    if model.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"draft_model: its vocabulary has {model.cfg.vocab_size} rows, the target's "
                         f"{target.cfg.vocab_size}: a draft model must share the target's tokenizer")
    if model.device != target.device:
        raise ValueError(f"draft_model: on {model.device}, the target on {target.device}: load both on one device")


class ModelChain:
    """Greedy drafts of ``model`` over the ids ``vocab`` (``chain_vocabulary``; None: every id), ``rows`` cache
    rows of ``max_len`` tokens (one per sequence's row), at most ``longest`` tokens a draft (the spec's
    ``draft_size``), cut by ``price`` (the decoder's ``RowPrice``) as the module docstring says."""

    origin = Origin.MODEL
    most_rows = 1  # the most sequences a round may hold for the chain to propose (its steps run one at a time)

    def __init__(self, model: Transformer, rows: int, max_len: int, price, vocab: torch.Tensor | None = None,
                 longest: int = 15, top: int = 1):
        self.model, self.price, self.longest, self.rows, self.max_len = model, price, longest, rows, max_len
        self.top = top  # likeliest tokens kept a position: the draft and the runners-up the spec's leaves come from
        self.vocab = None if vocab is None else vocab.to(model.device)
        self._cache = self._head = None  # made at the first proposal: most code requests never start a chain
        self.cached: list[list[int]] = [[] for _ in range(rows)]  # the tokens each cache row holds
        self.started = [False] * rows  # whether the chain drafts for the sequence in each row
        self.step_seconds: float | None = None
        self.batch = 1  # the sequences of the round being drafted (``SpeculativeDecoder.draft`` sets it)

    @property
    def cache(self):
        if self._cache is None:
            self._cache = self.model.new_cache(self.rows, self.max_len)
        return self._cache

    @property
    def head(self):
        if self._head is None and self.vocab is not None:
            self._head = chain_head(self.model, self.vocab)
        return self._head

    def min_prob(self) -> float:
        """R * (c + b): the least joint probability a further draft must have to pay for its step and row."""
        if self.price.rated == 0 or self.step_seconds is None:
            return PRIOR_MIN_PROB
        return self.price.rate() * (self.step_seconds + (self.price.seconds_per_row() or 0.0))

    def feed(self, rows: list[int], runs: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        """Append each of ``runs`` to its cache row (one pass); each row's ``top`` likeliest next tokens (the greedy
        one first) and their probabilities."""
        layout = self.cache.layout([len(r) for r in runs], rows)
        ids = torch.tensor([t for r in runs for t in r], device=self.model.device)
        logits = self.model(ids, layout, self.cache, logits_index=layout.last_token_index(), head=self.head).float()
        p, best = torch.softmax(logits, -1).topk(min(self.top, logits.shape[-1]), -1)
        if self.vocab is not None:
            best = self.vocab[best]
        for row, run in zip(rows, runs):
            self.cached[row] += run
        return list(zip(best.tolist(), p.tolist()))

    def shared(self, row: int, tokens: list[int]) -> int:
        """Crop ``row``'s cache to the longest prefix it shares with ``tokens`` (the last of them left out: it is
        always fed again, to give the next token); returns that prefix's length."""
        have, n = self.cached[row], 0
        limit = min(len(have), len(tokens) - 1)
        while n < limit and have[n] == tokens[n]:
            n += 1
        self.cache.crop(row, n)
        del have[n:]
        return n

    def admit(self, seqs) -> None:
        """The admitted ``seqs`` start without the chain: it drafts for one once ``started`` says so."""
        for s in seqs:
            self.started[s.row] = False

    def starts(self, seq) -> bool:
        """Whether the chain drafts for ``seq`` from now on: after ``START_ROUNDS`` rounds that committed under
        ``START_TAU`` tokens each on average. Its first proposal feeds the whole sequence (a prompt pass)."""
        if not self.started[seq.row] and seq.tally.rounds >= START_ROUNDS and seq.tally.tau < START_TAU:
            self.started[seq.row] = True
        return self.started[seq.row]

    def propose(self, seq, max_len: int) -> Draft | None:
        if self.batch > self.most_rows or max_len < 1 or not self.starts(seq):
            return None
        room = self.max_len - len(seq.tokens)
        if room < 1:
            return None
        n = self.shared(seq.row, seq.tokens)
        (ids, probs), = self.feed([seq.row], [seq.tokens[n:]])
        top_ids, top_probs, joint, cut = [ids], [probs], probs[0], self.min_prob()
        # another step while the chain, times the next token's expected probability, beats the cut
        while len(top_ids) < min(max_len, room, self.longest) and joint * EXPECT >= cut:
            t0 = time.perf_counter()
            (ids, probs), = self.feed([seq.row], [[top_ids[-1][0]]])
            dt = time.perf_counter() - t0
            last = self.step_seconds
            self.step_seconds = dt if last is None else last + STEP_DECAY * (dt - last)
            joint *= probs[0]
            top_ids.append(ids)
            top_probs.append(probs)
        return Draft([i[0] for i in top_ids], [p[0] for p in top_probs], top_ids, top_probs)


__all__ = ["ModelChain", "chain_vocabulary", "check_draft_model"]
