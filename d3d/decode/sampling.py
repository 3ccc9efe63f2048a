"""Choosing the next token from logits: greedy, or temperature sampling with optional top-k/top-p."""

from __future__ import annotations

import math

import torch

from ..kernels import glue_cpu


def check_sampling_args(temperature: float, top_k: int | None = None, top_p: float | None = None) -> None:
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature={temperature!r}: must be a finite number >= 0 (0 = greedy)")
    if top_k is not None and (not isinstance(top_k, int) or top_k <= 0):
        raise ValueError(f"top_k={top_k!r}: must be a positive integer (or None)")
    if top_p is not None and not (0 < top_p <= 1):
        raise ValueError(f"top_p={top_p!r}: must be in (0, 1] (or None)")


def check_lossless_sampling(sampling) -> None:
    """What a speculative mode can sample (a ``Sampling``): the target's distribution at T, not a truncation."""
    if sampling.temperature > 0 and (sampling.top_k is not None or sampling.top_p is not None):
        raise ValueError("top_k/top_p are only supported with mode='ar' (speculative modes are lossless at T)")


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set logits outside the top-k / nucleus (top-p) to -inf. logits: [N, V] (already / T)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the mass *before* it already reaches top_p (the first token always stays).
        drop = probs.cumsum(-1) - probs >= top_p
        drop[..., 0] = False  # even where top_p underflows the float32 sums (1e-300 is 0 there)
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def sample_next(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits [N, V] -> token ids [N]. temperature 0 is greedy (lowest index wins ties)."""
    if temperature == 0:
        return glue_cpu.argmax(logits)  # torch.argmax's result, in one call on a CPU
    probs = filter_logits(logits.float() / temperature, top_k, top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample_rows(logits: torch.Tensor, settings: list, generators: list) -> torch.Tensor:
    """logits [N, V] -> token ids [N], row j sampled as ``settings[j]`` says (a ``Sampling``: temperature,
    top_k, top_p) with ``generators[j]``. Rows sharing a setting and a generator are sampled in one
    ``sample_next`` call, so a batch of one setting draws exactly as ``sample_next`` does."""
    groups: dict[tuple, list[int]] = {}
    for j, (s, g) in enumerate(zip(settings, generators)):
        groups.setdefault((s.temperature, s.top_k, s.top_p, id(g)), []).append(j)
    if len(groups) == 1:
        s = settings[0]
        return sample_next(logits, s.temperature, s.top_k, s.top_p, generators[0])
    out = torch.empty(len(settings), dtype=torch.long, device=logits.device)
    for (t, k, p, _), js in groups.items():
        at = torch.tensor(js, device=logits.device)
        out[at] = sample_next(logits.index_select(0, at), t, k, p, generators[js[0]])
    return out
