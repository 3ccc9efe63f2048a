"""The BD3 training pass without the positions no supervised logit depends on.

``bd3_loss`` feeds ``x_t ⊕ x_0`` (2L positions per row) under the training mask, where a noisy
block sees its own block and the clean tokens of earlier blocks, and a clean token sees only
clean tokens. So a noisy block with no supervised position, and clean tokens from the start of a
row's last supervised block on, are attended by nothing that is supervised: leaving them out
changes no supervised logit, hence neither the loss nor its gradient (tests assert both).

Chat rows gain most: a prompt is context, not supervision, and short rows are right-padded. On
the Qwen2.5-Coder chat data (5,600 rows of 256 tokens) a batch of 8 pads to its longest row: 404
of 512 positions a row when rows are drawn at random, 320 when drawn from 128 rows of similar
length (``grouped_batch``); a training step of the 2-layer drafter then takes less time than the
full pass, the more so with grouped rows (docs/results/qwen-drafter/compact_probe.json, 8 steps
each, interleaved).
"""

from __future__ import annotations

import torch


def compact_layout(xt: torch.Tensor, x0: torch.Tensor, weight: torch.Tensor, attn_mask: torch.Tensor,
                   block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kept part of ``x_t ⊕ x_0``, row by row, padded to the longest row.

    xt, x0, weight: ``[b, L]`` (weight > 0 where a position is supervised); attn_mask: the full
    ``[2L, 2L]`` training mask. Returns ``(ids [b, S], positions [b, S], mask [b, S, S], index
    [M])``: ``index`` holds the flat position in ``[b * S]`` of each supervised x_t position, in
    the order of ``weight.flatten().nonzero()``. Kept positions stay in their ``x_t ⊕ x_0``
    order and take their mask entries from ``attn_mask``; a pad position sees only itself.
    """
    b, L = x0.shape
    supervised = weight > 0
    noisy_blocks = supervised.view(b, L // block_size, block_size).any(-1)  # [b, nb]
    last = (noisy_blocks * torch.arange(L // block_size)).amax(-1)  # last supervised block (0 if none)
    keep = torch.cat([noisy_blocks.repeat_interleave(block_size, 1),
                      torch.arange(L) < (last * block_size)[:, None]], dim=1)  # [b, 2L]
    counts = keep.sum(1)
    S = max(int(counts.max()), 1)
    full = torch.argsort((~keep).int(), dim=1, stable=True)[:, :S]  # kept indices first, in order
    valid = torch.arange(S) < counts[:, None]
    ids = torch.cat([xt, x0], dim=1).gather(1, full)
    mask = attn_mask[full[:, :, None], full[:, None, :]] & valid[:, :, None] & valid[:, None, :]
    mask |= torch.eye(S, dtype=torch.bool) & ~valid[:, :, None]
    rank = keep.int().cumsum(1) - 1  # [b, 2L]: where each kept position went
    sel = supervised.flatten().nonzero().squeeze(1)
    index = sel // L * S + rank[:, :L].flatten()[sel]
    return ids, full % L, mask, index


def kept_length(loss_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[rows]``: positions a row keeps in ``compact_layout`` if all its supervised tokens are
    masked (the most it can keep: noise masks a subset)."""
    b, L = loss_mask.shape
    blocks = (loss_mask > 0).view(b, L // block_size, block_size).any(-1)
    last = (blocks * torch.arange(L // block_size)).amax(-1)
    return (blocks.sum(-1) + last) * block_size


def length_order(lengths: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Row indices sorted by ``lengths``, ties in a fixed random order (not the file's order)."""
    shuffle = torch.randperm(lengths.numel(), generator=torch.Generator().manual_seed(seed))
    return shuffle[torch.argsort(lengths[shuffle], stable=True)]


def grouped_batch(order: torch.Tensor, batch_size: int, gen: torch.Generator, window: int = 128) -> torch.Tensor:
    """``batch_size`` rows drawn at random from ``window`` neighbours in ``order`` (cyclically, from
    a uniform start): every row is drawn equally often, and a batch's rows have similar lengths."""
    window = min(window, order.numel())
    start = torch.randint(0, order.numel(), (1,), generator=gen)
    return order[(start + torch.randint(0, window, (batch_size,), generator=gen)) % order.numel()]
