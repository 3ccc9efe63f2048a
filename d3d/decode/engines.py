"""Decoding behind one ``generate`` entry point.

``ar``      plain autoregressive decoding: one target forward per token (the baseline every
            speculative engine must reproduce exactly at temperature 0).
``sync``    draft B-1 tokens with the D3D drafter, verify them with one target forward.
``async``   D3D: beside verification the drafter drafts successor blocks for the likeliest
            verification outcomes (``d3d.decode.speculative``, ``d3d.decode.hypotheses``, ``d3d.decode.overlap``).
``dflash``  the DFlash baseline (its drafter reads the target's hidden states).

All engines share prefill, output buffers, stop handling and statistics (``d3d.decode.generation``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch

from .generation import Clock, GenerationOutput, GenerationStats, Output, StreamFn, prefill
from ..model.transformer import Transformer
from .overlap import (OVERLAPS, async_defaults, default_leaves, default_lookup, default_overlap,
                      default_verify_min_prob)
from .sampling import check_sampling_args, sample_next
from .speculative import RoundInfo, generate_dflash, generate_speculative

if TYPE_CHECKING:
    from .datastore import Datastore
    from ..draft.drafter import Drafter


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
    out, clock = Output(n, max_new_tokens, stop_ids, stream), Clock()
    cache = model.new_cache(rows=n, max_len=max(len(p) for p in prompts) + max_new_tokens)
    next_ids = prefill(model, prompts, cache, temperature, gen, top_k=top_k, top_p=top_p)[0]
    stats.target_forwards += 1
    stats.prefill_seconds = clock.now()

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
    return out.finish(stats, clock.now() - stats.prefill_seconds)


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
    exact: bool | None = None,
    hypotheses: int | None = None,
    fanout: int | None = None,
    verify_min_prob: float | str | None = None,
    leaves: int | None = None,
    lookup: int | None = None,
    datastore: "Datastore | None" = None,
) -> GenerationOutput:
    """Generate continuations of one prompt or a batch of prompts.

    prompt_ids: list of ints, list of lists (a batch, lengths may differ), or a 1-D/2-D tensor.
    mode: ``"ar"`` (default), ``"sync"`` or ``"async"`` (both need a D3D ``drafter``), or
        ``"dflash"`` (needs a ``d3d.draft.dflash.DFlashDrafter``).
    stop_ids: tokens that end a sequence (default: the model config's eos ids). The stop token is
        the last token of the output.
    stream: called as ``stream(sequence_index, new_token_ids)`` whenever tokens are committed.
    top_k/top_p apply to ``ar`` only (speculative modes sample from the full distribution at T).
    overlap / hypotheses / fanout / successor_threshold: how async drafts successors (``d3d.decode.overlap``,
        ``d3d.decode.hypotheses``, ``generate_speculative``); None = the measured default of the device
        (``d3d.decode.overlap.async_defaults``).
    exact: speculative modes on CPU verify with row-invariant attention: greedy output then equals
        ``ar`` token for token in bf16 too, at about +30-50% verification cost (``generate_speculative``).
        None (default): on where the target multiplies int8-quantized activations (``d3d.cpu.quant``), whose
        rounding turns attention's last-bit differences between a 1-row and a T-row pass into visible
        ones; off elsewhere.
    verify_min_prob: sync/async verify only the leading drafts the drafter believes in jointly with
        at least this probability (0: all; ``generate_speculative``), or ``"auto"``: tokens per second
        times the seconds a verified row adds, measured as it runs (``d3d.decode.row_price``); None = the
        device's measured default (``d3d.decode.overlap.default_verify_min_prob``: "auto" on a CPU, 0 on CUDA).
    leaves: sync/async also verify the L likeliest bonuses the drafter proposed, one target row each
        (``d3d.decode.speculative``): a round whose bonus is one of them commits one more token. None = the
        device's measured default (``d3d.decode.overlap.default_leaves``: 2 for sync, 0 for async and for sync
        on a CPU in fp32 through oneDNN, where a row costs time), or 0 with exact (which refuses leaves).
    lookup: sync/async draft by copying from the context where its last ``lookup`` tokens occurred
        before (prompt lookup, ``d3d.decode.lookup``), with the drafter elsewhere; 0 never. None = the
        measured default (``d3d.decode.overlap.default_lookup``: 3 for sync, 0 for async).
    datastore: sync/async rows without a copied draft look one up in the target's own earlier text
        (a ``d3d.decode.datastore.Datastore``, e.g. ``d3d.load_datastore(answer_store_dir, target)``) before
        asking the drafter; None: never.
    Returns ``GenerationOutput(tokens=[[...] per prompt], stats=GenerationStats)``.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {MODES}")
    check_sampling_args(temperature, top_k, top_p)
    prompts = normalize_prompts(prompt_ids, model.cfg.vocab_size)
    stops = set(model.cfg.eos_token_ids if stop_ids is None else stop_ids)
    if datastore is not None:
        from .datastore import Datastore

        if not isinstance(datastore, Datastore):
            raise ValueError(f"datastore: expected a d3d.decode.datastore.Datastore (d3d.load_datastore), got "
                             f"{type(datastore).__name__}")
        if mode not in ("sync", "async"):
            raise ValueError(f"datastore with mode={mode!r}: datastore drafts are for the D3D modes, sync and async")
    if mode == "ar":
        check_limits(prompts, max_new_tokens, model.cfg.max_position_embeddings)
        return generate_ar(model, prompts, max_new_tokens, temperature, top_k, top_p, seed, stops, stream)
    if drafter is None:
        raise ValueError(f"mode={mode!r} needs a drafter (see d3d.load_drafter / d3d.draft.dflash.load_dflash)")
    from ..draft.dflash import DFlashDrafter

    if (mode == "dflash") != isinstance(drafter, DFlashDrafter):
        raise ValueError(f"mode={mode!r} needs a {'DFlash' if mode == 'dflash' else 'D3D'} drafter, got "
                         f"{type(drafter).__name__}")
    if drafter.cfg.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"drafter vocab_size={drafter.cfg.vocab_size} differs from the target's {model.cfg.vocab_size}")
    if (top_k is not None or top_p is not None) and temperature > 0:
        raise ValueError("top_k/top_p are only supported with mode='ar' (speculative modes are lossless at T)")
    exact_given = exact is not None
    if exact is None:
        exact = model.int8_activations
    if not isinstance(exact, bool):
        raise ValueError(f"exact={exact!r}: must be True, False or None")
    B = block_size or drafter.block_size
    if not isinstance(B, int) or B < 2:
        raise ValueError(f"block_size={B!r}: must be an integer >= 2")
    check_limits(prompts, max_new_tokens, min(model.cfg.max_position_embeddings, drafter.cfg.max_position_embeddings),
                 extra=2 * B + 2)
    if mode == "dflash":
        return generate_dflash(model, drafter, prompts, max_new_tokens, B, temperature, seed, stops, stream, on_round,
                               exact)
    settings = d3d_settings(model.device, mode, exact, model.dtype, quantized=model.quantized,
                            exact_why=None if exact_given else "a target with int8 activations", overlap=overlap,
                            hypotheses=hypotheses, fanout=fanout, successor_threshold=successor_threshold,
                            verify_min_prob=verify_min_prob, leaves=leaves, lookup=lookup)
    return generate_speculative(model, drafter, prompts, max_new_tokens, mode, B, temperature, seed, stops, stream,
                                on_round, exact=exact, datastore=datastore, **settings)


