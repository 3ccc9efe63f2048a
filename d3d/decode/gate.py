"""Speculate only while it pays: the choice between a drafting round and a plain target step.

A sync round that asks the drafter costs a drafter pass plus a verification of 1 + n + L tokens,
and commits 1 + a tokens (a accepted drafts, ``d3d.decode.speculative``). A plain target step (an empty
draft: the verification of the anchor alone) costs one target step and commits 1 token. So drafting
pays iff

    (1 + E[a]) / (t_draft + t_verify(1 + n + L))  >  1 / t_step,

and both sides depend on the hardware and the text. Measured on Qwen2.5-Coder-0.5B with the shipped
drafter, fp32 on a 2-core AVX2 CPU (docs/results/qwen-drafter/avx2/): t_step 148 ms, a drafting
round 229 ms, so drafting needs E[a] > 0.55; on MT-Bench prose the drafter's E[a] was 0.21 and sync
ran at 0.76-0.79x of ar. With bf16 on avx512_bf16, where 16 verified rows cost about one step, the
same drafter paid on the same prose (1.07x).

``Gate`` measures both sides instead of assuming them: the tokens per second of the rounds of each
kind (ratios of exponential moving averages of tokens and of seconds), taking the better kind each
round and the other every ``probe_every``-th round, so that a change in the text (prose giving way
to code the context repeats) is seen. The output is the same either way (a step is a verification
with no drafts), only the rounds differ; they depend on timing, so a run's rounds are not
reproducible, its tokens are.

Off by default (``d3d.decode.overlap.default_gate``): on validation requests, where drafting paid on
average even in fp32 (1.73x code, 1.18x explanations), the gate's steps cost 3-5% of the speed.
Acceptance comes in bursts the last few rounds do not announce: a switch to steps after rounds that
accepted nothing skips the next burst until a probe finds it.
"""

from __future__ import annotations

DRAFT, STEP = "draft", "step"


class Gate:
    """Two running rates, tokens per second of drafting rounds and of plain steps, and the choice
    between them. ``decay``: the weight of a new round in each average."""

    def __init__(self, probe_every: int = 8, decay: float = 0.25):
        if not isinstance(probe_every, int) or probe_every < 2:
            raise ValueError(f"probe_every={probe_every!r}: must be an integer >= 2 (every k-th round tries the other kind)")
        if not 0 < decay <= 1:
            raise ValueError(f"decay={decay!r}: must be in (0, 1]")
        self.probe_every, self.decay = probe_every, decay
        self.tokens: dict[str, float | None] = {DRAFT: None, STEP: None}
        self.seconds: dict[str, float | None] = {DRAFT: None, STEP: None}
        self.since_probe = 0

    def rate(self, kind: str) -> float | None:
        """Tokens per second of rounds of ``kind`` (None before one was measured)."""
        t, s = self.tokens[kind], self.seconds[kind]
        return None if t is None else t / max(s, 1e-9)

    def choose(self) -> str:
        """The kind of the next round: each kind once first, then the faster one, and the other
        every ``probe_every``-th round."""
        for kind in (DRAFT, STEP):
            if self.tokens[kind] is None:
                return kind
        best = DRAFT if self.rate(DRAFT) >= self.rate(STEP) else STEP
        self.since_probe += 1
        if self.since_probe >= self.probe_every:
            self.since_probe = 0
            return STEP if best == DRAFT else DRAFT
        return best

    def update(self, kind: str, tokens: int, seconds: float) -> None:
        """A round of ``kind`` committed ``tokens`` in ``seconds`` (its drafting and verification)."""
        if kind not in self.tokens:
            raise ValueError(f"kind={kind!r}: expected {DRAFT!r} or {STEP!r}")
        old_t, old_s = self.tokens[kind], self.seconds[kind]
        if old_t is None:
            self.tokens[kind], self.seconds[kind] = float(tokens), float(seconds)
        else:
            self.tokens[kind] = old_t + self.decay * (tokens - old_t)
            self.seconds[kind] = old_s + self.decay * (seconds - old_s)


__all__ = ["Gate", "DRAFT", "STEP"]
