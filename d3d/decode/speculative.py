"""Speculative decoding: sync and async D3D, and the DFlash baseline, on one verification round.

A D3D round (``SpeculativeDecoder.step``), for every running sequence (``schedule``):

    1 draft       the round's B-1 drafts from the first source that has one (``d3d.decode.sources``): a
                  hypothesis of the last round that matched its outcome, a copy from the context
                  (``lookup``), the target's earlier answers (``datastore``), a smaller model's greedy chain
                  (``draft_model``), else one drafter pass over
                  [uncached committed tokens ; anchor, mask x draft_size] for all sequences still without a
                  draft; then the plan: n = B-1, or with ``verify_min_prob`` only the drafts the drafter
                  believes in (``Draft.likely_length``), and the leaves worth their rows
    2 verify      one target pass over [anchor, d_1..d_n]. With ``leaves`` L the pass also verifies the
                  L likeliest bonuses the drafter proposed (``d3d.decode.hypotheses.bonus_leaves``), each
                  a one-token branch off the drafts
    3 hypotheses  async only, beside 2 (``d3d.decode.overlap``): one drafter pass that appends the drafts
                  to the drafter's cache and drafts a successor block for each of the K likeliest
                  outcomes (``d3d.decode.hypotheses``), every block branching off the drafts at its own a
    4 accept      (a, bonus) per sequence (``d3d.kernels.accept``); when the bonus after a accepted drafts
                  is a verified leaf, the leaf is accepted too and its logits give the bonus after it
                  (a + 2 tokens committed)
    5 commit      d_1..d_a + bonus; the caches roll back to the committed tokens; the hypothesis
                  matching (a, bonus), if any, is the next round's draft: no drafting on its
                  critical path

``sync`` is steps 1, 2, 4, 5. DFlash (``d3d.decode.dflash``) drafts from the target's hidden states, so
it cannot draft before verification ends: steps 1, 2, 4, 5 with its own drafter.

Each request is a ``Sequence`` (``d3d.decode.sequence``): its committed tokens, the draft it holds for
its next round, its cache row, its counts. Invariants, per sequence: ``Sequence.tokens`` = prompt +
output; the last committed token is the *anchor*; the target cache holds every committed token but the
anchor; the drafter cache holds a prefix of the committed tokens from ``Sequence.draft_from`` on (only
clean tokens are ever kept). A drafter pass catches up on at most ``DRAFT_WINDOW`` tokens: where more lag
(a long prompt, a long run of plain steps), its cache starts afresh that far before the anchor.

Leaves cost one target row each and no drafting. The likeliest bonuses are what async pre-drafts
successors for; verifying them instead pays where rows are cheap but compute is saturated (a CPU:
async's hypotheses passes cost real time there). How often the true (a, bonus) is among the
drafter's likeliest outcomes (async with ``successor_threshold=0 hypotheses=12 fanout=4``, the
shipped Qwen drafter, validation requests): docs/results/leaves/probe_hypotheses.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from ..draft.drafter import Block
from .config import SpecConfig
from .generation import Clock, Decoder, GenerationStats, StreamFn
from .hypotheses import Hypothesis, bonus_leaves, matching, outcome_hypotheses
from ..kernels.accept import accept
from ..kernels.glue_cpu import argmax
from .sequence import Sequence, all_greedy
from .sources import Draft, Origin, draft_sources
from .draft_model import ModelChain, chain_vocabulary, check_draft_model
from ..model.cache import branches
from ..model.transformer import Transformer
from .overlap import Verification, make_overlap
from .row_price import RowPrice
from .sampling import check_lossless_sampling

if TYPE_CHECKING:
    from ..draft.drafter import Drafter, DraftJob, Drafts


# The most committed tokens a drafter pass catches up on (module docstring): the drafter was trained on rows of
# the last 256 tokens of request + answer (models/d3d-drafter-qwen2.5-coder-0.5b/README.md), and a pass over a
# 2,000-token prompt cost ~0.6 s, 40 of the 0.5B's steps (docs/results/draft-window/)
DRAFT_WINDOW = 256
_LEAF_SEED = 1 << 31  # the leaves' bonus samples use streams apart from the round's acceptance
_GROUP_SEED = 0x9E3779B9  # ... and each draft length of a batch its own (an odd step: no round's key meets another's)


@dataclass
class RoundInfo:
    """What happened to one sequence in one verification round (for --explain and tests)."""

    round: int
    seq: int  # the Sequence's id (generate: the prompt's index)
    draft: list[int]
    accepted: int
    bonus: int
    committed: list[int]
    fallback: bool  # async: hypotheses were drafted this round and none matched the outcome
    sync_draft_seconds: float
    verify_span: tuple[float, float]  # (start, end) seconds since generation start
    draft_span: tuple[float, float] | None  # async: the hypotheses pass (None: none drafted)
    confidence: float  # drafter's product of confidences over this draft
    hypotheses: list[Hypothesis] = field(default_factory=list)  # async: the likeliest outcomes (drafted if draft_span)
    hit: int | None = None  # async: index of the hypothesis that matched the outcome
    leaf: int | None = None  # leaves: index of the verified leaf accepted as the last of ``accepted`` drafts
    min_prob: float = 0.0  # the verify_min_prob this round's drafts were cut at (measured with "auto")
    origin: Origin = Origin.DRAFTER  # where this round's draft came from

    @property
    def successor_used(self) -> bool:  # async: this round's draft came from the previous round's hypotheses
        return self.origin is Origin.HYPOTHESIS

    @property
    def copied(self) -> bool:  # copied from the context (d3d.decode.lookup) or the datastore
        return self.origin in (Origin.LOOKUP, Origin.DATASTORE)

    @property
    def stored(self) -> bool:  # looked up in the datastore (d3d.decode.datastore)
        return self.origin is Origin.DATASTORE


@dataclass
class Outcome:
    """One row's verification result: the tokens it accepted (d_1..d_a, then the leaf if one was
    hit) and the target's bonus after them."""

    accepted: list[int]
    bonus: int
    leaf: int | None = None  # index of the hit leaf among the row's leaves

    @property
    def main_accepted(self) -> int:
        """Drafts accepted along the verified run (the hit leaf not counted)."""
        return len(self.accepted) - (self.leaf is not None)


