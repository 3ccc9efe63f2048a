"""Continuous batching: greedy answers to many prompts with a fixed number of sequences in flight.

``ArDecoder`` (``generate`` with ar) runs a batch until its longest sequence ends, its finished rows dropping out. When
answers vary in length that wastes the batch: of the 13,112 answers in
``data/qwen2.5-coder-answers`` (160-token cap, batches of 64), the rows kept the batch 64% full
on average. Here a cache row whose sequence ended is refilled with the next prompt at once: the
new prompt's prefill rides in the same packed pass as the other rows' one-token steps (the packed
layout allows any mix of per-row lengths; ``d3d.model.cache.make_layout``), so every pass carries
``slots`` sequences until the queue runs dry. The prompts' common prefix is computed once.

Refilling and the shared prefix each gain a little over fixed batches (``python -m bench answers``;
figures in docs/results/continuous/README.md). Little, because a 2-core CPU is compute-bound at 64
rows: a half-empty pass costs about half as much, and prefill is a large share of the tokens a
request costs.

Output equals ar ``generate`` on each prompt alone, token for token in fp32 (``tests/test_continuous.py``);
in low precision a row's logits can differ in the last bits with the batch around it, as they do
in any batched decoding (bf16: all answers equal to fixed batches' without the shared prefix, most
with it, whose K/V come from a pass of another shape; docs/results/continuous/README.md).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from .engines import check_limits, normalize_prompts
from .sequence import Sequence
from ..model.transformer import Transformer
from .sampling import sample_next


def shared_prefix(prompts: list[list[int]]) -> int:
    """Length of the longest common prefix of ``prompts``, leaving every prompt one token of its own
    (the pass that admits a prompt must produce its first answer token)."""
    first, n = prompts[0], min(map(len, prompts)) - 1
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return n


@torch.inference_mode()
def generate_continuous(model: Transformer, prompts: list[list[int]], max_new_tokens: int,
                        stop_ids: Iterable[int] = (), slots: int = 64, share_prefix: bool = True,
                        on_done: Callable[[int, list[int]], None] | None = None) -> list[list[int]]:
    """Greedy (T = 0) continuations of every prompt, ``slots`` at a time, in prompt order.

    prompts: token ids, lengths may differ. Returns one list of generated ids per prompt (a stop
    token, when hit, is its last). ``on_done(i, tokens)`` is called as each sequence ends.
    The prompts' common prefix (a chat template's system turn: ~25 of the store's ~88 prompt
    tokens) is computed once, in a cache row of its own, and copied to each admitted row
    (``KVCache.share_prefix``; ``share_prefix=False``: each row computes its whole prompt). Cache:
    ``slots + 1`` rows of ``max(len(prompt)) + max_new_tokens``."""
    if not prompts:
        return []
    if slots <= 0:
        raise ValueError(f"slots={slots}: must be a positive number of sequences in flight")
    prompts = normalize_prompts([list(p) for p in prompts], model.cfg.vocab_size, "prompts")
    check_limits(prompts, max_new_tokens, model.cfg.max_position_embeddings)
    slots = min(slots, len(prompts))
    stops = set(stop_ids)
    seqs = [Sequence(p, max_new_tokens, stop_ids=stops, id=i) for i, p in enumerate(prompts)]
    cache = model.new_cache(rows=slots + 1, max_len=max(map(len, prompts)) + max_new_tokens)
    prefix_row, n_shared = slots, shared_prefix(prompts) if share_prefix else 0
    if n_shared:
        model(torch.tensor(prompts[0][:n_shared], device=model.device), cache.layout([n_shared], rows=[prefix_row]),
              cache, logits_index=torch.tensor([n_shared - 1], device=model.device))
    queue = iter(seqs)
    feed: dict[int, tuple[Sequence, list[int]]] = {}  # cache row -> its sequence and the tokens it appends next

    def admit(row: int) -> None:
        """Give ``row`` the next sequence in the queue (its old K/V replaced by the shared prefix's),
        or retire it."""
        seq = next(queue, None)
        if seq is not None:
            cache.share_prefix(prefix_row, row, n_shared)
            seq.row, feed[row] = row, (seq, seq.tokens[n_shared:])

    for row in range(slots):
        admit(row)
    while feed:
        rows = list(feed)
        layout = cache.layout([len(feed[r][1]) for r in rows], rows=rows)
        ids = torch.tensor([t for r in rows for t in feed[r][1]], device=model.device)
        logits = model(ids, layout, cache, logits_index=layout.last_token_index())
        running, feed = [feed[r][0] for r in rows], {}
        for seq, t in zip(running, sample_next(logits, 0.0).tolist()):
            seq.commit([t])
            if seq.done:
                if on_done:
                    on_done(seq.id, seq.output)
                admit(seq.row)
            else:
                feed[seq.row] = (seq, [t])
    return [s.output for s in seqs]


__all__ = ["generate_continuous", "shared_prefix"]
