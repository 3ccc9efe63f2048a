"""How many drafts to verify: a row is worth verifying while its chance of acceptance beats its price.

Verifying one more draft adds a row to the target's pass. Where rows cost time (a CPU without AMX),
it is worth it iff the tokens it is expected to add, per second it costs, beat the rate the engine
already commits tokens at:

    P(the k-th draft is accepted)  >=  R * b,

R the committed tokens per second (drafting and verification included), b the seconds one more
verified row adds to a pass. ``SpeculativeDecoder`` cuts each draft where the joint probability
its drafts carry (``Draft.likely_length``: the drafter's confidences; ``d3d.decode.lookup``'s estimates for
copied chains) falls below that threshold, ``verify_min_prob``. A fixed one (0.05 on a CPU) was chosen
on one machine; ``RowPrice`` measures both factors as the generation runs instead, so the cut follows
the machine, the dtype and the text:

    bf16 on a CPU with bf16 matmuls (docs/results/qwen-drafter/run3): R * b came out at the fixed
    value validation had picked.
    fp32 on an AVX2-only CPU (bench passes; docs/results/copy-length/): rows cost more, and R * b is
    higher on code the answer copies than on prose. There copied chains had been verified 15 long
    (confidence 1) whatever their match; offline, cutting them sped the copied rounds up
    (docs/results/copy-length/probe.txt). On validation requests auto was as fast as the fixed 0.05
    on code and faster on explanations (docs/results/copy-length/, two runs).
    AMX with bf16 matmuls, or a GPU (expected, unmeasured): b ~ 0, every draft verified. Quantized
    weights on an AMX Xeon take the VNNI kernel (its AMX tiles measured slower: docs/results/amx/), so
    rows cost there as on other AVX-512 CPUs (verify(8)/step 1.47: docs/results/prefetch-l2/).

The drafter pass itself has a price, so rounds that draft and plain steps (empty drafts; copied ones
still verified) are timed and the faster kind taken (``RowPrice.draft``). Rounds whose every row had a
copied draft count as neither: copies are cheap and long, and crediting them to plain steps had made
code fall back to steps. Nor does the drafter's first pass at the start or after plain steps: it feeds
its cache the prompt or the steps' tokens. When it counted, the prompt's prefill alone made drafting
look ~2.7x slower than steps (the 1.5B: 10 against 27 tok/s), and one-round probes (a noisy sample
at a quarter's weight) rarely won it back: explanations ran at τ 1.1-1.3 where the drafter reaches
1.5-1.6 (docs/results/cut-batch1/). So for one sequence the other kind is probed afresh, its old
rate forgotten (drafting for 4 counted rounds, a step for one; a rate is the mean of its first 10
rounds, then weighs a new one 0.1). Batches keep what they were validated with (every round counts,
one-round probes, weight 0.25): there drafting rarely pays on a CPU, and the longer probes cost them
1-5% (docs/results/cut-batch1/batches_scaled_0.5b.json). Probes come after 8 rounds, then twice as long
after each probe that changed nothing (at most 64). A batch asks no drafter at all while R * b is 0.3 or
more (``BATCH_DRAFT_LIMIT``), and again only after ``probe_every`` rounds in a row below it (one noisy
round had dropped it to 0.25 and cost a 14-row batch a 585 ms catch-up pass): there a draft pays only
when it is almost sure, and drafting's passes and probes had cost batches of 4 and 16 on a 2-core CPU
3-15% against ar (docs/results/batch-gate/).
What the choice gained: in batches of 4 and 16 rows (docs/results/serve/gate_validation.json) and for
one sequence (docs/results/gate-batch1/validation_*_without_copies_*.json, docs/results/cut-batch1/),
on validation chat requests.

b is the slope of an exponentially weighted least-squares fit of the verification seconds on the
rows verified (rounds differ in width: copied chains, drafter blocks cut short, leaves); R a ratio
of exponentially weighted tokens and seconds. Until ``warmup`` rounds are in, and whenever the widths
seen so far hardly differ (the slope would be noise), the ``prior`` threshold holds, that of one row at the round's
context (``RowPrice.prior_at``: a row attends over the context; docs/results/long-prior/);
a batch of n rows starts at n p / (1 - p + n p): R * b where a step costs a + n b and one row's p is
b / (a + b). No ceiling caps R * b (it had been 0.5; a batch of 16 measures ~0.8). The rounds then
depend on timing, the tokens do not (every cut is lossless).
"""

