"""Decoding loops behind one ``generate`` entry point.

``ar``    plain autoregressive decoding: one target forward per token (the baseline every
          speculative engine must reproduce exactly at temperature 0).
``sync``  draft B-1 tokens with the drafter, verify them with one target forward.
``async`` D3D: while the target verifies a block, the drafter already drafts the successor
          block assuming the whole block is accepted (see ``generate_speculative``).

All engines share prefill, argument checks, stop handling and statistics.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from .kernels.accept import accept
from .model import Transformer
from .sampling import check_sampling_args, sample_next

if TYPE_CHECKING:
    from .drafter import Drafter

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
    drafter_forwards: int = 0
    successor_passes: int = 0  # async: rounds (x sequences) that drafted a successor beside verification
    fallbacks: int = 0  # async: rounds whose successor draft was unusable (drafted synchronously)
    successor_hits: int = 0  # async: rounds that used the successor drafted during verification
    draft_seconds: float = 0.0  # drafting on the critical path
    hidden_draft_seconds: float = 0.0  # async: drafting that ran concurrently with verification
    verify_seconds: float = 0.0

    @property
    def total_generated(self) -> int:
        return sum(self.num_generated)

    @property
    def tau(self) -> float:
        """Mean tokens committed per round (accepted drafts + 1)."""
        return sum((a + 1) * c for a, c in enumerate(self.accept_hist)) / self.rounds if self.rounds else 0.0

    @property
    def hit_rate(self) -> float:
        """async: share of rounds whose successor draft was used."""
        return self.successor_hits / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of decoding (prefill excluded; the first token comes from prefill)."""
        t = self.prefill_seconds + self.decode_seconds
        return self.total_generated / t if t > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens_per_second"] = self.tokens_per_second
        d["total_generated"] = self.total_generated
        d["tau"] = self.tau
        d["hit_rate"] = self.hit_rate
        return d


@dataclass
class GenerationOutput:
    tokens: list[list[int]]  # generated ids per prompt (a stop token, when hit, is the last one)
    stats: GenerationStats


