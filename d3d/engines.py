"""Decoding loops behind one ``generate`` entry point.

``ar`` — plain autoregressive decoding: one target forward per token (the baseline every
speculative engine must reproduce exactly at temperature 0).

All engines share prefill, argument checks, stop handling and statistics.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch

from .model import Transformer
from .sampling import check_sampling_args, sample_next

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

    @property
    def total_generated(self) -> int:
        return sum(self.num_generated)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of decoding (prefill excluded; the first token comes from prefill)."""
        t = self.prefill_seconds + self.decode_seconds
        return self.total_generated / t if t > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens_per_second"] = self.tokens_per_second
        d["total_generated"] = self.total_generated
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
    stats.decode_seconds = time.perf_counter() - t1
    stats.num_generated = [len(t) for t in out.tokens]
    stats.stopped = out.stopped
    return GenerationOutput(out.tokens, stats)


MODES = ("ar",)


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
) -> GenerationOutput:
    """Generate continuations of one prompt or a batch of prompts.

    prompt_ids: list of ints, list of lists (a batch, lengths may differ), or a 1-D/2-D tensor.
    stop_ids: tokens that end a sequence (default: the model config's eos ids). The stop token is
        the last token of the output.
    stream: called as ``stream(sequence_index, new_token_ids)`` whenever tokens are committed.
    Returns ``GenerationOutput(tokens=[[...] per prompt], stats=GenerationStats)``.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {MODES}")
    check_sampling_args(temperature, top_k, top_p)
    prompts = normalize_prompts(prompt_ids, model.cfg.vocab_size)
    check_limits(prompts, max_new_tokens, model.cfg.max_position_embeddings)
    stops = set(model.cfg.eos_token_ids if stop_ids is None else stop_ids)
    return generate_ar(model, prompts, max_new_tokens, temperature, top_k, top_p, seed, stops, stream)