from __future__ import annotations

from dataclasses import dataclass


DRAFT_DECAY = 0.25  # the weight of a new drafter pass in its seconds per row
KIND_DECAY = 0.1  # ... of a new round of one sequence in the rates of drafting rounds and plain steps
# (batches: DRAFT_DECAY, as docs/results/serve/gate_validation.json measured them)
ATTENTION_PER_TOKEN = 1.1e-4  # a verified row's attention, per cached token, as a share of a short-context step
# (2-core Zen 4, docs/results/draft-window/attention.txt: the 0.5B 1.8 us a token against a ~14 ms step, the 1.5B
# 4.5 us against ~37 ms; a 16-row copy at 2,042 tokens took 75 ms against a 17 ms step, docs/results/long-prior/)
BATCH_DRAFT_LIMIT = 0.3  # a batch asks no drafter while a verified row's price R * b is this or more
# (docs/results/batch-gate/: on a 2-core Zen 4, batches of 4 and 16 measured R * b ~ 0.4-0.9 and lost to ar
# by drafting, probes included; on a machine where rows are cheap R * b stays low and the gate decides)


def ewma(old: float | None, x: float, decay: float = DRAFT_DECAY) -> float:
    """An exponentially weighted mean after ``x`` (``x`` itself first)."""
    return x if old is None else old + decay * (x - old)