def normalize_prompts(prompt_ids, vocab_size: int, what: str = "prompt_ids") -> list[list[int]]:
    """Accept one prompt (list of ints / 1-D tensor) or a batch (list of lists / 2-D tensor)."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() not in (1, 2):
            raise ValueError(f"{what}: expected a 1-D or 2-D tensor, got shape {tuple(prompt_ids.shape)}")
        prompt_ids = prompt_ids.tolist()
    if not isinstance(prompt_ids, Sequence) or isinstance(prompt_ids, (str, bytes)):
        raise TypeError(f"{what}: expected token ids (list of ints or list of lists), got {type(prompt_ids).__name__}")
    prompts = [list(prompt_ids)] if not prompt_ids or not isinstance(prompt_ids[0], (list, tuple)) else [list(p) for p in prompt_ids]
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"{what}[{i}]: empty prompt (at least one token is needed)")
        for t in p:
            if not isinstance(t, int) or isinstance(t, bool):
                raise TypeError(f"{what}[{i}]: token ids must be ints, got {t!r}")
        bad = [t for t in p if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"{what}[{i}]: token id(s) {bad[:5]} out of range [0, {vocab_size})")
    return prompts


def check_limits(prompts: list[list[int]], max_new_tokens: int, max_positions: int, extra: int = 0) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: must be a positive integer")
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens + extra > max_positions:
        raise ValueError(
            f"prompt of {longest} tokens + max_new_tokens={max_new_tokens}"
            + (f" + {extra} lookahead" if extra else "")
            + f" exceeds the model's max_position_embeddings={max_positions}"
        )


class _Output:
    """Per-sequence output buffers, stop handling and streaming."""

    def __init__(self, n: int, max_new: int, stop_ids: set[int], stream: StreamFn | None):
        self.tokens = [[] for _ in range(n)]
        self.done = [False] * n
        self.stopped = [False] * n
        self.max_new, self.stop_ids, self.stream = max_new, stop_ids, stream

    def commit(self, i: int, new: list[int]) -> list[int]:
        """Append ``new`` to sequence i, cut at the first stop token or at max_new_tokens."""
        room = self.max_new - len(self.tokens[i])
        new = new[:room]
        for j, t in enumerate(new):
            if t in self.stop_ids:
                new = new[: j + 1]
                self.stopped[i] = True
                break
        self.tokens[i].extend(new)
        if self.stopped[i] or len(self.tokens[i]) >= self.max_new:
            self.done[i] = True
        if self.stream and new:
            self.stream(i, new)
        return new

    def active(self) -> list[int]:
        return [i for i, d in enumerate(self.done) if not d]

    def finish(self, stats: "GenerationStats", decode_seconds: float) -> "GenerationOutput":
        stats.decode_seconds = decode_seconds
        stats.num_generated = [len(t) for t in self.tokens]
        stats.stopped = self.stopped
        return GenerationOutput(self.tokens, stats)


@torch.inference_mode()
def generate_ar(
    model: Transformer,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    stop_ids: set[int] = frozenset(),
    stream: StreamFn | None = None,
) -> GenerationOutput:
    """One target forward per token. Sequences that finish drop out of the batch."""
    n = len(prompts)
    gen = torch.Generator(device=model.device).manual_seed(seed) if temperature > 0 else None
    stats = GenerationStats("ar", n, [len(p) for p in prompts], [0] * n)
    out = _Output(n, max_new_tokens, stop_ids, stream)
    cache = model.new_cache(rows=n, max_len=max(len(p) for p in prompts) + max_new_tokens)

    t0 = time.perf_counter()
    layout = cache.layout([len(p) for p in prompts])
    ids = torch.tensor([t for p in prompts for t in p], device=model.device)
    logits = model(ids, layout, cache, logits_index=layout.last_token_index())
    next_ids = sample_next(logits, temperature, top_k, top_p, gen).tolist()
    stats.target_forwards += 1
    t1 = time.perf_counter()
    stats.prefill_seconds = t1 - t0

    rows = list(range(n))
    while True:
        for i, t in zip(rows, next_ids):
            out.commit(i, [t])
        rows = out.active()
        if not rows:
            break
        last = [out.tokens[i][-1] for i in rows]
        layout = cache.layout([1] * len(rows), rows=rows)
        logits = model(torch.tensor(last, device=model.device), layout, cache)
        next_ids = sample_next(logits, temperature, top_k, top_p, gen).tolist()
        stats.target_forwards += 1
    return out.finish(stats, time.perf_counter() - t1)


@dataclass
class RoundInfo:
    """What happened to one sequence in one verification round (for --explain and tests)."""

    round: int
    seq: int
    draft: list[int]
    accepted: int
    bonus: int
    committed: list[int]
    successor_used: bool  # async: this round's draft came from the previous round's successor
    fallback: bool  # async: the successor drafted during this round is unusable
    sync_draft_seconds: float
    verify_span: tuple[float, float]  # (start, end) seconds since generation start
    draft_span: tuple[float, float] | None  # async: the concurrent successor pass (None: not drafted)
    confidence: float  # drafter's product of confidences over this draft


@contextlib.contextmanager
def _split_cpu_threads(enabled: bool):
    """Give each of the two concurrent CPU threads half of torch's intra-op threads.

    Two Python threads that each run ops with the full intra-op thread count oversubscribe the
    cores, and OpenMP's spin-waiting then stalls tiny ops by orders of magnitude (measured: 8 ms
    instead of ~30 us per small SDPA call with both cores busy).
    """
    if not enabled:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, old // 2))
    try:
        yield
    finally:
        torch.set_num_threads(old)


class _Clock:
    def __init__(self):
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0


def _timed(clock: _Clock, fn):
    start = clock.now()
    result = fn()
    return result, (start, clock.now())


class SideStream:
    """A second CUDA stream for the successor pass: ``follow`` (start after the work already
    queued), ``active`` (a context that queues work on it), ``join`` (the main stream waits for it)."""

    def __init__(self, device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def follow(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def active(self):
        return torch.cuda.stream(self.stream)

    def join(self) -> None:
        torch.cuda.current_stream(self.device).wait_stream(self.stream)


@torch.inference_mode()
def generate_speculative(
    target: Transformer,
    drafter: "Drafter",
    prompts: list[list[int]],
    max_new_tokens: int,
    mode: str = "sync",
    block_size: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    stop_ids: set[int] = frozenset(),
    stream: StreamFn | None = None,
    on_round: Callable[[RoundInfo], None] | None = None,
    overlap: str = "thread",
    successor_threshold: float = 0.0,
    exact: bool = False,
) -> GenerationOutput:
    """Speculative decoding, synchronous (``mode="sync"``) or D3D asynchronous (``"async"``).

    Invariants, per sequence: ``committed`` = prompt + output; the last committed token is the
    *anchor*; the target cache holds every committed token but the anchor; the drafter cache
    holds a prefix of the committed tokens (only clean tokens are ever kept).

    A round: (1) if the sequence has no draft, draft synchronously: drafter pass over the
    uncached committed tokens + the block ``[anchor, mask x (B-1)]``. (2) The target verifies
    ``[anchor, d1..d(B-1)]`` in one forward; ``accept`` gives the accept length ``a`` and the
    bonus; ``a + 1`` tokens are committed and the target cache is cropped to keep the accepted
    ones. (3) async only, concurrently with (2): the drafter appends ``d1..d(B-1)`` (as if all
    accepted) and drafts the block ``[mask x B]`` after them: a guess of the bonus and the next
    B-1 drafts. If verification accepted everything and the bonus equals the guess, those drafts
    are the next round's draft and no drafting sits on the critical path; otherwise the drafter
    cache is cropped back to the accepted tokens and the next round drafts synchronously.

    ``successor_threshold``: async drafts a successor only for rows whose current draft has a
    product of drafter confidences at least this (an estimate of P(whole block accepted)); 0
    (default) always drafts one, as D3D does. Where compute is saturated (a CPU), skipping
    hopeless successors saves their cost; where it is idle (a GPU stream), 0 is right.

    ``overlap``: how async runs (3) beside (2): ``"thread"`` (a second CPU thread; torch ops
    release the GIL), ``"packed"`` (one joint pass of both models, ``d3d.packed``; needs the
    drafter to have the target's layer shapes), ``"stream"`` (a second CUDA stream) or
    ``"none"`` (one after the other, for measuring what the overlap buys).

    ``exact``: verification attends one query row at a time, as AR steps do, so that greedy
    output equals AR bit for bit in low precision too (``KVCache.layout(row_invariant=)``);
    without it bf16 outputs may part at near-ties of the target's logits (bench agreement).
    """
    B = block_size or drafter.block_size
    if B < 2:
        raise ValueError(f"block_size={B}: must be >= 2")
    n = len(prompts)
    dev = target.device
    stats = GenerationStats(mode, n, [len(p) for p in prompts], [0] * n, block_size=B, accept_hist=[0] * B)
    out = _Output(n, max_new_tokens, stop_ids, stream)
    longest = max(len(p) for p in prompts)
    pair = None
    if mode == "async" and overlap == "packed":
        pair = _packed_pair(target, drafter)
        tcache, dcache = pair.new_caches(n, n, longest + max_new_tokens + 2 * B + 2)
    else:
        tcache = target.new_cache(n, longest + max_new_tokens + B + 1)
        dcache = drafter.new_cache(n, longest + max_new_tokens + 2 * B + 2)
    gen = torch.Generator(device=dev).manual_seed(seed) if temperature > 0 else None
    clock = _Clock()
    pool = ThreadPoolExecutor(max_workers=1) if mode == "async" and overlap == "thread" else None
    side_stream = SideStream(dev) if mode == "async" and overlap == "stream" else None

    layout = tcache.layout([len(p) for p in prompts])
    ids = torch.tensor([t for p in prompts for t in p], device=dev)
    logits = target(ids, layout, tcache, logits_index=layout.last_token_index())
    first = sample_next(logits, temperature, generator=gen).tolist()
    stats.target_forwards += 1
    stats.prefill_seconds = clock.now()
    committed = [list(p) for p in prompts]
    for i, t in enumerate(first):
        committed[i].append(t)
        out.commit(i, [t])
    drafts: list[list[int] | None] = [None] * n
    confidence = [0.0] * n  # drafter's product of confidences over the current draft ≈ P(all accepted)
    from_successor = [False] * n

    rnd = 0
    while rows := out.active():
        # (1) synchronous drafting where no successor draft is available
        need = [i for i in rows if drafts[i] is None]
        sync_seconds = 0.0
        if need:
            t = clock.now()
            toks, conf = drafter.draft(dcache, need, [committed[i][dcache.lengths[i]:-1] for i in need],
                                       [committed[i][-1] for i in need], B - 1)
            for i, d, c in zip(need, toks.tolist(), conf.prod(dim=1).tolist()):
                drafts[i], confidence[i] = d, c
            stats.drafter_forwards += drafter.dcfg.denoise_steps
            sync_seconds = clock.now() - t
            stats.draft_seconds += sync_seconds

        # (2) verification, with (3) the successor pass beside it in async mode, for the rows whose
        # draft the drafter itself believes likely to be accepted whole (successor_threshold)
        spec = [i for i in rows if confidence[i] >= successor_threshold] if mode == "async" else []
        base = [len(committed[i]) - 1 for i in rows]
        draft_t = torch.tensor([drafts[i] for i in rows], device=dev)

        def verify_inputs():
            vlayout = tcache.layout([B] * len(rows), rows, row_invariant=exact)
            return torch.tensor([[committed[i][-1]] + drafts[i] for i in rows], device=dev).flatten(), vlayout

        def judge(logits):
            return accept(draft_t, logits.view(len(rows), B, -1), temperature=temperature, seed=seed * 1_000_003 + rnd)

        def verify():
            vids, vlayout = verify_inputs()
            return judge(target(vids, vlayout, tcache))

        def successor_clean():
            return [committed[i][dcache.lengths[i]:] + drafts[i] for i in spec]

        def guesses_of(toks, conf):  # row -> (guessed bonus + next draft, confidence of the next draft)
            return dict(zip(spec, zip(toks.tolist(), conf[:, 1:].prod(dim=1).tolist())))

        def successor():
            return guesses_of(*successor_tensors())

        def successor_tensors():  # device tensors only: enqueueing it makes the host wait for nothing
            return drafter.draft(dcache, spec, successor_clean(), None, B)

        def packed():
            vids, vlayout = verify_inputs()
            job = drafter.start(dcache, spec, successor_clean(), None, B)
            t_logits, d_logits = pair.forward(vids, vlayout, tcache, job.ids, job.layout, dcache, job.index)
            return judge(t_logits), guesses_of(*drafter.finish(dcache, job, d_logits))

        draft_span, guesses = None, {}
        if spec:
            if pair is not None:
                (result, guesses), verify_span = _timed(clock, packed)
                draft_span = verify_span
            elif pool is not None:
                future = pool.submit(lambda: _timed(clock, successor))
                result, verify_span = _timed(clock, verify)
                guesses, draft_span = future.result()
            elif side_stream is not None:
                # Enqueue the successor on the side stream and the verification on the main one
                # before anything reads a value back: a host conversion in between would make the
                # host wait for the successor and serialise the two (tests/test_engines.py).
                side_stream.follow()
                with side_stream.active():
                    pending, draft_span = _timed(clock, successor_tensors)
                result, verify_span = _timed(clock, verify)
                side_stream.join()
                guesses = guesses_of(*pending)
            else:
                result, verify_span = _timed(clock, verify)
                guesses, draft_span = _timed(clock, successor)
            stats.drafter_forwards += drafter.dcfg.denoise_steps
            stats.successor_passes += len(spec)
            stats.hidden_draft_seconds += draft_span[1] - draft_span[0]
        else:
            result, verify_span = _timed(clock, verify)
        stats.target_forwards += 1
        stats.verify_seconds += verify_span[1] - verify_span[0]

        accepted, bonus = result.accept_len.tolist(), result.bonus.tolist()
        for j, i in enumerate(rows):
            a = accepted[j]
            new = drafts[i][:a] + [bonus[j]]
            stats.rounds += 1
            stats.accept_hist[a] += 1
            tcache.crop(i, base[j] + 1 + a)
            hit = False
            if i in guesses:
                hit = a == B - 1 and guesses[i][0][0] == bonus[j]
                if not hit:
                    dcache.crop(i, min(dcache.lengths[i], base[j] + 1 + a))
                stats.successor_hits += hit
                stats.fallbacks += not hit
            if on_round:
                on_round(RoundInfo(rnd, i, list(drafts[i]), a, bonus[j], new, from_successor[i],
                                   i in guesses and not hit, sync_seconds if i in need else 0.0,
                                   verify_span, draft_span if i in guesses else None, confidence[i]))
            committed[i].extend(new)
            out.commit(i, new)
            drafts[i], confidence[i] = (guesses[i][0][1:], guesses[i][1]) if hit else (None, 0.0)
            from_successor[i] = hit
        rnd += 1
    if pool is not None:
        pool.shutdown()
    return out.finish(stats, clock.now() - stats.prefill_seconds)


@torch.inference_mode()
def generate_dflash(
    target: Transformer,
    drafter,
    prompts: list[list[int]],
    max_new_tokens: int,
    block_size: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    stop_ids: set[int] = frozenset(),
    stream: StreamFn | None = None,
    on_round: Callable[[RoundInfo], None] | None = None,
) -> GenerationOutput:
    """The DFlash baseline: a synchronous loop whose drafter reads the target's hidden states.

    Every target pass (prefill, verification) also returns the hidden states of the drafter's
    ``target_layer_ids``; those of the newly committed tokens (all but the anchor, whose hidden
    state the next verification computes) become the drafter's context.
    """
    B = block_size or drafter.block_size
    n, dev = len(prompts), target.device
    stats = GenerationStats("dflash", n, [len(p) for p in prompts], [0] * n, block_size=B, accept_hist=[0] * B)
    out = _Output(n, max_new_tokens, stop_ids, stream)
    longest = max(len(p) for p in prompts)
    tcache = target.new_cache(n, longest + max_new_tokens + B + 1)
    ccache = drafter.new_cache(n, longest + max_new_tokens + B + 1)
    gen = torch.Generator(device=dev).manual_seed(seed) if temperature > 0 else None
    clock = _Clock()
    layers = drafter.hidden_layers

    layout = tcache.layout([len(p) for p in prompts])
    ids = torch.tensor([t for p in prompts for t in p], device=dev)
    logits, hidden = target(ids, layout, tcache, hidden_layers=layers)
    first = sample_next(logits[layout.last_token_index()], temperature, generator=gen).tolist()
    drafter.append_context(ccache, list(range(n)), hidden, [len(p) for p in prompts])
    stats.target_forwards += 1
    stats.prefill_seconds = clock.now()
    committed = [list(p) for p in prompts]
    for i, t in enumerate(first):
        committed[i].append(t)
        out.commit(i, [t])

    rnd = 0
    while rows := out.active():
        t = clock.now()
        drafts = drafter.draft(ccache, rows, [committed[i][-1] for i in rows], B - 1)
        stats.drafter_forwards += 1
        sync_seconds = clock.now() - t
        stats.draft_seconds += sync_seconds
        base = [len(committed[i]) - 1 for i in rows]
        vlayout = tcache.layout([B] * len(rows), rows)
        vids = torch.cat([torch.tensor([[committed[i][-1]] for i in rows], device=dev), drafts], 1).flatten()
        v0 = clock.now()
        logits, hidden = target(vids, vlayout, tcache, hidden_layers=layers)
        result = accept(drafts, logits.view(len(rows), B, -1), temperature=temperature, seed=seed * 1_000_003 + rnd)
        accepted, bonus = result.accept_len.tolist(), result.bonus.tolist()
        stats.target_forwards += 1
        stats.verify_seconds += clock.now() - v0
        # context grows by the anchor + accepted drafts of each row
        keep = torch.cat([torch.arange(j * B, j * B + a + 1, device=dev) for j, a in enumerate(accepted)])
        drafter.append_context(ccache, rows, [h.index_select(0, keep) for h in hidden], [a + 1 for a in accepted])
        draft_list = drafts.tolist()
        for j, i in enumerate(rows):
            a = accepted[j]
            new = draft_list[j][:a] + [bonus[j]]
            stats.rounds += 1
            stats.accept_hist[a] += 1
            tcache.crop(i, base[j] + 1 + a)
            if on_round:
                on_round(RoundInfo(rnd, i, draft_list[j], a, bonus[j], new, False, False, sync_seconds,
                                   (v0, clock.now()), None, 0.0))
            committed[i].extend(new)
            out.commit(i, new)
        rnd += 1
    return out.finish(stats, clock.now() - stats.prefill_seconds)


MODES = ("ar", "sync", "async", "dflash")
OVERLAPS = ("thread", "packed", "stream", "none")


def default_overlap(target: Transformer, drafter: "Drafter") -> str:
    """CUDA: a second stream. CPU: ``"none"`` (successor pass after verification, same thread).

    Measured on the bundled pair, bf16 with prepacked weights, 8 held-out code prompts, one run
    (AMD EPYC Zen 5, 2 cores): async@0.3 none 1.65x, packed 1.60x, thread 1.27x of ar (sync 1.58x).
    The packed pass's stacked bmm weights cannot use the prepacked per-model matmuls, and two
    threads on two cores halve each pass's cores; ``none`` also keeps ``exact`` available."""
    return "stream" if target.device.type == "cuda" else "none"


def _packed_pair(target: Transformer, drafter: "Drafter"):
    """The stacked weights for packed passes, built once per (target, drafter) pair."""
    from .packed import PackedPair

    cached = getattr(drafter, "_packed_pair", None)
    if cached is None or cached.t is not target:
        cached = PackedPair(target, drafter.model)
        drafter._packed_pair = cached
    return cached


def generate(
    model: Transformer,
    prompt_ids,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    stop_ids: Sequence[int] | None = None,
    stream: StreamFn | None = None,
    mode: str = "ar",
    drafter: "Drafter | None" = None,
    block_size: int | None = None,
    on_round: Callable[[RoundInfo], None] | None = None,
    overlap: str | None = None,
    successor_threshold: float | None = None,
    exact: bool = False,
) -> GenerationOutput:
    """Generate continuations of one prompt or a batch of prompts.

    prompt_ids: list of ints, list of lists (a batch, lengths may differ), or a 1-D/2-D tensor.
    mode: ``"ar"`` (default), ``"sync"`` or ``"async"`` (both need a D3D ``drafter``), or
        ``"dflash"`` (needs a ``d3d.dflash.DFlashDrafter``).
    stop_ids: tokens that end a sequence (default: the model config's eos ids). The stop token is
        the last token of the output.
    stream: called as ``stream(sequence_index, new_token_ids)`` whenever tokens are committed.
    top_k/top_p apply to ``ar`` only (speculative modes sample from the full distribution at T).
    overlap / successor_threshold: how async runs the successor pass (see ``generate_speculative``;
        default overlap: ``default_overlap``).
    exact: speculative modes on CPU verify with row-invariant attention: greedy output then equals
        ``ar`` token for token in bf16 too, at about +30-50% verification cost (``generate_speculative``).
    Returns ``GenerationOutput(tokens=[[...] per prompt], stats=GenerationStats)``.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {MODES}")
    check_sampling_args(temperature, top_k, top_p)
    prompts = normalize_prompts(prompt_ids, model.cfg.vocab_size)
    stops = set(model.cfg.eos_token_ids if stop_ids is None else stop_ids)
    if mode == "ar":
        check_limits(prompts, max_new_tokens, model.cfg.max_position_embeddings)
        return generate_ar(model, prompts, max_new_tokens, temperature, top_k, top_p, seed, stops, stream)
    if drafter is None:
        raise ValueError(f"mode={mode!r} needs a drafter (see d3d.load_drafter / d3d.dflash.load_dflash)")
    from .dflash import DFlashDrafter

    if (mode == "dflash") != isinstance(drafter, DFlashDrafter):
        raise ValueError(f"mode={mode!r} needs a {'DFlash' if mode == 'dflash' else 'D3D'} drafter, got "
                         f"{type(drafter).__name__}")
    if drafter.cfg.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"drafter vocab_size={drafter.cfg.vocab_size} differs from the target's {model.cfg.vocab_size}")
    if (top_k is not None or top_p is not None) and temperature > 0:
        raise ValueError("top_k/top_p are only supported with mode='ar' (speculative modes are lossless at T)")
    B = block_size or drafter.block_size
    if not isinstance(B, int) or B < 2:
        raise ValueError(f"block_size={B!r}: must be an integer >= 2")
    check_limits(prompts, max_new_tokens, min(model.cfg.max_position_embeddings, drafter.cfg.max_position_embeddings),
                 extra=2 * B + 2)
    if mode == "dflash":
        return generate_dflash(model, drafter, prompts, max_new_tokens, B, temperature, seed, stops, stream, on_round)
    if overlap is None:
        overlap = default_overlap(model, drafter)
    if successor_threshold is None:
        # CPU: compute is saturated, so a successor that will likely be thrown away costs real time.
        # Chosen on *validation* prompts (docs/results/cpu-fastpath/threshold_validation.json, bundled
        # pair, bf16): 0 -> 1.05x of ar, 0.1-0.7 -> 1.41-1.43x (a plateau; sync 1.43x). A GPU stream
        # has idle capacity: always draft.
        successor_threshold = 0.0 if model.device.type == "cuda" else 0.3
    if overlap not in OVERLAPS:
        raise ValueError(f"overlap={overlap!r}: expected one of {OVERLAPS}")
    if exact and mode == "async" and overlap == "packed":
        raise ValueError("exact=True needs the target's own verification pass: use overlap='none' or 'thread', "
                         "not 'packed' (its joint pass attends all rows at once)")
    with _split_cpu_threads(mode == "async" and overlap == "thread" and model.device.type == "cpu"):
        return generate_speculative(model, drafter, prompts, max_new_tokens, mode, B, temperature, seed, stops,
                                    stream, on_round, overlap, successor_threshold, exact)
