"""What every decoding engine shares: statistics, the rows that Sequences join and leave, streaming,
the clock, and the prefill."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from ..cpu import prefill as prefill_tiles
from ..model.cache import KVCache
from ..model.transformer import Transformer
from .sampling import sample_rows
from .sequence import Sequence, Tally, all_greedy, mean_tokens_per_round
from .sources import Origin

StreamFn = Callable[[int, list[int]], None]  # (sequence id, newly committed token ids)


@dataclass
class GenerationStats:
    """A generation's figures: its passes', counted as they run, and its sequences' (``add``)."""

    mode: str
    batch_size: int
    num_prompt_tokens: list[int] = field(default_factory=list)
    num_generated: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    target_forwards: int = 0
    stopped: list[bool] = field(default_factory=list)  # ended on a stop token (else: max_new_tokens)
    # speculative engines only
    block_size: int = 0
    rounds: int = 0  # verification rounds, summed over sequences
    accept_hist: list[int] = field(default_factory=list)  # accept_hist[a] = rounds that accepted a drafts
    verified_drafts: int = 0  # drafts the target verified, summed over rounds and sequences
    verified_leaves: int = 0  # leaves: bonus candidates verified beside the drafts (d3d.decode.speculative)
    leaf_hits: int = 0  # leaves: rounds whose bonus was a verified leaf (one more token committed)
    lookup_drafts: int = 0  # lookup: drafts copied from the context instead of drafted (d3d.decode.lookup)
    datastore_drafts: int = 0  # datastore: drafts looked up in the target's earlier text (d3d.decode.datastore)
    model_drafts: int = 0  # draft_model: drafts of a smaller model's greedy chain (d3d.decode.draft_model)
    drafter_forwards: int = 0
    successor_passes: int = 0  # async: rounds (x sequences) whose outcome hypotheses were drafted beside verification
    hypotheses: int = 0  # async: hypothesis blocks drafted, summed over rounds and sequences
    fallbacks: int = 0  # async: rounds with hypotheses none of which matched the outcome (drafted synchronously)
    successor_hits: int = 0  # async: rounds whose outcome matched a hypothesis (the next draft was ready)
    hits_by_accept: list[int] = field(default_factory=list)  # async: hits_by_accept[a] = hits in rounds accepting a
    draft_seconds: float = 0.0  # synchronous drafting (on the critical path)
    hidden_draft_seconds: float = 0.0  # async: the hypotheses passes (beside or after verification)
    exposed_draft_seconds: float = 0.0  # async: the part of the hypotheses passes not hidden behind verification
    verify_seconds: float = 0.0

    def count_verification(self, verify_span: tuple[float, float], draft_span: tuple[float, float] | None = None,
                           hypothesis_rows: int = 0, hypotheses: int = 0) -> None:
        """One verification pass and, in async, the hypotheses pass beside it (``draft_span``, None
        if there was none): the part of it that ran past the verification is exposed."""
        self.target_forwards += 1
        self.verify_seconds += verify_span[1] - verify_span[0]
        if draft_span is not None:
            self.drafter_forwards += 1
            self.successor_passes += hypothesis_rows
            self.hypotheses += hypotheses
            self.hidden_draft_seconds += draft_span[1] - draft_span[0]
            self.exposed_draft_seconds += max(0.0, draft_span[1] - max(draft_span[0], verify_span[1]))

    def add(self, seqs: list[Sequence]) -> None:
        """The figures of ``seqs``: what each was asked and made, and the counts of its rounds, summed."""
        self.num_prompt_tokens = [s.num_prompt for s in seqs]
        self.num_generated = [s.num_output for s in seqs]
        self.stopped = [s.stopped for s in seqs]
        for t in (s.tally for s in seqs):
            self.rounds += t.rounds
            self.accept_hist = [a + b for a, b in zip(self.accept_hist, t.accept_hist)]
            self.verified_drafts += t.verified_drafts
            self.verified_leaves += t.verified_leaves
            self.leaf_hits += t.leaf_hits
            self.lookup_drafts += t.drafts[Origin.LOOKUP]
            self.datastore_drafts += t.drafts[Origin.DATASTORE]
            self.model_drafts += t.drafts[Origin.MODEL]
            self.successor_hits += t.successor_hits
            self.fallbacks += t.fallbacks
            self.hits_by_accept = [a + b for a, b in zip(self.hits_by_accept, t.hits_by_accept)]

    @property
    def total_generated(self) -> int:
        return sum(self.num_generated)

    @property
    def tau(self) -> float:
        """Mean tokens committed per round (accepted drafts + 1)."""
        return mean_tokens_per_round(self.accept_hist, self.rounds)

    @property
    def hit_rate(self) -> float:
        """async: share of rounds whose outcome one of the hypotheses had drafted."""
        return self.successor_hits / self.rounds if self.rounds else 0.0

    @property
    def hit_rate_by_accept(self) -> list[float | None]:
        """async: per accept length a, the share of rounds accepting a that hit (None: no such round)."""
        return [h / n if n else None for h, n in zip(self.hits_by_accept, self.accept_hist)]

    @property
    def critical_draft_seconds(self) -> float:
        """Drafting the decoding had to wait for: synchronous drafts + exposed hypotheses passes."""
        return self.draft_seconds + self.exposed_draft_seconds

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second, the prefill's time included (it gives the first token), as ``bench llamacpp``
        counts llama.cpp's."""
        t = self.prefill_seconds + self.decode_seconds
        return self.total_generated / t if t > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("tokens_per_second", "total_generated", "tau", "hit_rate", "hit_rate_by_accept",
                     "critical_draft_seconds"):
            d[name] = getattr(self, name)
        return d