class RowPrice:
    """Running estimates of R (tokens per second) and b (seconds per verified row), and the
    threshold R * b (``min_prob``). ``decay``: the weight of a new round in each average."""

    def __init__(self, prior: float = 0.05, decay: float = 0.05, warmup: int = 8, ceiling: float = 1.0,
                 min_rows: int = 1, probe_every: int = 8, probe_most: int = 64, drafting_samples: int = 4,
                 batch_limit: float = BATCH_DRAFT_LIMIT):
        if not 0 <= prior <= 1:
            raise ValueError(f"prior={prior!r}: must be a probability in [0, 1]")
        if not 0 < decay <= 1:
            raise ValueError(f"decay={decay!r}: must be in (0, 1]")
        if not 0 < ceiling <= 1:
            raise ValueError(f"ceiling={ceiling!r}: must be in (0, 1]")
        self.prior, self.decay, self.warmup, self.ceiling, self.batch_limit = prior, decay, warmup, ceiling, batch_limit
        if drafting_samples < 1:
            raise ValueError(f"drafting_samples={drafting_samples!r}: must be >= 1")
        self.min_rows, self.probe_every, self.probe_most, self.since_probe = min_rows, probe_every, probe_most, 0
        self.probe_interval, self.best = probe_every, None
        self.by_kind = {True: [None, None], False: [None, None]}  # drafted? -> EWMA [tokens, seconds] of rounds
        self.samples = {True: 0, False: 0}  # ... rounds in them since each was last tried afresh
        self.drafting_samples, self.batch = drafting_samples, 1  # the rows of the last round asked
        self.stale = True  # the drafter's cache lags (nothing drafted yet, or plain steps since): its next pass catches up
        self.per_row = {"draft": None, "hypotheses": None}  # EWMA seconds per row: a sync draft, a hypotheses pass
        self.rounds, self.cheap = 0, probe_every  # ... and the batch's rounds in a row with R * b below batch_limit
        self.m = [0.0] * 4  # weighted means of w, w^2, s, w*s (verification rows w, seconds s)
        self.tokens = self.seconds = 0.0
        self.rated = 0  # rounds in R
        self.context = 0  # the longest context of the round's rows, tokens (the prior grows with it)

    def observe(self, rows: int, verify_seconds: float, tokens: int, round_seconds: float,
                drafted: bool | None = True) -> None:
        """One round: a verification of ``rows`` target rows took ``verify_seconds``; the whole round
        (drafting included, if the drafter ran: ``drafted``) committed ``tokens`` in ``round_seconds``.
        ``drafted`` None: neither kind (every row had a copied draft), which tells ``draft`` nothing; nor
        does a drafting round of one sequence whose pass caught the drafter's cache up (the first, or the first
        after a plain step), which R leaves out too: the first round of a 2,000-token prompt took 635 ms against
        ~20 for the rest, and held R, so the cut, at a tenth of their rate for ~40 rounds
        (docs/results/draft-window/)."""
        if rows < 1 or verify_seconds < 0 or tokens < 0 or round_seconds < 0:
            raise ValueError(f"observe(rows={rows}, verify_seconds={verify_seconds}, tokens={tokens}, "
                             f"round_seconds={round_seconds}): rows >= 1 and times and tokens >= 0")
        d = 1.0 if self.rounds == 0 else self.decay
        for j, x in enumerate((rows, rows * rows, verify_seconds, rows * verify_seconds)):
            self.m[j] += d * (x - self.m[j])
        single = self.batch == 1  # one sequence (module docstring); batches as they were validated
        caught_up = drafted is True and self.stale and single  # the pass caught the drafter's cache up
        if caught_up:  # R is the rate of rounds to come: a catch-up pass is not one of them
            self.stale, drafted = False, None
        else:
            d = 1.0 if self.rated == 0 else self.decay
            self.tokens += d * (tokens - self.tokens)
            self.seconds += d * (round_seconds - self.seconds)
            self.rated += 1
        if drafted is not None:
            kind, self.samples[drafted] = self.by_kind[drafted], self.samples[drafted] + 1
            d = max(KIND_DECAY, 1 / self.samples[drafted]) if single else DRAFT_DECAY  # a mean at first
            kind[:] = [ewma(kind[0], tokens, d), ewma(kind[1], round_seconds, d)]
            self.stale = not drafted
        self.rounds += 1

    def seconds_per_row(self) -> float | None:
        """b, the slope of seconds on rows (>= 0); None while the widths seen hardly differ."""
        w, ww, s, ws = self.m  # the weights sum to 1 (the first round's is 1): these are means
        var = ww - w * w
        if var < 1.0:  # widths within about a row of each other: no slope to see
            return None
        return max(0.0, (ws - w * s) / var)

    def rate(self) -> float:
        """R, committed tokens per second of rounds."""
        return self.tokens / max(self.seconds, 1e-9)

    def draft(self, rows: int) -> bool:
        """Whether this round asks the drafter, for a batch of ``rows`` (below ``min_rows`` it always
        does). Compare the tokens per second of rounds that drafted with those of plain steps (rounds
        whose every row had a copied draft count as neither; for one sequence, so does the drafter's
        first pass after plain steps or at the start: it catches its cache up), take the faster kind,
        and probe the other (one sequence: afresh, its old rate forgotten, drafting tried for
        ``drafting_samples`` counted rounds): after ``probe_every`` rounds, then twice as long after
        each probe that left the faster kind as it was (at most ``probe_most``), back to
        ``probe_every`` when it changes."""
        if rows < self.min_rows:
            return True
        self.batch = rows
        if rows > 1:  # a row costs too much for a draft to pay: no drafter until R * b stays below the limit
            self.cheap = self.cheap + 1 if self.min_prob() < self.batch_limit else 0
            if self.cheap < self.probe_every:
                return False
        wanted = {True: self.drafting_samples if rows == 1 else 1, False: 1}
        for kind in (True, False):
            if self.samples[kind] < wanted[kind]:
                return kind
        (td, sd), (ts, ss) = self.by_kind[True], self.by_kind[False]
        best = td / max(sd, 1e-9) >= ts / max(ss, 1e-9)
        if best != self.best:
            self.best, self.probe_interval, self.since_probe = best, self.probe_every, 0
        self.since_probe += 1
        if self.since_probe >= self.probe_interval:  # the other kind afresh: its rate is as old as the interval
            self.since_probe, self.probe_interval = 0, min(2 * self.probe_interval, self.probe_most)
            if rows == 1:
                self.by_kind[not best], self.samples[not best] = [None, None], 0
            return not best
        return best

    def observe_drafter(self, kind: str, seconds: float, rows: int) -> None:
        """A drafter pass on the round's critical path: ``kind`` "draft" (the synchronous draft of ``rows``
        rows) or "hypotheses" (the part of an async hypotheses pass for ``rows`` rows that verification
        did not hide)."""
        if rows > 0:
            self.per_row[kind] = ewma(self.per_row[kind], seconds / rows)

    def successor_threshold(self, prior: float = 0.5) -> float:
        """async: the least chance of a hit worth a hypotheses pass: the seconds it adds to a round over
        those of the synchronous draft a hit saves (``prior`` until both are measured). A pass hidden
        behind verification (a second CUDA stream) adds ~0: every hypothesis is worth drafting; on a CPU
        it adds about what it saves."""
        d, h = self.per_row["draft"], self.per_row["hypotheses"]
        return prior if d is None or h is None or d <= 0 else h / d

    def min_prob(self) -> float:
        """The threshold R * b (at most ``ceiling``), or before it can be measured the prior at the round's
        context (``prior_at``) scaled to the batch."""
        b = self.seconds_per_row() if self.rounds >= self.warmup else None
        if b is None:  # a batch of n rows: R * b = n b / (a + n b), from one row's prior b / (a + b)
            n, p = self.batch, self.prior_at(self.context)
            return n * p / (1 - p + n * p)
        return min(self.ceiling, self.rate() * b)

    def prior_at(self, context: int) -> float:
        """One row's share of a pass, b / (a + b), before it is measured: ``prior`` at a short context. A row
        also attends over every cached token, and so does the step, so both grow by ``ATTENTION_PER_TOKEN`` a
        token: at 2,000 tokens the prior is ~0.19, not 0.05, and a copy's first rounds are cut where the
        prior had let 16-row copies through at 4x a step's time."""
        k = ATTENTION_PER_TOKEN * context
        return (self.prior + k) / (1 + 2 * k)