def host_drafts(d: "Drafts") -> list[Draft]:
    """Blocks ``[lead, d_1..d_n]`` of a drafting call as host ``Draft``s (one read-back)."""
    tokens, conf = d.tokens.tolist(), d.confidence.tolist()
    tops = (d.top_ids.tolist(), d.top_probs.tolist()) if d.top_ids is not None else None
    return [Draft(t[1:], c[1:], tops[0][m][1:] if tops else [], tops[1][m][1:] if tops else [], t[0])
            for m, (t, c) in enumerate(zip(tokens, conf))]


class Verifier:
    """The target's side of every speculative round: its cache, the verification pass over each
    sequence's anchor, drafts and leaves, acceptance, and what the cache keeps after it."""

    def __init__(self, target: Transformer, tcache):
        self.target, self.tcache = target, tcache

    def verification(self, seqs: list[Sequence], drafts: list[list[int]], exact: bool = False,
                     leaves: list[list[Hypothesis]] | None = None) -> Verification:
        """The target pass over ``[anchor, drafts[j]]`` of every ``seqs[j]`` (each verifies as many drafts
        as it has), then its ``leaves[j]``: leaf (a, b) is token b at the position of d_(a+1), seeing the
        anchor and d_1..d_a only (``reach``), written to the cache slots after the drafts."""
        leaves = leaves or [[] for _ in seqs]
        ids = [t for j, s in enumerate(seqs) for t in [s.tokens[-1], *drafts[j], *(h.bonus for h in leaves[j])]]
        ids = torch.tensor(ids, device=self.target.device)
        rows, lens = [s.row for s in seqs], [len(d) + 1 + len(row) for d, row in zip(drafts, leaves)]
        greedy = all_greedy(seqs)
        if not any(leaves):
            layout = self.tcache.layout(lens, rows, row_invariant=exact)
            return Verification(self.target, ids, layout, self.tcache, greedy)
        g, r, p = zip(*(branches(self.tcache.lengths[i], len(d) + 1, [(h.accepted + 1, 1) for h in row])
                        for i, d, row in zip(rows, drafts, leaves)))
        layout = self.tcache.layout(lens, rows, groups=list(g), reach=list(r), positions=list(p))
        return Verification(self.target, ids, layout, self.tcache, greedy)

    def judge(self, logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]], rnd: int,
              leaves: list[list[Hypothesis]] | None = None) -> list[Outcome]:
        """Accept each sequence's drafts against the target's logits of a ``verification`` pass (one
        ``accept`` launch per draft length and temperature in the batch, its streams keyed by the seed of
        its first sequence); one whose bonus is one of its leaves accepts the leaf and takes the bonus
        after it from the leaf's logits (at T > 0 a fresh sample: the leaf is the target's own sample at
        its position, so the output keeps the target's distribution)."""
        dev = logits.device
        leaves = leaves or [[] for _ in drafts]
        starts = [0]
        for d, row in zip(drafts, leaves):
            starts.append(starts[-1] + len(d) + 1 + len(row))
        accepted, bonus = [0] * len(drafts), [0] * len(drafts)
        kinds = [(len(d), s.sampling.temperature) for d, s in zip(drafts, seqs)]
        for g, (n, t) in enumerate(sorted(set(kinds))):
            js = [j for j, k in enumerate(kinds) if k == (n, t)]
            seed = seqs[js[0]].sampling.seed  # each sequence of a launch draws its own stream (its place j in it)
            at = torch.tensor([starts[j] + p for j in js for p in range(n + 1)], device=dev)
            main = logits if len(at) == len(logits) else logits.index_select(0, at)  # all of it: one kind, no leaves
            if n == 0 and t == 0:  # plain greedy steps: the target's argmax, as ar takes it (~0.5 ms less a round)
                for j, b in zip(js, argmax(main.float()).tolist()):
                    bonus[j] = b
                continue
            result = accept(torch.tensor([drafts[j] for j in js], dtype=torch.long, device=dev).view(len(js), n),
                            main.view(len(js), n + 1, -1), temperature=t, seed=seed * 1_000_003 + rnd + g * _GROUP_SEED)
            for j, a, b in zip(js, result.accept_len.tolist(), result.bonus.tolist()):
                accepted[j], bonus[j] = a, b
        out = [Outcome(d[:a], b) for d, a, b in zip(drafts, accepted, bonus)]
        hits = [(j, m) for j in range(len(drafts)) for m, h in enumerate(leaves[j])
                if (h.accepted, h.bonus) == (accepted[j], bonus[j])]  # bonuses differ: at most one per sequence
        for t in sorted({kinds[j][1] for j, _ in hits}):
            mine = [(j, m) for j, m in hits if kinds[j][1] == t]
            seed = seqs[mine[0][0]].sampling.seed
            at = torch.tensor([starts[j] + len(drafts[j]) + 1 + m for j, m in mine], device=dev)
            after = accept(torch.zeros((len(mine), 0), dtype=torch.long, device=dev), logits.index_select(0, at)[:, None],
                           temperature=t, seed=seed * 1_000_003 + rnd + _LEAF_SEED).bonus.tolist()
            for (j, m), b in zip(mine, after):
                out[j] = Outcome(out[j].accepted + [out[j].bonus], b, m)
        return out

    def keep(self, seq: Sequence, o: Outcome, n: int) -> None:
        """Before ``seq`` commits outcome ``o`` of a verification of ``n`` drafts: the target cache keeps
        the anchor and the accepted tokens (a hit leaf's K/V moved next to them); the round is counted."""
        seq.tally.rounds += 1
        seq.tally.accept_hist[len(o.accepted)] += 1
        self.tcache.crop(seq.row, len(seq.tokens) + o.main_accepted)  # anchor + accepted drafts join the cached prefix
        if o.leaf is not None:
            seq.tally.leaf_hits += 1
            self.tcache.append_slot(seq.row, len(seq.tokens) + n + o.leaf)  # slots: anchor at len-1, drafts, leaves


