"""Decoding behind one ``generate`` entry point.

``ar``      plain autoregressive decoding: one target forward per token (the baseline every
            speculative engine must reproduce exactly at temperature 0; ``ArDecoder``).
``sync``    draft B-1 tokens with the D3D drafter, verify them with one target forward.
``async``   D3D: beside verification the drafter drafts successor blocks for the likeliest
            verification outcomes (``d3d.decode.speculative``, ``d3d.decode.hypotheses``, ``d3d.decode.overlap``).
``dflash``  the DFlash baseline (its drafter reads the target's hidden states; ``d3d.decode.dflash``).

Each is a decoder whose rows sequences (``d3d.decode.sequence.Sequence``, one per request) join and
leave between rounds; ``generate`` makes one Sequence per prompt, admits them all at once and runs
rounds until all are done. All share prefill, streaming and statistics (``d3d.decode.generation.Decoder``).
"""

from __future__ import annotations

import collections.abc
from typing import Callable, Iterable

import torch

from .generation import Decoder, GenerationOutput, GenerationStats, StreamFn, sampling_generator
from .sequence import Sequence, all_greedy
from ..cpu import prefill as prefill_tiles
from ..model.transformer import Transformer
from .config import MODES, Sampling, SpecConfig, as_spec, resolved_spec
from .sampling import check_lossless_sampling, check_sampling_args
from .dflash import DFlashDecoder
from .speculative import RoundInfo, SpeculativeDecoder



