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

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..model.cache import KVCache, PassLayout
from .generation import Clock
from ..kernels import skinny
from ..model.transformer import Transformer

if TYPE_CHECKING:
    from ..draft.drafter import Drafter, DraftJob

OVERLAPS = ("none", "stream", "packed")
Span = tuple[float, float]


@dataclass
class Verification:
    """The target's verification pass of one round."""

    target: Transformer
    ids: torch.Tensor
    layout: PassLayout
    cache: KVCache

    @torch.inference_mode()
    def forward(self) -> torch.Tensor:
        return self.target(self.ids, self.layout, self.cache)


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


def default_overlap(target: Transformer, drafter=None) -> str:
    """CUDA: a second stream. CPU: ``"none"``.

    Measured on the bundled pair, bf16 with prepacked weights, 8 held-out code prompts, one run
    (AMD EPYC Zen 5, 2 cores): async@0.3 none 1.65x, packed 1.60x, thread 1.27x of ar (sync 1.58x).
    The packed pass's stacked bmm weights cannot use the prepacked per-model matmuls, and two
    threads on two cores halve each pass's cores (that overlap was removed); ``none`` also keeps ``exact`` available."""
    return "stream" if target.device.type == "cuda" else "none"


@dataclass(frozen=True)
class AsyncSettings:
    overlap: str
    hypotheses: int  # K: successor blocks drafted per row and round
    fanout: int  # F: bonus candidates per accept length
    threshold: float  # least estimated hit probability for which a row gets hypotheses


def async_defaults(device: torch.device) -> AsyncSettings:
    """The async settings of a device, chosen by measurement on *validation* prompts.

    CPU (bundled pair, bf16, 12 validation code prompts x 128 tokens, one run each;
    docs/results/async-hypotheses/validation_*.json; AMD EPYC Zen 5, 2 cores): every hypothesis
    costs real time, because the pass competes with verification for the same two cores: a
    hypotheses pass (K=1: 2.3 ms) costs about what the synchronous draft it may save does
    (2.5 ms), so async pays only if it hits more often than it drafts — it never does. Measured,
    speedup over ar (sync: 1.58x / 1.66x in the two runs): K=1 1.12x, K=4 0.86x (hit rate 52%),
    K=8 F=3 0.68x (70%) with threshold 0; threads and the packed pass were slower still (thread
    K=4 0.79x, packed K=4 0.72x). Gating by the estimated hit probability recovers sync's speed as
    fewer rows get hypotheses: threshold 0.5 K=1 1.60x (10% hits), 0.9 K=1 1.64x. So on a CPU
    async is sync plus rare, very likely hypotheses, and ``default_mode`` picks sync.

    CUDA: unmeasured (no GPU was available). The hypotheses pass runs on idle SMs beside
    verification, so K=8 with SSD's fan-out of 3 and no gate; ``python -m bench gpu`` measures
    K in {1, 4, 8, 16, 32} (stage "hypotheses") to replace this guess.
    """
    if device.type == "cuda":
        return AsyncSettings("stream", 8, 3, 0.0)
    return AsyncSettings("none", 1, 1, 0.5)


def default_verify_min_prob(device: torch.device) -> float | str:
    """``verify_min_prob`` of a device: verify only the leading drafts whose joint estimate is at least
    this probability (``generate_speculative``), chosen on validation requests.

    CPU "auto": the threshold is measured as the generation runs, tokens per second times the seconds
    one more verified row adds (``d3d.decode.row_price``). Qwen2.5-Coder-0.5B with the shipped drafter (2
    leaves, lookup 3), fp32 on a 2-core AVX2-only AMD EPYC, 8 validation chat requests x 128 tokens per
    set, two runs (docs/results/copy-length/validation*_*.json), speed over ar, fixed 0.05 -> auto: code
    1.71x -> 1.69x and 1.74x -> 1.74x, explanations 1.11x -> 1.16x and 1.16x -> 1.26x (fixed 0.2 in the
    first run: 1.70x, 1.18x). It measured ~8-9 ms a row there and thresholds of ~0.05-0.27 (prose, slow
    rounds: low; copied code, fast rounds: high), and verified 3.2 / 2.5 drafts a round instead of 4.6 /
    3.1. The fixed 0.05 it replaces was chosen in bf16 on an avx512_bf16 Zen 5 (docs/results/qwen-drafter/
    run3/validation_verify.json: P = 0 0.94x, 0.02 1.36x, **0.05 1.38x**, 0.1 1.35x, 0.2 1.22x of ar),
    where a 16-row pass cost 77 ms and a 3-row one 49 ms (b ~ 2 ms) at ~24 tok/s: R * b ~ 0.05, the
    value that won there. The auto threshold starts at that 0.05 (``RowPrice.prior``).
    CUDA: 0 (a 16-token verification costs about what one token does; unmeasured)."""
    return 0.0 if device.type == "cuda" else "auto"