def verify_widths(drafts: list[Draft], min_prob: float) -> list[int]:
    """The plan's n per sequence: the whole draft, or with ``min_prob`` > 0 the longest run of it the drafter
    believes in (``Draft.likely_length``); sequences of a batch verify as many drafts as they each have."""
    return [min(len(d.tokens), d.likely_length(min_prob)) if min_prob > 0 else len(d.tokens) for d in drafts]


class Drafting:
    """The drafter's side of D3D: its cache, each sequence's draft for its next round, and the
    hypotheses pass (steps 1, 3 and the drafter's part of 5 in the module docstring)."""

    def __init__(self, drafter: "Drafter", dcache, stats: GenerationStats, block_size: int, use_hyps: bool, K: int,
                 fanout: int, leaves: int = 0, draft_size: int | None = None, sources=()):
        self.drafter, self.dcache, self.stats, self.B = drafter, dcache, stats, block_size
        # the synchronous block: the anchor and draft_size masks (at most B - 1, SpecConfig.resolve; copies reach B - 1)
        self.size = block_size if draft_size is None else draft_size + 1
        self.sources = list(sources)  # asked in order before the drafter (d3d.decode.sources)
        self.use_hyps, self.K, self.fanout, self.L = use_hyps, K, fanout, leaves
        # top tokens kept per position: the bonus candidates of hypotheses and leaves
        self.top = max(fanout if use_hyps else 0, leaves) + 1 if use_hyps or leaves else 0

    def prepare(self, seqs: list[Sequence], clock: Clock, drafter: bool = True) -> tuple[list[Sequence], float, bool]:
        """Step 1: a sequence keeps its ready draft (a hypothesis of the last round hit); else the first
        of ``sources`` that proposes one gives it; else the drafter drafts it, in one pass for all such
        sequences (not ``drafter``: those take a plain step, an empty draft). Each round is counted by
        where its draft came from. Returns the sequences drafted for now, the seconds of that pass
        (on the critical path), and whether any took a plain step instead."""
        need = [s for s in seqs if s.draft is None and not self.propose(s)]
        seconds, stepped = 0.0, bool(need) and not drafter
        if stepped:
            for s in need:
                s.draft, s.origin = Draft([], [], [], []), Origin.STEP
            need = []
        if need:
            fresh, (t0, t1) = clock.timed(lambda: self.draft(need))
            for s, d in zip(need, fresh):
                s.draft, s.origin = d, Origin.DRAFTER
            seconds = t1 - t0
            self.stats.draft_seconds += seconds
        for s in seqs:
            s.tally.drafts[s.origin] += 1
        return need, seconds, stepped

    def propose(self, seq: Sequence) -> bool:
        """The first proposal of ``sources`` for ``seq`` becomes its draft; False if none has one."""
        for source in self.sources:
            draft = source.propose(seq, self.B - 1)
            if draft is not None and draft.tokens:
                seq.draft, seq.origin = draft, source.origin
                return True
        return False

    def window(self, seqs: list[Sequence]) -> list[int]:
        """Where each sequence's uncached committed tokens start (``Sequence.draft_from`` + its cached ones);
        a sequence whose drafter cache lags more than ``DRAFT_WINDOW`` tokens behind the anchor starts it afresh
        there."""
        lengths, starts = self.dcache.lengths, []
        for s in seqs:
            if len(s.tokens) - 1 - (s.draft_from + lengths[s.row]) > DRAFT_WINDOW:
                self.dcache.crop(s.row, 0)
                s.draft_from = len(s.tokens) - 1 - DRAFT_WINDOW
            starts.append(s.draft_from + lengths[s.row])
        return starts

    def draft(self, seqs: list[Sequence]) -> list[Draft]:
        """Step 1 for sequences without a ready draft: one drafter pass over each one's uncached committed
        tokens (at most ``DRAFT_WINDOW``) and the block [anchor, mask x draft_size]."""
        starts = self.window(seqs)
        d = self.drafter.draft_blocks(self.dcache, [s.row for s in seqs], [s.tokens[a:-1] for s, a in zip(seqs, starts)],
                                      [[Block(len(s.tokens) - 1 - a, s.tokens[-1])] for s, a in zip(seqs, starts)],
                                      self.size, top=self.top)
        self.stats.drafter_forwards += self.drafter.dcfg.denoise_steps
        return host_drafts(d)

    def likeliest_outcomes(self, draft: Draft) -> list[Hypothesis]:
        """Step 3: the outcomes (a, bonus) worth a successor block (none in sync)."""
        if not self.use_hyps:
            return []
        if self.drafter.dcfg.denoise_steps > 1:  # its later steps re-run whole blocks: all-accepted only
            return [Hypothesis(len(draft.tokens), None, draft.certainty)]
        return outcome_hypotheses(draft.tokens, draft.confidence, draft.top_ids, draft.top_probs, self.K, self.fanout)

    def leaves(self, draft: Draft, n: int, min_score: float = 0.0) -> list[Hypothesis]:
        """The plan's leaves: the L likeliest bonuses after d_1..d_n of ``draft`` that it proposed, those
        whose estimated hit probability is at least ``min_score`` (the row price under "auto")."""
        if not self.L:
            return []
        leaves = bonus_leaves(draft.tokens, draft.confidence, draft.top_ids, draft.top_probs, n, self.L)
        return [h for h in leaves if h.score >= min_score]

    def start_hypotheses(self, seqs: list[Sequence], drafts: list[Draft], hyps: list[list[Hypothesis]],
                         threshold: float):
        """Step 3's pass for the sequences whose hypotheses are likely enough to hit (``threshold``):
        the clean run (uncached committed tokens + the drafts) and one block per hypothesis, branching
        off the drafts at its accept length. Returns (the pass's job or None, the indices j of the
        sequences in it)."""
        js = [j for j in range(len(seqs)) if hyps[j] and sum(h.score for h in hyps[j]) >= threshold]
        if not js:
            return None, set()
        starts = self.window([seqs[j] for j in js])
        clean = [seqs[j].tokens[a:] + drafts[j].tokens for j, a in zip(js, starts)]
        base = [len(seqs[j].tokens) - a for j, a in zip(js, starts)]  # clean tokens before d_1
        blocks = [[Block(b + h.accepted, h.bonus) for h in hyps[j]] for j, b in zip(js, base)]
        return self.drafter.start(self.dcache, [seqs[j].row for j in js], clean, blocks, self.B), set(js)

    def finish(self, job, logits) -> list[Draft]:
        """The successor blocks of a hypotheses pass, in the order of its sequences and hypotheses."""
        return host_drafts(self.drafter.finish(self.dcache, job, logits, top=self.top)) if job else []

    def settle(self, seq: Sequence, o: Outcome, hyps: list[Hypothesis], mine: list[Draft]) -> int | None:
        """Step 5 for ``seq`` (before it commits): keep the anchor and the accepted drafts in the drafter
        cache, and the successor whose hypothesis matches the outcome as its next draft (none after a
        leaf hit: the successors start one token early). Returns the index of that hypothesis, or None."""
        hit, accepted = None, o.main_accepted
        if mine:
            self.dcache.crop(seq.row, len(seq.tokens) - seq.draft_from + accepted)
            hit = matching(hyps, [s.guess for s in mine], accepted, o.bonus) if o.leaf is None else None
            seq.tally.successor_hits += hit is not None
            seq.tally.hits_by_accept[accepted] += hit is not None
            seq.tally.fallbacks += hit is None
        seq.draft, seq.origin = (mine[hit], Origin.HYPOTHESIS) if hit is not None else (None, None)
        return hit