def normalize_prompts(prompt_ids, vocab_size: int, what: str = "prompt_ids") -> list[list[int]]:
    """Accept one prompt (list of ints / 1-D tensor) or a batch (list of lists / 2-D tensor)."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() not in (1, 2):
            raise ValueError(f"{what}: expected a 1-D or 2-D tensor, got shape {tuple(prompt_ids.shape)}")
        prompt_ids = prompt_ids.tolist()
    if not isinstance(prompt_ids, collections.abc.Sequence) or isinstance(prompt_ids, (str, bytes)):
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


class ArDecoder(Decoder):
    """Autoregressive decoding over ``rows`` cache rows that sequences join (``admit``) and leave (done,
    or ``drop``) between steps: one target forward per step gives every running sequence one token, and a
    newcomer its first, its prompt read in the same packed pass as the others' last tokens (the layout
    takes any mix of per-row lengths: a refilled row costs no pass of its own).

    ``prefix``: a prompt prefix every admitted sequence starts with (a chat template's system turn),
    computed once in a cache row of its own and copied into each newcomer's row (``KVCache.share_prefix``)."""

    def __init__(self, model: Transformer, rows: int, max_len: int, stream: StreamFn | None = None,
                 prefix: list[int] | None = None):
        super().__init__(model, GenerationStats("ar", rows), stream)
        self.prefix, self.prefix_row = list(prefix or []), rows
        self.cache = model.new_cache(rows=rows + bool(self.prefix), max_len=max_len)
        if self.prefix:
            self.timed_pass([self.prefix], [self.prefix_row], prefill=True)

    def room(self) -> int:
        """How many sequences ``admit`` takes now: the free rows."""
        return sum(s is None or s.done for s in self.slots)

    @torch.inference_mode()
    def admit(self, seqs: list[Sequence]) -> None:
        """Place each of ``seqs`` in a free row, emptied or given the shared prefix; the next ``step``
        reads the rest of its prompt and gives it its first token."""
        n = len(self.prefix)
        for seq in seqs:
            if n and (seq.tokens[:n] != self.prefix or seq.num_prompt <= n):
                raise ValueError(f"admit: sequence {seq.id}'s prompt must start with the decoder's {n}-token "
                                 f"prefix and go on past it")
        self.place(seqs)
        for seq in seqs:
            if n:
                self.cache.share_prefix(self.prefix_row, seq.row, n)
            else:
                self.cache.crop(seq.row, 0)

    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """One token for every running sequence, the first for those admitted since the last step;
        returns them (none: nothing to decode). A pass of newcomers alone counts as prefill."""
        seqs = self.schedule()
        if seqs:
            feeds = [s.tokens[self.cache.lengths[s.row]:] for s in seqs]  # what each row does not hold yet
            prompts = [s.num_output == 0 for s in seqs]  # newcomers: their feed is their prompt
            logits = self.timed_pass(feeds, [s.row for s in seqs], prefill=all(prompts), greedy=all_greedy(seqs),
                                     prompts=prompts)
            for seq, t in zip(seqs, self.pick(seqs, logits)):
                self.emit(seq, [t])
        return seqs

    @torch.inference_mode()
    def timed_pass(self, feeds: list[list[int]], rows: list[int], prefill: bool, greedy: bool = False,
                   prompts: list[bool] | None = None) -> torch.Tensor:
        """One target pass appending ``feeds[i]`` to cache row ``rows[i]``: the logits of each feed's last
        token (``greedy``: for their argmax only). Counted as a target forward; its time is prefill's where
        ``prefill``. ``prompts[i]``: feed i is a prompt's tokens (default: all are), which may take AMX's tiles."""
        layout = self.cache.layout([len(f) for f in feeds], rows=rows)
        ids = torch.tensor([t for f in feeds for t in f], device=self.target.device)
        last = None if len(ids) == len(feeds) else layout.last_token_index()  # one token a row: every logit
        with prefill_tiles.tiles([len(f) for f in feeds], prompts):  # long prompts (d3d.cpu.prefill)
            logits, (t0, t1) = self.clock.timed(lambda: self.target(ids, layout, self.cache, logits_index=last,
                                                                    greedy=greedy))
        self.stats.target_forwards += 1
        if prefill:
            self.stats.prefill_seconds += t1 - t0
        return logits


def sequences(prompts: list[list[int]], max_new_tokens: int, sampling: Sampling, stop_ids: set[int],
              device: torch.device) -> list[Sequence]:
    """``generate``'s batch as Sequences (ids 0, 1, ...), drawing from one random stream at T > 0."""
    gen = sampling_generator(device, sampling)
    return [Sequence(p, max_new_tokens, sampling, stop_ids, id=i, gen=gen) for i, p in enumerate(prompts)]


def generate(
    model: Transformer,
    prompt_ids,
    *,
    max_new_tokens: int = 128,
    spec: "SpecConfig | str | None" = None,
    drafter=None,
    sampling: Sampling | None = None,
    stop_ids: Iterable[int] | None = None,
    stream: StreamFn | None = None,
    on_round: Callable[[RoundInfo], None] | None = None,
) -> GenerationOutput:
    """Generate continuations of one prompt or a batch of prompts.

    prompt_ids: list of ints, list of lists (a batch, lengths may differ), or a 1-D/2-D tensor.
    spec: how to decode (``d3d.decode.config.SpecConfig``, or its compact string: ``"sync"``,
        ``"async hypotheses=4"``); None is ``ar``. Its unset knobs take the device's measured defaults.
        ``sync`` and ``async`` need a D3D ``drafter``, ``dflash`` a ``d3d.draft.dflash.DFlashDrafter``.
    sampling: ``Sampling(temperature, top_k, top_p, seed)``; None is greedy.
    stop_ids: tokens that end a sequence (default: the model config's eos ids). The stop token is
        the last token of the output.
    stream: called as ``stream(sequence_index, new_token_ids)`` whenever tokens are committed.
    on_round: called with a ``RoundInfo`` per sequence and speculative round (``--explain``).
    Returns ``GenerationOutput(tokens=[[...] per prompt], stats=GenerationStats)``.
    """
    spec, sampling = as_spec(spec), sampling or Sampling()
    if not isinstance(sampling, Sampling):
        raise TypeError(f"sampling: expected a d3d.decode.config.Sampling, got {type(sampling).__name__}")
    check_sampling_args(sampling.temperature, sampling.top_k, sampling.top_p)
    prompts = normalize_prompts(prompt_ids, model.cfg.vocab_size)
    stops = set(model.cfg.eos_token_ids if stop_ids is None else stop_ids)
    spec.check()
    if spec.mode == "ar":
        check_limits(prompts, max_new_tokens, model.cfg.max_position_embeddings)
    else:
        check_lossless_sampling(sampling)
        spec = resolved_spec(model, drafter, spec)
        check_limits(prompts, max_new_tokens, min(model.cfg.max_position_embeddings,
                                                  drafter.cfg.max_position_embeddings), extra=2 * spec.block_size + 2)
    seqs = sequences(prompts, max_new_tokens, sampling, stops, model.device)
    max_len = max(map(len, prompts)) + max_new_tokens
    if spec.mode == "ar":
        return ArDecoder(model, len(seqs), max_len, stream).run(seqs)
    rounds = DFlashDecoder if spec.mode == "dflash" else SpeculativeDecoder
    return rounds(model, drafter, spec, len(seqs), max_len, stream, on_round).run(seqs)


__all__ = ["generate", "GenerationOutput", "GenerationStats", "RoundInfo", "ArDecoder", "MODES", "SpecConfig",
           "Sampling", "normalize_prompts", "check_limits", "resolved_spec", "sequences"]
