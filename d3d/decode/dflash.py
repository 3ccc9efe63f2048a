"""The DFlash baseline's rounds: a synchronous loop whose drafter reads the target's hidden states.

Every target pass (prefill, verification) also returns the hidden states of the drafter's
``target_layer_ids``; those of the newly committed tokens (all but the anchor, whose hidden state the
next verification computes) become the drafter's context. It cannot draft before verification ends:
a D3D round's steps 1, 2 and 4 (``d3d.decode.speculative``), with its own drafter.
"""

from __future__ import annotations

from typing import Callable

import torch

from .config import Sampling, SpecConfig
from .generation import Decoder, GenerationStats, StreamFn
from .speculative import RoundInfo, Sequences
from ..model.transformer import Transformer


class DFlashDecoder(Decoder):
    """DFlash over ``rows`` cache rows that sequences join (``admit``) and leave between rounds.
    ``spec.exact``: verification attends as AR steps do."""

    def __init__(self, target: Transformer, drafter, spec: SpecConfig, sampling: Sampling, stop_ids: set[int],
                 rows: int, max_len: int, stream: StreamFn | None = None,
                 on_round: Callable[[RoundInfo], None] | None = None):
        self.B = B = spec.block_size
        super().__init__(target, GenerationStats("dflash", rows, [0] * rows, [0] * rows, block_size=B,
                                                 accept_hist=[0] * B), sampling, stop_ids, stream)
        self.drafter, self.exact, self.on_round, self.rnd = drafter, spec.exact, on_round, 0
        self.ccache = drafter.new_cache(rows, max_len + B + 1)
        self.seqs = Sequences(target, [[] for _ in range(rows)], self.out, self.stats,
                              target.new_cache(rows, max_len + B + 1), sampling.temperature, sampling.seed)

    @torch.inference_mode()
    def admit(self, rows: list[int], prompts: list[list[int]], max_new: list[int]) -> None:
        """Start a sequence in each of ``rows``: one prefill pass, whose hidden states are the drafter's context."""
        for i, p in zip(rows, prompts):
            self.seqs.committed[i] = list(p)
            self.ccache.crop(i, 0)
        first, hidden = self.prefill(self.seqs.tcache, rows, prompts, max_new, self.drafter.hidden_layers)
        self.drafter.append_context(self.ccache, rows, hidden, [len(p) for p in prompts])
        self.seqs.begin(first, rows)

    @torch.inference_mode()
    def step(self) -> list[int]:
        """One round for every active row; returns those rows."""
        rows, seqs, stats, clock, B, dev = self.out.active(), self.seqs, self.stats, self.clock, self.B, self.target.device
        if not rows:
            return rows
        drafts, (t0, t1) = clock.timed(lambda: self.drafter.draft(self.ccache, rows,
                                                                  [seqs.committed[i][-1] for i in rows], B - 1))
        stats.drafter_forwards += 1
        stats.draft_seconds += t1 - t0
        drafts = drafts.tolist()
        v = seqs.verification(rows, drafts, self.exact)
        (logits, hidden), v_span = clock.timed(lambda: self.target(v.ids, v.layout, v.cache,
                                                                   hidden_layers=self.drafter.hidden_layers))
        outcomes = seqs.judge(logits, drafts, self.rnd)
        accepted = [len(o.accepted) for o in outcomes]
        stats.count_verification(v_span)
        stats.verified_drafts += len(rows) * (B - 1)
        # the context grows by the anchor + accepted drafts of each row
        keep = torch.cat([torch.arange(j * B, j * B + a + 1, device=dev) for j, a in enumerate(accepted)])
        self.drafter.append_context(self.ccache, rows, [h.index_select(0, keep) for h in hidden],
                                    [a + 1 for a in accepted])
        for j, i in enumerate(rows):
            new = seqs.commit(i, outcomes[j], B - 1)
            if self.on_round:
                self.on_round(RoundInfo(round=self.rnd, seq=i, draft=drafts[j], accepted=accepted[j],
                                        bonus=outcomes[j].bonus, committed=new, successor_used=False, fallback=False,
                                        sync_draft_seconds=t1 - t0, verify_span=v_span, draft_span=None,
                                        confidence=0.0))
        self.rnd += 1
        return rows


__all__ = ["DFlashDecoder"]
