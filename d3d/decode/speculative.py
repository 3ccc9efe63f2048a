"""Speculative decoding: sync and async D3D, and the DFlash baseline, on one verification round.

A D3D round, for every active sequence:

    1 draft       the round's B-1 drafts from the first source that has one (``d3d.decode.sources``): a
                  hypothesis of the last round that matched its outcome, a copy from the context
                  (``lookup``), the target's earlier answers (``datastore``), else one drafter pass over
                  [uncached committed tokens ; anchor, mask x (B-1)] for all rows still without a draft
    2 verify      one target pass over [anchor, d_1..d_n]; ``accept`` gives (a, bonus). n = B-1, or
                  with ``verify_min_prob`` only the drafts the drafter believes in (``Draft.likely_length``).
                  With ``leaves`` L the pass also verifies the L likeliest bonuses the drafter proposed
                  (``d3d.decode.hypotheses.bonus_leaves``), each a one-token branch off the drafts: when the
                  bonus after a accepted drafts is such a leaf, the leaf is accepted too and its
                  logits give the bonus after it (a + 2 tokens committed)
    3 hypotheses  async only, beside 2 (``d3d.decode.overlap``): one drafter pass that appends the drafts
                  to the drafter's cache and drafts a successor block for each of the K likeliest
                  outcomes (``d3d.decode.hypotheses``), every block branching off the drafts at its own a
    4 commit      d_1..d_a + bonus; the caches roll back to the committed tokens; the hypothesis
                  matching (a, bonus), if any, is the next round's draft: no drafting on its
                  critical path

``sync`` is steps 1, 2, 4. DFlash (``d3d.decode.dflash``) drafts from the target's hidden states, so
it cannot draft before verification ends: steps 1, 2, 4 with its own drafter.

Invariants, per sequence: ``committed`` = prompt + output; the last committed token is the
*anchor*; the target cache holds every committed token but the anchor; the drafter cache holds a
prefix of the committed tokens (only clean tokens are ever kept).

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
from .config import Sampling, SpecConfig
from .generation import Clock, Decoder, GenerationStats, Output, StreamFn
from .hypotheses import Hypothesis, bonus_leaves, matching, outcome_hypotheses
from ..kernels.accept import accept
from .sources import Draft, draft_sources
from ..model.cache import branches
from ..model.transformer import Transformer
from .overlap import Verification, make_overlap
from .row_price import Fixed, PricedCut, RowPrice
from .sampling import check_lossless_sampling

if TYPE_CHECKING:
    from ..draft.drafter import Drafter, Drafts


_LEAF_SEED = 1 << 31  # the leaves' bonus samples use streams apart from the round's acceptance
_GROUP_SEED = 0x9E3779B9  # ... and each draft length of a batch its own (an odd step: no round's key meets another's)


@dataclass
class RoundInfo:
    """What happened to one sequence in one verification round (for --explain and tests)."""

    round: int
    seq: int
    draft: list[int]
    accepted: int
    bonus: int
    committed: list[int]
    successor_used: bool  # async: this round's draft came from the previous round's hypotheses
    fallback: bool  # async: hypotheses were drafted this round and none matched the outcome
    sync_draft_seconds: float
    verify_span: tuple[float, float]  # (start, end) seconds since generation start
    draft_span: tuple[float, float] | None  # async: the hypotheses pass (None: none drafted)
    confidence: float  # drafter's product of confidences over this draft
    hypotheses: list[Hypothesis] = field(default_factory=list)  # async: the likeliest outcomes (drafted if draft_span)
    hit: int | None = None  # async: index of the hypothesis that matched the outcome
    leaf: int | None = None  # leaves: index of the verified leaf accepted as the last of ``accepted`` drafts
    copied: bool = False  # lookup: this round's draft was copied from the context (d3d.decode.lookup) or the datastore
    stored: bool = False  # datastore: this round's draft was looked up in the datastore (d3d.decode.datastore)
    min_prob: float = 0.0  # the verify_min_prob this round's drafts were cut at (measured with "auto")


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


class Sequences:
    """The committed tokens, output and target cache of every sequence, and the verification step
    every speculative engine shares (build the pass, accept, commit)."""

    def __init__(self, target: Transformer, prompts: list[list[int]], out: Output, stats: GenerationStats, tcache,
                 temperature: float, seed: int):
        self.target, self.out, self.stats, self.tcache = target, out, stats, tcache
        self.committed = [list(p) for p in prompts]
        self.temperature, self.seed = [temperature] * len(prompts), [seed] * len(prompts)  # per row

    def sample_as(self, i: int, temperature: float, seed: int) -> None:
        """Row i's verification samples at ``temperature``; ``seed`` keys the acceptance streams of the
        launches it comes first in (``judge``)."""
        self.temperature[i], self.seed[i] = temperature, seed

    def begin(self, first: list[int], rows: list[int]) -> None:
        """Commit each sequence's first token (the prefill's); ``rows[j]`` is the row of ``first[j]``."""
        for i, t in zip(rows, first):
            self.committed[i].append(t)
            self.out.commit(i, [t])

    def verification(self, rows: list[int], drafts: list[list[int]], exact: bool = False,
                     leaves: list[list[Hypothesis]] | None = None) -> Verification:
        """The target pass over ``[anchor, drafts[j]]`` of every row ``rows[j]`` (rows verify as many drafts
        as they each have), then row j's ``leaves[j]``: leaf (a, b) is token b at the position of
        d_(a+1), seeing the anchor and d_1..d_a only (``reach``), written to the cache slots after the drafts."""
        leaves = leaves or [[] for _ in rows]
        ids = [t for j, i in enumerate(rows) for t in [self.committed[i][-1], *drafts[j], *(h.bonus for h in leaves[j])]]
        ids = torch.tensor(ids, device=self.target.device)
        lens = [len(d) + 1 + len(row) for d, row in zip(drafts, leaves)]
        if not any(leaves):
            return Verification(self.target, ids, self.tcache.layout(lens, rows, row_invariant=exact), self.tcache)
        g, r, p = zip(*(branches(self.tcache.lengths[i], len(d) + 1, [(h.accepted + 1, 1) for h in row])
                        for i, d, row in zip(rows, drafts, leaves)))
        layout = self.tcache.layout(lens, rows, groups=list(g), reach=list(r), positions=list(p))
        return Verification(self.target, ids, layout, self.tcache)

    def judge(self, logits: torch.Tensor, drafts: list[list[int]], rnd: int,
              leaves: list[list[Hypothesis]] | None = None, rows: list[int] | None = None) -> list[Outcome]:
        """Accept each row's drafts against the target's logits of a ``verification`` pass (one ``accept``
        launch per draft length and temperature in the batch, its streams keyed by the seed of its first row:
        ``rows[j]`` is the row of ``drafts[j]``, default j); a row whose bonus is one of its leaves accepts the leaf
        and takes the bonus after it from the leaf's logits (at T > 0 a fresh sample: the leaf is the
        target's own sample at its position, so the output keeps the target's distribution)."""
        dev, rows = logits.device, list(range(len(drafts))) if rows is None else rows
        leaves = leaves or [[] for _ in drafts]
        starts = [0]
        for d, row in zip(drafts, leaves):
            starts.append(starts[-1] + len(d) + 1 + len(row))
        accepted, bonus = [0] * len(drafts), [0] * len(drafts)
        kinds = [(len(d), self.temperature[i]) for d, i in zip(drafts, rows)]
        for g, (n, t) in enumerate(sorted(set(kinds))):
            js = [j for j, k in enumerate(kinds) if k == (n, t)]
            seed = self.seed[rows[js[0]]]  # each row of a launch draws its own stream (its place j in it)
            at = torch.tensor([starts[j] + p for j in js for p in range(n + 1)], device=dev)
            main = logits if len(at) == len(logits) else logits.index_select(0, at)  # all of it: one kind, no leaves
            result = accept(torch.tensor([drafts[j] for j in js], dtype=torch.long, device=dev).view(len(js), n),
                            main.view(len(js), n + 1, -1), temperature=t, seed=seed * 1_000_003 + rnd + g * _GROUP_SEED)
            for j, a, b in zip(js, result.accept_len.tolist(), result.bonus.tolist()):
                accepted[j], bonus[j] = a, b
        out = [Outcome(d[:a], b) for d, a, b in zip(drafts, accepted, bonus)]
        hits = [(j, m) for j in range(len(drafts)) for m, h in enumerate(leaves[j])
                if (h.accepted, h.bonus) == (accepted[j], bonus[j])]  # bonuses differ: at most one per row
        for t in sorted({kinds[j][1] for j, _ in hits}):
            mine = [(j, m) for j, m in hits if kinds[j][1] == t]
            seed = self.seed[rows[mine[0][0]]]
            at = torch.tensor([starts[j] + len(drafts[j]) + 1 + m for j, m in mine], device=dev)
            after = accept(torch.zeros((len(mine), 0), dtype=torch.long, device=dev), logits.index_select(0, at)[:, None],
                           temperature=t, seed=seed * 1_000_003 + rnd + _LEAF_SEED).bonus.tolist()
            for (j, m), b in zip(mine, after):
                out[j] = Outcome(out[j].accepted + [out[j].bonus], b, m)
        return out

    def commit(self, i: int, o: Outcome, n: int) -> list[int]:
        """Commit the accepted tokens and the bonus of sequence i (its verification had ``n`` drafts);
        the target cache keeps the anchor and the accepted tokens (a hit leaf's K/V moved next to them)."""
        new = o.accepted + [o.bonus]
        self.stats.rounds += 1
        self.stats.accept_hist[len(o.accepted)] += 1
        self.tcache.crop(i, len(self.committed[i]) + o.main_accepted)  # anchor + accepted drafts join the cached prefix
        if o.leaf is not None:
            self.stats.leaf_hits += 1
            self.tcache.append_slot(i, len(self.committed[i]) + n + o.leaf)  # slots: anchor at len-1, drafts, leaves
        self.committed[i].extend(new)
        self.out.commit(i, new)
        return new


def verify_widths(drafts: list[Draft], min_prob: float) -> list[int]:
    """Step 2's n per row: the whole draft, or with ``min_prob`` > 0 the longest run of it the drafter
    believes in (``Draft.likely_length``); rows of a batch verify as many drafts as they each have."""
    return [min(len(d.tokens), d.likely_length(min_prob)) if min_prob > 0 else len(d.tokens) for d in drafts]


@dataclass
class RoundDrafts:
    """Step 1's result: every active row's draft, and how each row got it."""

    drafts: dict[int, Draft]
    need: list[int]  # rows that had no ready draft and copied none: drafted now
    copied: set[int]  # rows whose draft was copied from the context (lookup) or the datastore
    stored: set[int]  # those of them whose draft came from the datastore
    seconds: float  # the drafter pass on the critical path
    stepped: set[int] = field(default_factory=set)  # rows taking a plain step (no drafter this round)


class Drafting:
    """The drafter's side of D3D: its cache, the draft ready for each sequence's next round, and
    the hypotheses pass (steps 1, 3 and the drafter's part of 4 in the module docstring)."""

    def __init__(self, drafter: "Drafter", dcache, seqs: Sequences, stats: GenerationStats, block_size: int,
                 use_hyps: bool, K: int, fanout: int, leaves: int = 0, sources=()):
        self.drafter, self.dcache, self.committed, self.stats, self.B = drafter, dcache, seqs.committed, stats, block_size
        self.sources = list(sources)  # asked in order before the drafter (d3d.decode.sources)
        self.use_hyps, self.K, self.fanout, self.L = use_hyps, K, fanout, leaves
        # top tokens kept per position: the bonus candidates of hypotheses and leaves
        self.top = max(fanout if use_hyps else 0, leaves) + 1 if use_hyps or leaves else 0
        self.ready: list[Draft | None] = [None] * len(self.committed)  # a matched hypothesis: the next draft

    def prepare(self, rows: list[int], clock: Clock, drafter: bool = True) -> RoundDrafts:
        """Step 1: a row keeps its ready draft (a hypothesis of the last round hit); else the first of
        ``sources`` that proposes one gives it; else the drafter drafts it, in one pass for all such rows
        (not ``drafter``: those rows take a plain step, an empty draft)."""
        need, source = [], {}
        for i in rows:
            if self.ready[i] is None:
                self.ready[i], source[i] = self.propose(self.committed[i])
                if self.ready[i] is None:
                    need.append(i)
        seconds, stepped = 0.0, set()
        if need and not drafter:
            for i in need:
                self.ready[i] = Draft([], [], [], [])
            need, stepped = [], set(need)
        if need:
            fresh, (t0, t1) = clock.timed(lambda: self.draft(need))
            for i, d in zip(need, fresh):
                self.ready[i] = d
            seconds = t1 - t0
            self.stats.draft_seconds += seconds
        copied = {i for i, name in source.items() if name is not None}
        stored = {i for i, name in source.items() if name == "datastore"}
        return RoundDrafts({i: self.ready[i] for i in rows}, need, copied, stored, seconds, stepped)

    def propose(self, context: list[int]) -> tuple[Draft | None, str | None]:
        """The first proposal of ``sources`` for ``context`` and the source's name, counted; (None, None)."""
        for source in self.sources:
            draft = source.propose(context, self.B - 1)
            if draft is not None and draft.tokens:
                counter = f"{source.name}_drafts"
                setattr(self.stats, counter, getattr(self.stats, counter) + 1)
                return draft, source.name
        return None, None

    def draft(self, rows: list[int]) -> list[Draft]:
        """Step 1 for rows without a ready draft: one drafter pass over each row's uncached committed
        tokens and the block [anchor, mask x (B-1)]."""
        c, lengths = self.committed, self.dcache.lengths
        d = self.drafter.draft_blocks(self.dcache, rows, [c[i][lengths[i]:-1] for i in rows],
                                      [[Block(len(c[i]) - 1 - lengths[i], c[i][-1])] for i in rows],
                                      self.B, top=self.top)
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
        """Step 2's leaves: the L likeliest bonuses after d_1..d_n of ``draft`` that it proposed, those
        whose estimated hit probability is at least ``min_score`` (the row price under "auto")."""
        if not self.L:
            return []
        leaves = bonus_leaves(draft.tokens, draft.confidence, draft.top_ids, draft.top_probs, n, self.L)
        return [h for h in leaves if h.score >= min_score]

    def start_hypotheses(self, rows: list[int], drafts: dict[int, Draft], hyps: dict[int, list[Hypothesis]],
                         threshold: float):
        """Step 3's pass for the rows whose hypotheses are likely enough to hit (``threshold``):
        the clean run (uncached committed tokens + the drafts) and one block per hypothesis, branching
        off the drafts at its accept length. Returns (the pass's job or None, the rows in it)."""
        rows = [i for i in rows if hyps[i] and sum(h.score for h in hyps[i]) >= threshold]
        if not rows:
            return None, set()
        c, lengths = self.committed, self.dcache.lengths
        clean = [c[i][lengths[i]:] + drafts[i].tokens for i in rows]
        base = [len(c[i]) - lengths[i] for i in rows]  # clean tokens before d_1
        blocks = [[Block(b + h.accepted, h.bonus) for h in hyps[i]] for i, b in zip(rows, base)]
        return self.drafter.start(self.dcache, rows, clean, blocks, self.B), set(rows)

    def finish(self, job, logits) -> list[Draft]:
        """The successor blocks of a hypotheses pass, in the order of its rows and hypotheses."""
        return host_drafts(self.drafter.finish(self.dcache, job, logits, top=self.top)) if job else []

    def settle(self, i: int, o: Outcome, hyps: list[Hypothesis], mine: list[Draft]) -> int | None:
        """Step 4 for row i (before the commit): keep the anchor and the accepted drafts in the drafter
        cache, and the successor whose hypothesis matches the outcome as the next draft (none after a
        leaf hit: the successors start one token early). Returns the index of that hypothesis, or None."""
        hit, accepted = None, o.main_accepted
        if mine:
            self.dcache.crop(i, len(self.committed[i]) + accepted)
            hit = matching(hyps, [s.guess for s in mine], accepted, o.bonus) if o.leaf is None else None
            self.stats.successor_hits += hit is not None
            self.stats.hits_by_accept[accepted] += hit is not None
            self.stats.fallbacks += hit is None
        self.ready[i] = mine[hit] if hit is not None else None
        return hit


class SpeculativeDecoder(Decoder):
    """D3D's rounds (sync or async, every knob of ``spec`` set: ``SpecConfig.resolve``) over ``rows`` cache
    rows that sequences join (``admit``) and leave (done, or ``drop``) between rounds; ``step`` is one
    round, the module docstring's steps. ``generate`` admits every prompt at once; the
    server admits requests as they come. A drafter with ``denoise_steps > 1`` drafts only the
    all-accepted hypothesis (its later steps re-run whole blocks); in a batch every row verifies as many
    drafts as the shortest row's draft has."""

    def __init__(self, target: Transformer, drafter: "Drafter", spec: SpecConfig, sampling: Sampling,
                 stop_ids: set[int], rows: int, max_len: int, stream: StreamFn | None = None,
                 on_round: Callable[[RoundInfo], None] | None = None):
        B, use_hyps = spec.block_size, spec.mode == "async"
        K = spec.hypotheses if drafter.dcfg.denoise_steps == 1 else 1
        super().__init__(target, GenerationStats(spec.mode, rows, [0] * rows, [0] * rows, block_size=B,
                                                 accept_hist=[0] * B, hits_by_accept=[0] * B),
                         sampling, stop_ids, stream)
        self.spec, self.on_round, self.rnd = spec, on_round, 0
        self.price = RowPrice()  # the one cost model: what a verified row, a drafter pass, a hypotheses pass cost
        self.ov = make_overlap(spec.overlap if use_hyps else "none", self.clock, target, drafter)
        # caches: the drafter's has room for the K hypothesis blocks after a clean run
        tcache, dcache = self.ov.new_caches(target, drafter, rows, max_len + B + 1 + spec.leaves, max_len + (K + 2) * B + 2)
        self.seqs = Sequences(target, [[] for _ in range(rows)], self.out, self.stats, tcache, sampling.temperature,
                              sampling.seed)
        self.side = Drafting(drafter, dcache, self.seqs, self.stats, B, use_hyps, K, spec.fanout,
                             spec.leaves, draft_sources(spec))

    @torch.inference_mode()
    def admit(self, rows: list[int], prompts: list[list[int]], max_new: list[int],
              sampling: list[Sampling] | None = None) -> None:
        """Start a sequence in each of ``rows`` (free ones): one prefill pass for all, their first token.
        ``sampling``: one ``Sampling`` per row (temperature and seed; no top_k/top_p at T > 0), None: the
        decoder's."""
        for j, (i, p) in enumerate(zip(rows, prompts)):
            s = sampling[j] if sampling is not None else self.sampling
            check_lossless_sampling(s)
            self.seqs.committed[i] = list(p)
            self.seqs.sample_as(i, s.temperature, s.seed)
            self.side.dcache.crop(i, 0)
            self.side.ready[i] = None
        self.seqs.begin(self.prefill(self.seqs.tcache, rows, prompts, max_new, sampling=sampling)[0], rows)

    @torch.inference_mode()
    def step(self) -> list[int]:
        """One round for every active row; returns those rows (none: nothing to decode)."""
        rows, rnd, side, seqs, stats, clock = self.out.active(), self.rnd, self.side, self.seqs, self.stats, self.clock
        if not rows:
            return rows
        began = clock.now()
        # 1 draft: a matched hypothesis of the last round, a copy, a retrieved chain, or one drafter pass
        r = side.prepare(rows, clock, drafter=self.spec.verify_min_prob.drafts(self.price, len(rows)))
        # plan: how many drafts and which leaves are worth their rows
        plan = plan_round(rows, r.drafts, side, self.spec.verify_min_prob, self.price, stats)
        # 2 verify || 3 draft ahead for the likeliest outcomes (async)
        hyps = {i: side.likeliest_outcomes(plan.drafts[i]) for i in rows}
        job, hyp_rows = side.start_hypotheses(rows, plan.drafts, hyps, self.spec.successor_threshold(self.price))
        drafts = [plan.drafts[i].tokens for i in rows]
        t_logits, d_logits, v_span, d_span = self.ov.run(seqs.verification(rows, drafts, self.spec.exact, plan.leaves),
                                                         job)
        # 4 accept
        outcomes = seqs.judge(t_logits, drafts, rnd, plan.leaves, rows)
        successors = side.finish(job, d_logits)
        stats.count_verification(v_span, d_span if job is not None else None, len(hyp_rows), len(successors))
        # 5 commit, and keep the successor that matches the outcome
        per_row, gained = iter(successors), 0
        for i, o in zip(rows, outcomes):
            mine = [next(per_row) for _ in hyps[i]] if i in hyp_rows else []
            hit = side.settle(i, o, hyps[i], mine)
            new = seqs.commit(i, o, len(plan.drafts[i].tokens))
            gained += len(new)
            if self.on_round:
                self.on_round(round_info(rnd, i, plan, r, o, new, hyps[i], mine, hit, v_span, d_span))
        self.price.observe_drafter("draft", r.seconds, len(r.need))
        if job is not None:
            self.price.observe_drafter("hypotheses", max(0.0, d_span[1] - max(d_span[0], v_span[1])), len(hyp_rows))
        self.price.observe(sum(len(plan.drafts[i].tokens) + 1 for i in rows) + sum(map(len, plan.leaves)),
                           v_span[1] - v_span[0], gained, clock.now() - began,
                           drafted=True if r.need else False if r.stepped else None)
        self.rnd += 1
        return rows

    def close(self) -> None:
        self.ov.close()


@dataclass
class Plan:
    """What a round verifies: each row's drafts (``drafts``, cut to what is worth verifying) and leaves."""

    drafts: dict[int, Draft]
    leaves: list[list[Hypothesis]]
    min_prob: float


def plan_round(rows: list[int], drafts: dict[int, Draft], side: "Drafting", cut: "Fixed | PricedCut",
               price: RowPrice, stats: GenerationStats) -> Plan:
    """The drafts worth their rows (each row's longest run whose joint estimate beats the round's
    ``cut``, ``Draft.likely_length``) and the leaves: a fixed cut cuts drafts only; a priced one
    (``verify_min_prob=auto``) is the measured ``price`` of a row (``d3d.decode.row_price``), for
    drafts and leaves alike."""
    min_prob = cut(price)
    widths = verify_widths([drafts[i] for i in rows], min_prob)
    leaves = [side.leaves(drafts[i], n, cut.leaf_floor(min_prob)) for i, n in zip(rows, widths)]
    stats.verified_drafts += sum(widths)
    stats.verified_leaves += sum(map(len, leaves))
    return Plan({i: drafts[i].truncated(n) for i, n in zip(rows, widths)}, leaves, min_prob)


def round_info(rnd: int, i: int, plan: Plan, r: RoundDrafts, o: Outcome, new: list[int], hyps: list[Hypothesis],
               mine: list[Draft], hit: int | None, v_span, d_span) -> RoundInfo:
    """What ``on_round`` (``--explain``) sees of row ``i`` in round ``rnd``."""
    d, drafted = plan.drafts[i], i in r.need
    return RoundInfo(round=rnd, seq=i, draft=list(d.tokens), accepted=len(o.accepted), bonus=o.bonus, committed=new,
                     successor_used=not drafted and i not in r.copied and i not in r.stepped,
                     fallback=bool(mine) and hit is None,
                     sync_draft_seconds=r.seconds if drafted else 0.0, verify_span=v_span,
                     draft_span=d_span if mine else None, confidence=d.certainty, hypotheses=hyps, hit=hit,
                     leaf=o.leaf, copied=i in r.copied, stored=i in r.stored, min_prob=plan.min_prob)


__all__ = ["SpeculativeDecoder", "RoundInfo", "Sequences", "Draft", "Outcome", "host_drafts",
           "verify_widths", "RoundDrafts"]
