"""The DFlash baseline's rounds: a synchronous loop whose drafter reads the target's hidden states.

Every target pass (prefill, verification) also returns the hidden states of the drafter's
``target_layer_ids``; those of the newly committed tokens (all but the anchor, whose hidden state the
next verification computes) become the drafter's context. It cannot draft before verification ends:
a D3D round's steps 1, 2 and 4 (``d3d.decode.speculative``), with its own drafter.
"""

from __future__ import annotations

from typing import Callable

import torch

from .config import SpecConfig
from .generation import Decoder, GenerationStats, StreamFn
from .sequence import Sequence
from .speculative import RoundInfo, Verifier
from ..model.transformer import Transformer


class DFlashDecoder(Decoder):
    """DFlash over ``rows`` cache rows that sequences join (``admit``) and leave between rounds.
    ``spec.exact``: verification attends as AR steps do."""

    def __init__(self, target: Transformer, drafter, spec: SpecConfig, rows: int, max_len: int,
                 stream: StreamFn | None = None, on_round: Callable[[RoundInfo], None] | None = None):
        self.B = B = spec.block_size
        super().__init__(target, GenerationStats("dflash", rows, block_size=B, accept_hist=[0] * B), stream)
        self.drafter, self.spec, self.on_round, self.rnd = drafter, spec, on_round, 0
        self.ccache = drafter.new_cache(rows, max_len + B + 1)
        self.verifier = Verifier(target, target.new_cache(rows, max_len + B + 1))

    @torch.inference_mode()
    def admit(self, seqs: list[Sequence]) -> None:
        """Start each of ``seqs`` in a free row: one prefill pass, whose hidden states are the drafter's context."""
        self.place(seqs)
        for seq in seqs:
            seq.spec = self.spec
            self.ccache.crop(seq.row, 0)
        first, hidden = self.prefill(self.verifier.tcache, seqs, self.drafter.hidden_layers)
        self.drafter.append_context(self.ccache, [s.row for s in seqs], hidden, [s.num_prompt for s in seqs])
        for seq, t in zip(seqs, first):
            self.commit(seq, [t])

    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """One round for every running sequence; returns them."""
        seqs, stats, clock, B, dev = self.running(), self.stats, self.clock, self.B, self.target.device
        if not seqs:
            return seqs
        rows = [s.row for s in seqs]
        drafts, (t0, t1) = clock.timed(lambda: self.drafter.draft(self.ccache, rows, [s.tokens[-1] for s in seqs], B - 1))
        stats.drafter_forwards += 1
        stats.draft_seconds += t1 - t0
        drafts = drafts.tolist()
        v = self.verifier.verification(seqs, drafts, self.spec.exact)
        (logits, hidden), v_span = clock.timed(lambda: self.target(v.ids, v.layout, v.cache,
                                                                   hidden_layers=self.drafter.hidden_layers))
        outcomes = self.verifier.judge(logits, seqs, drafts, self.rnd)
        accepted = [len(o.accepted) for o in outcomes]
        stats.count_verification(v_span)
        # the context grows by the anchor + accepted drafts of each sequence
        keep = torch.cat([torch.arange(j * B, j * B + a + 1, device=dev) for j, a in enumerate(accepted)])
        self.drafter.append_context(self.ccache, rows, [h.index_select(0, keep) for h in hidden],
                                    [a + 1 for a in accepted])
        for j, seq in enumerate(seqs):
            seq.tally.verified_drafts += B - 1
            self.verifier.keep(seq, outcomes[j], B - 1)
            new = outcomes[j].accepted + [outcomes[j].bonus]
            self.commit(seq, new)
            if self.on_round:
                self.on_round(RoundInfo(round=self.rnd, seq=seq.id, draft=drafts[j], accepted=accepted[j],
                                        bonus=outcomes[j].bonus, committed=new, successor_used=False, fallback=False,
                                        sync_draft_seconds=t1 - t0, verify_span=v_span, draft_span=None,
                                        confidence=0.0))
        self.rnd += 1
        return seqs


__all__ = ["DFlashDecoder"]
