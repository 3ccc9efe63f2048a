"""The DFlash baseline's rounds: a synchronous loop whose drafter reads the target's hidden states.

Every target pass (prefill, verification) also returns the hidden states of the drafter's
``target_layer_ids``; those of the newly committed tokens (all but the anchor, whose hidden state the
next verification computes) become the drafter's context. It cannot draft before verification ends:
a D3D round's steps 1, 2, 4 and 5 (``d3d.decode.speculative``), with its own drafter.
"""

from __future__ import annotations

from typing import Callable

import torch

from .config import SpecConfig
from .generation import Decoder, GenerationStats, StreamFn
from .sequence import Sequence
from .speculative import Outcome, RoundInfo, Verifier
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
            self.emit(seq, [t])

    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """One round for every running sequence (a D3D round's steps 1, 2, 4 and 5); returns them."""
        seqs = self.schedule()
        if not seqs:
            return seqs
        drafts, draft_seconds = self.draft(seqs)
        logits, hidden, v_span = self.verify(seqs, drafts)
        outcomes = self.accept(seqs, drafts, logits)
        self.commit(seqs, drafts, outcomes, hidden, draft_seconds, v_span)
        self.rnd += 1
        return seqs

    def draft(self, seqs: list[Sequence]) -> tuple[list[list[int]], float]:
        """B-1 drafts for each sequence from its context (the target's hidden states) and its anchor, and
        the seconds the pass took."""
        drafts, (t0, t1) = self.clock.timed(lambda: self.drafter.draft(self.ccache, [s.row for s in seqs],
                                                                       [s.tokens[-1] for s in seqs], self.B - 1))
        self.stats.drafter_forwards += 1
        self.stats.draft_seconds += t1 - t0
        return drafts.tolist(), t1 - t0

    def verify(self, seqs: list[Sequence], drafts: list[list[int]]):
        """The target's verification pass, which also gives the hidden states the drafter reads next:
        (logits, hidden states, its time span)."""
        v = self.verifier.verification(seqs, drafts, self.spec.exact)
        for seq in seqs:
            seq.tally.verified_drafts += self.B - 1
        (logits, hidden), v_span = self.clock.timed(lambda: self.target(v.ids, v.layout, v.cache,
                                                                        hidden_layers=self.drafter.hidden_layers))
        self.stats.count_verification(v_span)
        return logits, hidden, v_span

    def accept(self, seqs: list[Sequence], drafts: list[list[int]], logits: torch.Tensor) -> list[Outcome]:
        """Each sequence's outcome: its accepted drafts and the bonus."""
        return self.verifier.judge(logits, seqs, drafts, self.rnd)

    def commit(self, seqs: list[Sequence], drafts: list[list[int]], outcomes: list[Outcome], hidden,
               draft_seconds: float, v_span: tuple[float, float]) -> None:
        """The drafter's context grows by the anchor and the accepted drafts of each sequence (their hidden
        states); each sequence commits its accepted drafts and bonus."""
        B, dev, accepted = self.B, self.target.device, [len(o.accepted) for o in outcomes]
        keep = torch.cat([torch.arange(j * B, j * B + a + 1, device=dev) for j, a in enumerate(accepted)])
        self.drafter.append_context(self.ccache, [s.row for s in seqs], [h.index_select(0, keep) for h in hidden],
                                    [a + 1 for a in accepted])
        for j, (seq, o) in enumerate(zip(seqs, outcomes)):
            self.verifier.keep(seq, o, B - 1)
            new = o.accepted + [o.bonus]
            self.emit(seq, new)
            if self.on_round:
                self.on_round(RoundInfo(round=self.rnd, seq=seq.id, draft=drafts[j], accepted=accepted[j],
                                        bonus=o.bonus, committed=new, fallback=False,
                                        sync_draft_seconds=draft_seconds, verify_span=v_span, draft_span=None,
                                        confidence=0.0))


__all__ = ["DFlashDecoder"]