@dataclass(frozen=True)
class Fixed:
    """A threshold set by hand (``verify_min_prob=P``, ``successor_threshold=T``): the same every round.
    As a round's cut it cuts drafts only (leaves are verified whatever their score) and every round
    asks the drafter."""

    value: float

    def __call__(self, price: RowPrice) -> float:
        return self.value

    def leaf_floor(self, min_prob: float) -> float:
        return 0.0

    def drafts(self, price: RowPrice, rows: int) -> bool:
        return True

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class PricedCut:
    """``verify_min_prob=auto``: the round's cut is the measured R * b (``RowPrice.min_prob``), for
    drafts and leaves alike; with ``gate`` (sync) a batch asks the drafter only while drafting rounds
    commit faster than plain steps (``RowPrice.draft``)."""

    gate: bool = True

    def __call__(self, price: RowPrice) -> float:
        return price.min_prob()

    def leaf_floor(self, min_prob: float) -> float:
        return min_prob

    def drafts(self, price: RowPrice, rows: int) -> bool:
        price.batch = rows  # the prior is scaled to it, with the gate or without
        return price.draft(rows) if self.gate else True

    def __str__(self) -> str:
        return "auto"


@dataclass(frozen=True)
class PricedSuccessor:
    """``successor_threshold=auto``: the least hit chance worth a hypotheses pass, measured
    (``RowPrice.successor_threshold``)."""

    def __call__(self, price: RowPrice) -> float:
        return price.successor_threshold()

    def __str__(self) -> str:
        return "auto"


def as_cut(value, gate: bool) -> "Fixed | PricedCut":
    """A ``verify_min_prob`` value ("auto" or a probability) as the rule a round calls."""
    if isinstance(value, (Fixed, PricedCut)):
        return value
    return PricedCut(gate) if value == "auto" else Fixed(value)


def as_successor_threshold(value) -> "Fixed | PricedSuccessor":
    """A ``successor_threshold`` value ("auto" or a number) as the rule a round calls."""
    if isinstance(value, (Fixed, PricedSuccessor)):
        return value
    return PricedSuccessor() if value == "auto" else Fixed(value)


__all__ = ["RowPrice", "Fixed", "PricedCut", "PricedSuccessor", "as_cut", "as_successor_threshold"]