@dataclass
class GenerationOutput:
    tokens: list[list[int]]  # generated ids per prompt (a stop token, when hit, is the last one)
    stats: GenerationStats


class Clock:
    """Seconds since the generation started (spans in ``RoundInfo`` and the stats)."""

    def __init__(self):
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def timed(self, fn):
        """``(fn(), (start, end))``."""
        start = self.now()
        result = fn()
        return result, (start, self.now())


class Decoder:
    """What every decoder whose rows Sequences join and leave shares: ``slots`` (the Sequence in each
    cache row; None, or one that is done: a free row), ``stats`` of its passes, the ``clock``, the
    prefill of newcomers, sampling, and ``emit``: a sequence's commit, streamed."""

    def __init__(self, target: Transformer, stats: GenerationStats, stream: StreamFn | None = None):
        self.target, self.stats, self.stream, self.clock = target, stats, stream, Clock()
        self.slots: list[Sequence | None] = [None] * stats.batch_size

    def place(self, seqs: list[Sequence]) -> None:
        """Give each of ``seqs`` a free row (the lowest first), a fresh tally and, where it has none,
        its own random stream."""
        free = [i for i, s in enumerate(self.slots) if s is None or s.done]
        if len(seqs) > len(free):
            raise ValueError(f"admit: {len(seqs)} sequences for {len(free)} free rows")
        for seq, row in zip(seqs, free):
            self.slots[row], seq.row, seq.tally = seq, row, Tally(self.stats.block_size)
            seq.gen = seq.gen or sampling_generator(self.target.device, seq.sampling)

    def schedule(self) -> list[Sequence]:
        """The sequences a step decodes: every one still running, in row order."""
        return [s for s in self.slots if s is not None and not s.done]

    def prefill(self, cache: KVCache, seqs: list[Sequence], hidden_layers: tuple[int, ...] = ()):
        """The placed ``seqs`` start (their cache rows emptied first): one prefill pass for all; returns
        their first tokens (not committed yet) and, with ``hidden_layers``, ``prefill``'s hidden states
        (else None)."""
        rows = [s.row for s in seqs]
        for i in rows:
            cache.crop(i, 0)
        return prefill_counted(self.target, [s.tokens for s in seqs], cache, lambda logits: self.pick(seqs, logits),
                               self.stats, self.clock, hidden_layers, rows, all_greedy(seqs))

    def pick(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """The next token of each of ``seqs`` from its logits (row j of ``logits``), as each samples."""
        return sample_rows(logits, [s.sampling for s in seqs], [s.gen for s in seqs]).tolist()

    def emit(self, seq: Sequence, new: list[int]) -> list[int]:
        """``seq`` commits ``new`` (cut at a stop token or its limit); what it kept is streamed."""
        kept = seq.commit(new)
        if self.stream and kept:
            self.stream(seq.id, kept)
        return kept

    def drop(self, seq: Sequence) -> None:
        """End ``seq`` now (its client went away); its row is free."""
        seq.done = True

    def finish(self, seqs: list[Sequence]) -> GenerationOutput:
        self.stats.decode_seconds = self.clock.now() - self.stats.prefill_seconds
        self.stats.add(seqs)
        return GenerationOutput([s.output for s in seqs], self.stats)

    def close(self) -> None:
        pass

    def run(self, seqs: list[Sequence]) -> GenerationOutput:
        """Every sequence at once (row i: ``seqs[i]``), rounds until all are done: ``generate``'s loop."""
        try:
            self.admit(seqs)
            while self.step():
                pass
        finally:
            self.close()
        return self.finish(seqs)


def prefill(target: Transformer, prompts: list[list[int]], cache: KVCache, pick: Callable,
            hidden_layers: tuple[int, ...] = (), rows: list[int] | None = None, greedy: bool = False):
    """One target pass over every prompt (its K/V cached in cache row ``rows[i]``, default i); returns
    the first generated token of each sequence (``pick(logits of each last prompt token)``), and with
    ``hidden_layers`` also those layers' hidden states of every prompt token. ``greedy``: ``pick`` reads
    each row's argmax only."""
    layout = cache.layout([len(p) for p in prompts], rows)
    ids = torch.tensor([t for p in prompts for t in p], device=target.device)
    with prefill_tiles.tiles([len(p) for p in prompts]):  # long prompts: AMX's bf16 tiles (d3d.cpu.prefill)
        if hidden_layers:
            logits, hidden = target(ids, layout, cache, hidden_layers=hidden_layers)
            return pick(logits[layout.last_token_index()]), hidden
        return pick(target(ids, layout, cache, logits_index=layout.last_token_index(), greedy=greedy)), None


def sampling_generator(device: torch.device, sampling) -> torch.Generator | None:
    """The random stream of a generation at T > 0 (``sampling``: a ``d3d.decode.config.Sampling``), seeded."""
    return torch.Generator(device=device).manual_seed(sampling.seed) if sampling.temperature > 0 else None


def prefill_counted(target: Transformer, prompts: list[list[int]], cache: KVCache, pick: Callable,
                    stats: GenerationStats, clock: Clock, hidden_layers: tuple[int, ...] = (),
                    rows: list[int] | None = None, greedy: bool = False):
    """The prologue every engine shares: ``prefill`` with ``pick`` (logits -> first tokens), counted as a
    target forward, its time added to the stats' ``prefill_seconds``. Returns ``prefill``'s pair."""
    first, (t0, t1) = clock.timed(lambda: prefill(target, prompts, cache, pick, hidden_layers, rows, greedy))
    stats.target_forwards += 1
    stats.prefill_seconds += t1 - t0
    return first


__all__ = ["GenerationStats", "GenerationOutput", "Clock", "Decoder", "prefill", "prefill_counted", "sampling_generator",
           "StreamFn"]