def d3d_settings(device: torch.device, mode: str, exact: bool, dtype: torch.dtype | None = None,
                 quantized: bool = False, exact_why: str | None = None, **given) -> dict:
    """The keyword arguments of ``generate_speculative`` for a D3D ``mode``: each one ``given`` as
    None takes the measured default of the device and the target's ``dtype`` and weights
    (``d3d.decode.overlap``); every value is checked, by name. ``exact_why``: what turned ``exact`` on,
    where the caller did not ask for it (for the error that refuses leaves then)."""
    chosen = async_defaults(device)
    defaults = {"overlap": chosen.overlap, "hypotheses": chosen.hypotheses, "fanout": chosen.fanout,
                "successor_threshold": chosen.threshold, "verify_min_prob": default_verify_min_prob(device),
                "leaves": 0 if exact else default_leaves(device, mode, dtype, quantized),
                "lookup": default_lookup(device, mode)}
    s = {k: defaults[k] if given.get(k) is None else given[k] for k in defaults}
    if s["overlap"] not in OVERLAPS:
        raise ValueError(f"overlap={s['overlap']!r}: expected one of {OVERLAPS}")
    p = s["verify_min_prob"]
    if p != "auto" and not (isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1):
        raise ValueError(f"verify_min_prob={p!r}: must be a probability in [0, 1] or 'auto' (measured as it runs)")
    for name, least in (("hypotheses", 1), ("fanout", 1), ("leaves", 0), ("lookup", 0)):
        value = s[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name}={value!r}: must be an integer >= {least}")
    if exact and s["leaves"]:
        what = (f"exact=True with leaves={s['leaves']}" if exact_why is None else
                f"leaves={s['leaves']} with {exact_why} (its speculative modes verify with exact=True; d3d/cpu/quant.py)")
        raise ValueError(f"{what}: a leaf attends through a mask, not as a one-token step does, so its output could "
                         "part from ar in low precision; use leaves=0"
                         + ("" if exact_why is None else ", or D3D_QUANT_ACTIVATIONS=fp32"))
    if exact and mode == "async" and s["overlap"] == "packed":
        raise ValueError("exact=True needs the target's own verification pass: use overlap='none', "
                         "not 'packed' (its joint pass attends all rows at once)")
    return s


MODES = ("ar", "sync", "async", "dflash")

__all__ = ["generate", "generate_ar", "generate_speculative", "generate_dflash", "GenerationOutput",
           "GenerationStats", "RoundInfo", "MODES", "OVERLAPS", "default_overlap", "normalize_prompts",
           "check_limits", "d3d_settings"]
