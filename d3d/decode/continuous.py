"""Continuous batching: greedy answers to many prompts with a fixed number of sequences in flight.

``generate`` admits its whole batch at once and runs it until its longest sequence ends, its finished
rows idle. When answers vary in length that wastes the batch: of the 13,112 answers in
``data/qwen2.5-coder-answers`` (160-token cap, batches of 64), the rows kept the batch 64% full on
average. Here a row whose sequence ended takes the next prompt at once, through the admit path
``generate`` and the server use (``ArDecoder.admit``, then ``step``): the newcomer's prompt rides in
the same packed pass as the other rows' one-token steps, so every pass carries ``slots`` sequences
until the queue runs dry. The prompts' common prefix is computed once (``ArDecoder``'s ``prefix``).

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

from collections import deque
from typing import Callable, Iterable

from .engines import ArDecoder, check_limits, normalize_prompts
from .sequence import Sequence
from ..model.transformer import Transformer


def shared_prefix(prompts: list[list[int]]) -> int:
    """Length of the longest common prefix of ``prompts``, leaving every prompt one token of its own
    (the pass that admits a prompt must produce its first answer token)."""
    first, n = prompts[0], min(map(len, prompts)) - 1
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return n


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
    stops = set(stop_ids)
    seqs = [Sequence(p, max_new_tokens, stop_ids=stops, id=i) for i, p in enumerate(prompts)]
    prefix = prompts[0][:shared_prefix(prompts)] if share_prefix else []
    dec = ArDecoder(model, min(slots, len(prompts)), max(map(len, prompts)) + max_new_tokens, prefix=prefix)
    waiting = deque(seqs)
    while True:
        dec.admit([waiting.popleft() for _ in range(min(dec.room(), len(waiting)))])
        running = dec.step()
        if not running:
            return [s.output for s in seqs]
        for seq in running:
            if seq.done and on_done:
                on_done(seq.id, seq.output)


__all__ = ["generate_continuous", "shared_prefix"]
