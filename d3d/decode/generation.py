"""What every decoding engine shares: statistics, output buffers with stop handling and streaming,
the clock, and the prefill."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from ..model.cache import KVCache
from ..model.transformer import Transformer
from .sampling import sample_rows

StreamFn = Callable[[int, list[int]], None]  # (sequence index, newly committed token ids)


@dataclass
class GenerationStats:
    mode: str
    batch_size: int
    num_prompt_tokens: list[int]
    num_generated: list[int]
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

    @property
    def total_generated(self) -> int:
        return sum(self.num_generated)

    @property
    def tau(self) -> float:
        """Mean tokens committed per round (accepted drafts + 1)."""
        return sum((a + 1) * c for a, c in enumerate(self.accept_hist)) / self.rounds if self.rounds else 0.0

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
        """Generated tokens per second of decoding (prefill excluded; the first token comes from prefill)."""
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


class Output:
    """Per-sequence output buffers, stop handling and streaming. ``max_new``: one limit for every
    sequence, or one each; ``reset`` gives a row to a new sequence (a decoder's rows are reused)."""

    def __init__(self, n: int, max_new: int | list[int], stop_ids: set[int], stream: StreamFn | None):
        self.tokens = [[] for _ in range(n)]
        self.done = [False] * n
        self.stopped = [False] * n
        self.max_new = [max_new] * n if isinstance(max_new, int) else list(max_new)
        self.stop_ids, self.stream = stop_ids, stream

    def reset(self, i: int, max_new: int) -> None:
        self.tokens[i], self.done[i], self.stopped[i], self.max_new[i] = [], False, False, max_new

    def commit(self, i: int, new: list[int]) -> list[int]:
        """Append ``new`` to sequence i, cut at the first stop token or at max_new_tokens."""
        room = self.max_new[i] - len(self.tokens[i])
        new = new[:room]
        for j, t in enumerate(new):
            if t in self.stop_ids:
                new = new[: j + 1]
                self.stopped[i] = True
                break
        self.tokens[i].extend(new)
        if self.stopped[i] or len(self.tokens[i]) >= self.max_new[i]:
            self.done[i] = True
        if self.stream and new:
            self.stream(i, new)
        return new

    def active(self) -> list[int]:
        return [i for i, d in enumerate(self.done) if not d]

    def finish(self, stats: GenerationStats, decode_seconds: float) -> GenerationOutput:
        stats.decode_seconds = decode_seconds
        stats.num_generated = [len(t) for t in self.tokens]
        stats.stopped = self.stopped
        return GenerationOutput(self.tokens, stats)


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
    """What every decoder whose rows sequences join and leave shares: ``out`` (every row free until a
    sequence is admitted), ``stats``, the ``clock``, the sampling stream, and the prefill of newcomers."""

    def __init__(self, target: Transformer, stats: GenerationStats, sampling, stop_ids: set[int],
                 stream: StreamFn | None):
        self.target, self.stats, self.sampling, self.clock = target, stats, sampling, Clock()
        self.out = Output(stats.batch_size, 0, stop_ids, stream)
        self.out.done = [True] * stats.batch_size
        self.gen = sampling_generator(target.device, sampling)
        # each row's sampling and random stream: the decoder's (one stream shared, as ``generate`` draws),
        # or, for a row admitted with its own ``Sampling``, that one and a stream seeded by its seed
        self.row_sampling, self.row_gen = [sampling] * stats.batch_size, [self.gen] * stats.batch_size

    def prefill(self, cache: KVCache, rows: list[int], prompts: list[list[int]], max_new: list[int],
                hidden_layers: tuple[int, ...] = (), sampling: list | None = None):
        """Rows ``rows`` start the sequences ``prompts`` (their cache rows emptied first): one prefill pass
        for all; returns their first tokens (not committed yet) and, with ``hidden_layers``, ``prefill``'s
        hidden states (else None). ``sampling``: one ``Sampling`` per row (None: the decoder's)."""
        for j, (i, p, m) in enumerate(zip(rows, prompts, max_new)):
            self.out.reset(i, m)
            cache.crop(i, 0)
            self.stats.num_prompt_tokens[i] = len(p)
            own = sampling[j] if sampling is not None else None
            self.row_sampling[i] = own or self.sampling
            self.row_gen[i] = sampling_generator(self.target.device, own) if own else self.gen
        return prefill_counted(self.target, prompts, cache, lambda logits: self.pick(rows, logits), self.stats,
                               self.clock, hidden_layers, rows)

    def pick(self, rows: list[int], logits: torch.Tensor) -> list[int]:
        """The next token of each of ``rows`` from its logits (row j of ``logits``), as each row samples."""
        return sample_rows(logits, [self.row_sampling[i] for i in rows], [self.row_gen[i] for i in rows]).tolist()

    def drop(self, i: int) -> None:
        """End row i's sequence now (its client went away); the row is free."""
        self.out.done[i] = True

    def finish(self) -> GenerationOutput:
        return self.out.finish(self.stats, self.clock.now() - self.stats.prefill_seconds)

    def close(self) -> None:
        pass

    def run(self, prompts: list[list[int]], max_new_tokens: int) -> GenerationOutput:
        """Every prompt at once (row i: prompt i), rounds until all are done: ``generate``'s loop."""
        try:
            self.admit(list(range(len(prompts))), prompts, [max_new_tokens] * len(prompts))
            while self.step():
                pass
        finally:
            self.close()
        return self.finish()


def prefill(target: Transformer, prompts: list[list[int]], cache: KVCache, pick: Callable,
            hidden_layers: tuple[int, ...] = (), rows: list[int] | None = None):
    """One target pass over every prompt (its K/V cached in cache row ``rows[i]``, default i); returns
    the first generated token of each sequence (``pick(logits of each last prompt token)``), and with
    ``hidden_layers`` also those layers' hidden states of every prompt token."""
    layout = cache.layout([len(p) for p in prompts], rows)
    ids = torch.tensor([t for p in prompts for t in p], device=target.device)
    if hidden_layers:
        logits, hidden = target(ids, layout, cache, hidden_layers=hidden_layers)
        return pick(logits[layout.last_token_index()]), hidden
    return pick(target(ids, layout, cache, logits_index=layout.last_token_index())), None


def sampling_generator(device: torch.device, sampling) -> torch.Generator | None:
    """The random stream of a generation at T > 0 (``sampling``: a ``d3d.decode.config.Sampling``), seeded."""
    return torch.Generator(device=device).manual_seed(sampling.seed) if sampling.temperature > 0 else None


def prefill_counted(target: Transformer, prompts: list[list[int]], cache: KVCache, pick: Callable,
                    stats: GenerationStats, clock: Clock, hidden_layers: tuple[int, ...] = (),
                    rows: list[int] | None = None):
    """The prologue every engine shares: ``prefill`` with ``pick`` (logits -> first tokens), counted as a
    target forward, its time added to the stats' ``prefill_seconds``. Returns ``prefill``'s pair."""
    first, (t0, t1) = clock.timed(lambda: prefill(target, prompts, cache, pick, hidden_layers, rows))
    stats.target_forwards += 1
    stats.prefill_seconds += t1 - t0
    return first


__all__ = ["GenerationStats", "GenerationOutput", "Output", "Clock", "Decoder", "prefill", "prefill_counted", "sampling_generator", "StreamFn"]
