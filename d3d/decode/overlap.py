"""How async D3D runs the hypotheses pass beside verification: three small strategies, one method.

``run(verify, hypotheses)`` runs the target's verification pass and the drafter's hypotheses pass
(``d3d.draft.drafter.DraftJob``, or None when no row has hypotheses this round) and returns both logits
and their time spans. The strategies differ only in how the two passes share the machine:

    none     one after the other in this thread (CPU default: measured fastest on 2 cores)
    stream   the hypotheses pass on a second CUDA stream (CUDA default): the host enqueues both
             passes before it reads anything back, so the GPU runs them concurrently
    packed   one joint pass of both models (``d3d.decode.packed``): shared per-op overhead, stacked weights
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..model.cache import KVCache, PassLayout
from .config import OVERLAPS
from .generation import Clock
from ..model.transformer import Transformer

if TYPE_CHECKING:
    from ..draft.drafter import Drafter, DraftJob

Span = tuple[float, float]


@dataclass
class Verification:
    """The target's verification pass of one round."""

    target: Transformer
    ids: torch.Tensor
    layout: PassLayout
    cache: KVCache
    greedy: bool = False  # every row decodes greedily: the argmax of its logits is all that is read

    @torch.inference_mode()
    def forward(self) -> torch.Tensor:
        return self.target(self.ids, self.layout, self.cache, greedy=self.greedy)


class Serial:
    """``none``: verification, then the hypotheses pass, in this thread."""

    name = "none"

    def __init__(self, clock: Clock):
        self.clock = clock

    def new_caches(self, target, drafter, rows: int, target_len: int, drafter_len: int):
        return target.new_cache(rows, target_len), drafter.new_cache(rows, drafter_len)

    def run(self, verify: Verification, job: "DraftJob | None"):
        t_logits, v_span = self.clock.timed(verify.forward)
        if job is None:
            return t_logits, None, v_span, None
        d_logits, d_span = self.clock.timed(job.forward)
        return t_logits, d_logits, v_span, d_span

    def close(self) -> None:
        pass


class SideStream:
    """A second CUDA stream: ``follow`` (start after the work already queued), ``active`` (a context
    that queues work on it), ``join`` (the main stream waits for it)."""

    def __init__(self, device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def follow(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def active(self):
        return torch.cuda.stream(self.stream)

    def join(self) -> None:
        torch.cuda.current_stream(self.device).wait_stream(self.stream)


class Streamed(Serial):
    """``stream``: the hypotheses pass on a side stream, enqueued before verification, and nothing
    read back to the host until both are queued (a read in between would make the host wait for
    the hypotheses and serialise the passes: tests/test_engines.py checks). Spans are host times:
    when the passes were *enqueued*, not when the GPU ran them."""

    name = "stream"

    def __init__(self, clock: Clock, device):
        super().__init__(clock)
        self.side = SideStream(device)

    def run(self, verify, job):
        if job is None:
            return super().run(verify, None)
        self.side.follow()
        with self.side.active():
            d_logits, d_span = self.clock.timed(job.forward)
        t_logits, v_span = self.clock.timed(verify.forward)
        self.side.join()
        return t_logits, d_logits, v_span, d_span


class Packed(Serial):
    """``packed``: both passes as one (``d3d.decode.packed.PackedPair``); needs the drafter to have the
    target's layer shapes and joint caches (``new_caches``)."""

    name = "packed"

    def __init__(self, clock: Clock, target: Transformer, drafter: "Drafter"):
        super().__init__(clock)
        self.pair = packed_pair(target, drafter)

    def new_caches(self, target, drafter, rows, target_len, drafter_len):
        return self.pair.new_caches(rows, rows, max(target_len, drafter_len))

    def run(self, verify, job):
        if job is None:
            return super().run(verify, None)
        (t_logits, d_logits), span = self.clock.timed(lambda: self.pair.forward(
            verify.ids, verify.layout, verify.cache, job.ids, job.layout, job.cache, job.index))
        return t_logits, d_logits, span, span


def packed_pair(target: Transformer, drafter: "Drafter"):
    """The stacked weights for packed passes, built once per (target, drafter) pair."""
    from .packed import PackedPair

    cached = getattr(drafter, "_packed_pair", None)
    if cached is None or cached.t is not target:
        cached = PackedPair(target, drafter.model)
        drafter._packed_pair = cached
    return cached


def make_overlap(name: str, clock: Clock, target: Transformer, drafter) -> Serial:
    if name == "none":
        return Serial(clock)
    if name == "stream":
        return Streamed(clock, target.device)
    if name == "packed":
        return Packed(clock, target, drafter)
    raise ValueError(f"overlap={name!r}: expected one of {OVERLAPS}")


__all__ = ["Verification", "Serial", "Streamed", "Packed", "SideStream", "make_overlap", "packed_pair"]