class SpeculativeDecoder(Decoder):
    """D3D's rounds (sync or async, every knob of ``spec`` set: ``SpecConfig.resolve``) over ``rows`` cache
    rows that sequences join (``admit``) and leave (done, or ``drop``) between rounds; ``step`` is one
    round, the module docstring's steps. ``generate`` admits every prompt at once; the
    server admits requests as they come. A drafter with ``denoise_steps > 1`` drafts only the
    all-accepted hypothesis (its later steps re-run whole blocks)."""

    def __init__(self, target: Transformer, drafter: "Drafter", spec: SpecConfig, rows: int, max_len: int,
                 stream: StreamFn | None = None, on_round: Callable[[RoundInfo], None] | None = None):
        B, use_hyps = spec.block_size, spec.mode == "async"
        K = spec.hypotheses if drafter.dcfg.denoise_steps == 1 else 1
        super().__init__(target, GenerationStats(spec.mode, rows, block_size=B, accept_hist=[0] * B,
                                                 hits_by_accept=[0] * B), stream)
        self.spec, self.on_round, self.rnd = spec, on_round, 0
        self.price = RowPrice()  # the one cost model: what a verified row, a drafter pass, a hypotheses pass cost
        self.ov = make_overlap(spec.overlap if use_hyps else "none", self.clock, target, drafter)
        # caches: the drafter's has room for the K hypothesis blocks after a clean run
        tcache, dcache = self.ov.new_caches(target, drafter, rows, max_len + B + 1 + spec.leaves, max_len + (K + 2) * B + 2)
        self.verifier = Verifier(target, tcache)
        self.chain = None  # a draft model's chains (d3d.decode.draft_model), asked after the other sources
        if spec.draft_model is not None:
            check_draft_model(spec.draft_model, target)
            vocab = chain_vocabulary(target.cfg.vocab_size, getattr(drafter, "vocab_map", None),
                                     min(target.cfg.eos_token_ids, default=None))
            self.chain = ModelChain(spec.draft_model, rows, max_len + B + 1, self.price, vocab,
                                    spec.draft_size or B - 1, top=spec.leaves + 1)
        self.side = Drafting(drafter, dcache, self.stats, B, use_hyps, K, spec.fanout, spec.leaves, spec.draft_size,
                             draft_sources(spec.lookup, spec.datastore, self.chain))

    @torch.inference_mode()
    def admit(self, seqs: list[Sequence]) -> None:
        """Start each of ``seqs`` in a free row: one prefill pass for all, their first token. Each samples
        as its ``Sampling`` says (temperature and seed; no top_k/top_p at T > 0)."""
        for seq in seqs:
            check_lossless_sampling(seq.sampling)
        self.place(seqs)
        for seq in seqs:
            seq.spec, seq.draft, seq.draft_from = self.spec, None, 0
            self.side.dcache.crop(seq.row, 0)
        for seq, t in zip(seqs, self.prefill(self.verifier.tcache, seqs)[0]):
            self.emit(seq, [t])
        if self.chain is not None:
            self.chain.admit(seqs)

    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """One round for every running sequence, the module docstring's steps; returns them (none:
        nothing to decode)."""
        seqs = self.schedule()
        if not seqs:
            return seqs
        r = Round(self.rnd, seqs, self.clock.now())
        self.draft(r)  # 1 a matched hypothesis of the last round, a copy, a retrieved chain, or one drafter pass
        self.plan(r)  # the drafts and leaves worth their rows
        self.verify(r)  # 2 verify || 3 draft ahead for the likeliest outcomes (async)
        self.accept(r)  # 4 each sequence's accepted drafts and bonus
        self.commit(r)  # 5 and the successor that matches the outcome kept as the next draft
        self.observe(r)  # what the round cost, for the next one's choices
        self.rnd += 1
        return seqs

    def draft(self, r: Round) -> None:
        """Step 1: every sequence's draft (``Drafting.prepare``); a priced cut may skip the drafter."""
        asks = self.spec.verify_min_prob.drafts(self.price, len(r.seqs))
        if self.chain is not None:
            self.chain.batch = len(r.seqs)
        r.drafted, r.draft_seconds, r.stepped = self.side.prepare(r.seqs, self.clock, drafter=asks)

    def plan(self, r: Round) -> None:
        """The drafts worth their rows (each sequence's longest run whose joint estimate beats the round's
        cut, ``Draft.likely_length``) and the leaves: a fixed cut cuts drafts only; a priced one
        (``verify_min_prob=auto``) is the measured price of a row (``d3d.decode.row_price``), for
        drafts and leaves alike."""
        cut = self.spec.verify_min_prob
        self.price.context = max(len(s.tokens) for s in r.seqs)
        r.min_prob = cut(self.price)
        widths = verify_widths([s.draft for s in r.seqs], r.min_prob)
        r.leaves = [self.side.leaves(s.draft, n, cut.leaf_floor(r.min_prob)) for s, n in zip(r.seqs, widths)]
        for s, n, leaves in zip(r.seqs, widths, r.leaves):
            s.tally.verified_drafts += n
            s.tally.verified_leaves += len(leaves)
        r.drafts = [s.draft.truncated(n) for s, n in zip(r.seqs, widths)]
        r.tokens = [d.tokens for d in r.drafts]

    def verify(self, r: Round) -> None:
        """Steps 2 and 3: the target's verification pass and, in async, the drafter's hypotheses pass for
        the sequences whose likeliest outcomes are worth one, run as ``overlap`` says."""
        r.hyps = [self.side.likeliest_outcomes(d) for d in r.drafts]
        threshold = self.spec.successor_threshold(self.price)
        r.job, r.in_pass = self.side.start_hypotheses(r.seqs, r.drafts, r.hyps, threshold)
        v = self.verifier.verification(r.seqs, r.tokens, self.spec.exact, r.leaves)
        r.t_logits, r.d_logits, r.v_span, r.d_span = self.ov.run(v, r.job)

    def accept(self, r: Round) -> None:
        """Step 4: each sequence's outcome (accepted drafts, bonus) and the hypotheses' successor blocks."""
        r.outcomes = self.verifier.judge(r.t_logits, r.seqs, r.tokens, r.number, r.leaves)
        r.successors = self.side.finish(r.job, r.d_logits)
        self.stats.count_verification(r.v_span, r.d_span if r.job is not None else None, len(r.in_pass),
                                      len(r.successors))

    def commit(self, r: Round) -> None:
        """Step 5, sequence by sequence: the drafter's cache and next draft (``Drafting.settle``), the
        target's cache (``Verifier.keep``), the accepted drafts and the bonus, and ``on_round``."""
        successors = iter(r.successors)
        for j, (seq, o) in enumerate(zip(r.seqs, r.outcomes)):
            mine = [next(successors) for _ in r.hyps[j]] if j in r.in_pass else []
            origin, hit = seq.origin, self.side.settle(seq, o, r.hyps[j], mine)
            self.verifier.keep(seq, o, len(r.tokens[j]))
            new = o.accepted + [o.bonus]
            self.emit(seq, new)
            r.gained += len(new)
            if self.on_round:
                self.on_round(round_info(r, j, origin, o, new, mine, hit))

    def observe(self, r: Round) -> None:
        """The row price learns what this round's rows, drafter passes and tokens cost (``RowPrice``)."""
        self.price.observe_drafter("draft", r.draft_seconds, len(r.drafted))
        if r.job is not None:
            self.price.observe_drafter("hypotheses", max(0.0, r.d_span[1] - max(r.d_span[0], r.v_span[1])),
                                       len(r.in_pass))
        self.price.observe(sum(len(t) + 1 for t in r.tokens) + sum(map(len, r.leaves)),
                           r.v_span[1] - r.v_span[0], r.gained, self.clock.now() - r.began,
                           drafted=True if r.drafted else False if r.stepped else None)

    def close(self) -> None:
        self.ov.close()


