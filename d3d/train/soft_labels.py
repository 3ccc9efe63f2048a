"""Soft labels: the target's top-k next-token distribution at every position of its own answers.

The drafter is trained on the target's greedy text, so a hard label says only which token the
target chose. One more target pass over each training row (teacher forcing: all positions at
once, ~window labels per pass) gives the distribution it chose from; the drafter then minimises
the cross-entropy to it (forward KL up to the teacher's entropy, the distillation of DistillSpec).
On greedy rows the distribution's argmax is the row's next token, so the hard label is its mode.

Layout: ``ids`` int32 ``[N, L, k]`` and ``probs`` fp16 ``[N, L, k]``: the k most likely targets of
``x[j]`` given ``x[:j]`` (softmax over the full vocabulary, then the top k); position 0 has no
context (ids -1, probs 0).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ..model.transformer import Transformer
from .common import labels_cache, resumable_rows, save_atomic


@torch.no_grad()
def teacher_topk(target: Transformer, rows: torch.Tensor, k: int, lengths: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, probs)`` ``[n, L, k]`` for ``rows`` ``[n, L]`` in one target pass; ``lengths`` [n]:
    tokens that matter per row (the pass stops at the longest, the rest is left at -1 / 0)."""
    n, L = rows.shape
    ids = torch.full((n, L, k), -1, dtype=torch.int32)
    probs = torch.zeros(n, L, k, dtype=torch.float16)
    upto = L if lengths is None else int(lengths.max())
    if upto < 2:
        return ids, probs
    logits = target(rows[:, : upto - 1].to(target.device)).float()
    top, i = logits.topk(k, dim=-1)
    p = (top - torch.logsumexp(logits, dim=-1, keepdim=True)).exp()  # softmax's top k, no [n, L, V] softmax copy
    ids[:, 1:upto], probs[:, 1:upto] = i.int().cpu(), p.half().cpu()
    return ids, probs


def make_soft_labels(target: Transformer, rows: torch.Tensor, lengths: torch.Tensor, k: int, cache_dir: Path,
                     batch: int = 8, log=print) -> tuple[torch.Tensor, torch.Tensor]:
    """``teacher_topk`` of every row, cached in ``cache_dir`` (keyed by the rows, k and the target)
    and resumable by chunks. Rows are labelled in length order, so a pass stops near each batch's
    own length (right padding is not computed)."""
    if k < 1:
        raise ValueError(f"--soft-labels={k}: must be >= 1 (0 turns soft labels off)")
    path, partial, cached = labels_cache(cache_dir, "soft-labels", target, rows.numpy().tobytes()
                                         + lengths.numpy().tobytes() + str(k).encode(), "soft labels", log)
    if cached is not None:
        return cached["ids"], cached["probs"]
    order = torch.argsort(lengths, stable=True)

    def label(i: int, j: int) -> torch.Tensor:  # [j - i, L, 2k] fp32: ids (exact below 2^24), then probs
        parts = [teacher_topk(target, rows[order[s: min(s + batch, j)]], k, lengths[order[s: min(s + batch, j)]])
                 for s in range(i, j, batch)]
        return torch.cat([torch.cat([a.float(), b.float()], -1) for a, b in parts])

    what = f"soft labels (top {k}, {str(target.dtype).removeprefix('torch.')})"
    packed = resumable_rows(partial, rows.shape[0], 8 * batch, label, what, rows.shape[1], "positions", log)
    ids = torch.empty(rows.shape[0], rows.shape[1], k, dtype=torch.int32)
    probs = torch.empty(rows.shape[0], rows.shape[1], k, dtype=torch.float16)
    ids[order], probs[order] = packed[..., :k].int(), packed[..., k:].half()
    save_atomic({"ids": ids, "probs": probs}, path)
    partial.unlink(missing_ok=True)
    return ids, probs


def soft_cross_entropy(logits: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor,
                       label_map: torch.Tensor | None = None) -> torch.Tensor:
    """``[M]``: -sum_k q_k log p(ids_k) for logits ``[M, V]`` and soft labels ``[M, k]``; q is
    ``probs`` renormalised over the ids the head scores (``label_map`` [V_target] -> head index, -1
    outside a reduced drafting vocabulary). A row with no such id contributes 0."""
    idx = ids.long() if label_map is None else label_map[ids.long().clamp(min=0)]
    q = probs.float() * ((ids >= 0) & (idx >= 0))
    q = q / q.sum(-1, keepdim=True).clamp(min=1e-12)
    logp = F.log_softmax(logits.float(), dim=-1).gather(1, idx.clamp(min=0))
    return -(q * logp).sum(-1)