def default_leaves(device: torch.device, mode: str, dtype: torch.dtype | None = None, quantized: bool = False) -> int:
    """``leaves`` of a device and mode: the bonus candidates verified beside the drafts
    (``d3d.decode.speculative``), chosen on validation prompts.

    async: 0. Its hypotheses pre-draft successors for the same likeliest outcomes, and a leaf hit
    makes them unusable (the successor of (a, b) guesses the token after b, where the leaf hit has
    already committed the target's), so the two compete; unmeasured against each other.
    sync: 2 on a CPU. Qwen2.5-Coder-0.5B with the shipped drafter, bf16, sync at P = 0.02, 8 validation chat
    requests x 96 tokens, two runs (docs/results/leaves/validation_choice*.json; AMD EPYC Zen 5, 2
    cores, no AMX), speed over bf16 ar: L = 0 1.57x / 1.55x, 1 - / 1.67x, **2 1.66x / 1.63x**, 3 - / 1.62x,
    4 1.50x, 8 1.44x, with τ 1.88 -> 1.99 / 2.07 / 2.11 / 2.15 / 2.26 (leaf hit in 15-42% of rounds).
    A verification of up to ~6 rows cost about what 4 do (55-56 ms), 8 rows 66 ms, 12 rows 74 ms, so
    the τ of more leaves does not pay on this CPU; 1-3 are alike within one run's noise. The bundled
    pair (8 validation code prompts, one run, docs/results/leaves/bundled_validation.json): τ 4.35 ->
    4.79, sync 1.71x -> 1.72x. CUDA: 2 as well until ``python -m bench gpu`` (stage "hypotheses")
    measures 0 / 4 / 16 there; rows are nearly free on a GPU, so more leaves should pay.
    sync in fp32 on a CPU: 2 where fp32 matmuls run on the row-invariant panels of
    ``d3d.kernels.skinny`` (AVX2 CPUs), 0 where they run on oneDNN. On oneDNN a verified row cost real
    time (a 3-row pass 175-183 ms, a 5-row one ~230 ms on the 2-core AVX2 EPYC in a slow hour) and
    leaves lost on validation requests (fp32, 8 chat requests x 128 tokens per set, modes interleaved,
    docs/results/leaf-price/ab*.txt), speed over the fastest ar, 2 leaves -> 0: code 1.57x -> 1.75x and
    1.59x -> 1.69x, explanations 0.94x -> 1.03x and 1.11x -> 1.14x in two runs. On the panels a 6-row
    pass costs about what a 1-row one does, and leaves won on the same requests (one run,
    docs/results/panels/ab.txt), 0 -> 2 leaves: code 1.98x -> 2.10x, explanations 1.27x -> 1.40x.
    Quantized weights (``d3d.cpu.quant``, fp32 activations, whatever the matmul of dense fp32): 2. The
    real model as convert-gguf keeps it, 8 validation requests per set, one run (AMD Zen 5, 2 cores,
    docs/results/quant/validation_defaults.json), 0 -> 2 leaves: code 1.31x -> 1.36x, explanations
    1.00x -> 1.03x over ar."""
    if mode == "async":
        return 0
    if device.type == "cpu" and dtype == torch.float32 and not quantized and not skinny.wanted():
        return 0
    return 2


def default_lookup(device: torch.device, mode: str) -> int:
    """``lookup`` of a device and mode: draft by copying from the context after a match of this many
    tokens (``d3d.decode.lookup``), chosen on validation prompts.

    sync: 3. Qwen2.5-Coder-0.5B with the shipped drafter (P = 0.05, 2 leaves), bf16, 8 validation chat
    requests x 96 tokens, two runs (docs/results/lookup/validation_choice*.json; AMD EPYC Zen 5, 2 cores,
    no AMX), speed over bf16 ar: lookup 0 1.61x / 1.67x (τ 2.03), 1 1.95x / -, 2 2.34x / 2.45x (τ 3.28),
    **3 2.32x / 2.48x** (τ 3.29), 4 2.27x / -. The bundled pair (16 validation code prompts,
    docs/results/lookup/bundled_validation2.json): 2.02x -> 2.44x (2) / 2.42x (3), although τ fell
    (5.24 -> 4.64 / 4.56): a copied round skips the drafter pass. 2 and 3 are alike; 3 leans on longer
    matches. async: 0, unmeasured: where drafting is hidden (a GPU) only τ counts, and the bundled
    pair's τ fell with lookup; ``python -m bench gpu`` (stage "hypotheses") measures it."""
    return 0 if mode == "async" else 3


def default_mode(device: torch.device) -> str:
    """The speculative mode ``python -m d3d generate`` uses with a D3D drafter: async on CUDA,
    sync on a CPU, where async measured slower than sync in every setting (``async_defaults``)."""
    return "async" if device.type == "cuda" else "sync"


@contextlib.contextmanager
def closing(overlap: Serial):
    try:
        yield overlap
    finally:
        overlap.close()


__all__ = ["OVERLAPS", "Verification", "Serial", "Streamed", "Packed", "SideStream", "make_overlap",
           "default_overlap", "packed_pair", "closing", "AsyncSettings", "async_defaults", "default_mode",
           "default_verify_min_prob", "default_leaves", "default_lookup"]