@dataclass
class Round:
    """One round of ``SpeculativeDecoder.step``, filled in phase by phase."""

    number: int
    seqs: list[Sequence]  # schedule: every running sequence, in row order
    began: float  # seconds on the decoder's clock
    drafted: list[Sequence] = field(default_factory=list)  # draft: those the drafter drafted for now
    draft_seconds: float = 0.0  # ... in a pass on the critical path
    stepped: bool = False  # ... or whether, the drafter skipped, some took a plain step
    drafts: list[Draft] = field(default_factory=list)  # plan: each sequence's drafts worth verifying
    tokens: list[list[int]] = field(default_factory=list)  # ... their tokens
    leaves: list[list[Hypothesis]] = field(default_factory=list)  # ... and leaves
    min_prob: float = 0.0  # ... the cut they were chosen at
    hyps: list[list[Hypothesis]] = field(default_factory=list)  # verify: the outcomes each drafts ahead for (async)
    in_pass: set[int] = field(default_factory=set)  # ... the sequences j in the hypotheses pass
    job: "DraftJob | None" = None  # ... that pass
    t_logits: torch.Tensor | None = None
    d_logits: torch.Tensor | None = None
    v_span: tuple[float, float] = (0.0, 0.0)
    d_span: tuple[float, float] | None = None
    outcomes: list[Outcome] = field(default_factory=list)  # accept
    successors: list[Draft] = field(default_factory=list)  # ... the hypotheses' successor blocks
    gained: int = 0  # commit: tokens committed (before stops and limits cut them)


def round_info(r: Round, j: int, origin: Origin, o: Outcome, new: list[int], mine: list[Draft],
               hit: int | None) -> RoundInfo:
    """What ``on_round`` (``--explain``) sees of sequence j in round ``r`` (its draft came from ``origin``)."""
    d = r.drafts[j]
    return RoundInfo(round=r.number, seq=r.seqs[j].id, draft=list(d.tokens), accepted=len(o.accepted), bonus=o.bonus,
                     committed=new, fallback=bool(mine) and hit is None,
                     sync_draft_seconds=r.draft_seconds if origin is Origin.DRAFTER else 0.0, verify_span=r.v_span,
                     draft_span=r.d_span if mine else None, confidence=d.certainty, hypotheses=r.hyps[j], hit=hit,
                     leaf=o.leaf, min_prob=r.min_prob, origin=origin)


__all__ = ["DRAFT_WINDOW", "SpeculativeDecoder", "RoundInfo", "Round", "Verifier", "Drafting", "Draft", "Outcome", "host_drafts",
           "verify_widths"]
