"""Speculative engines: lossless at T = 0 (token for token), distribution-preserving at T > 0."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import d3d.decode.overlap as overlap_mod
import d3d.decode.speculative as speculative
from d3d.model.cache import KVCache
from d3d.model.config import ModelConfig
from d3d.draft.drafter import Block, Drafter, DrafterConfig, Drafts, drafter_model_config
from d3d.decode.config import Sampling, SpecConfig, as_spec
from d3d.decode.engines import generate as _generate
from d3d.decode.engines import generate as library_generate
from d3d.model.transformer import Transformer

V = 48


TEST_DEFAULTS = dict(successor_threshold=0.0, lookup=0, verify_min_prob=0.05, draft_size=64)
KNOBS = {f.name for f in dataclasses.fields(SpecConfig)}


def generate(*args, spec=None, **kw):
    """These tests exercise the full D3D async path: a successor every round unless a test says
    otherwise (the library's CPU default skips unlikely successors, tested separately), and every
    draft from the drafter (copied drafts, sync's default, are tested in test_lookup.py) over a whole block
    (sync's CPU default drafts 4 tokens a pass: test_lookup.py too), and
    drafts cut at a fixed joint probability of 0.05 (the CPU default "auto" measures it as it runs,
    so its rounds depend on timing: test_row_price.py). Parametrized helpers may pass the knobs as
    keywords (``mode="sync", leaves=3``): they are folded into ``spec``."""
    spec = as_spec(spec)
    knobs = {k: kw.pop(k) for k in list(kw) if k in KNOBS}
    spec = spec.replace(**knobs) if knobs else spec
    if spec.mode != "ar":
        spec = spec.replace(**{k: v for k, v in TEST_DEFAULTS.items() if getattr(spec, k) is None})
    return _generate(*args, spec=spec, **kw)


def tiny_target(seed=0, vocab=V, std=0.6):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024)
    model = Transformer(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=std)
    return model.eval().requires_grad_(False)


def random_drafter(target, block_size=4, seed=1, layers=1, steps=1):
    torch.manual_seed(seed)
    dcfg = DrafterConfig(block_size=block_size, mask_token_id=target.cfg.vocab_size - 1,
                         target_vocab=target.cfg.vocab_size, denoise_steps=steps)
    model = Transformer(drafter_model_config(target.cfg, layers, dcfg))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return Drafter(model.eval().requires_grad_(False), dcfg)


class _Lengths:
    """The part of a KV cache the engines use: lengths and crop."""

    def __init__(self, rows):
        self.lengths = [0] * rows

    def crop(self, row, n):
        assert 0 <= n <= self.lengths[row]
        self.lengths[row] = n


class OracleDrafter:
    """Drafts from known reference outputs: always right, or always wrong (``wrong=True``), or wrong
    at every position divisible by ``wrong_every`` — there with confidence 0.5 and the right token as
    its second choice (probability 0.45), as a drafter that is unsure between two tokens."""

    def __init__(self, references, block_size, vocab, wrong=False, wrong_every=0):
        self.refs, self.wrong, self.vocab, self.wrong_every = references, wrong, vocab, wrong_every
        self.dcfg = DrafterConfig(block_size=block_size, mask_token_id=0, target_vocab=vocab)
        self.cfg = ModelConfig(vocab_size=vocab, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                               num_attention_heads=1, num_key_value_heads=1, head_dim=8, max_position_embeddings=4096)
        self.block_size = block_size
        self.history: dict[int, list[int]] = {}

    def new_cache(self, rows, max_len):
        self.cache = _Lengths(rows)
        return self.cache

    def start(self, cache, rows, clean, blocks, size):
        return _OracleJob(rows, clean, blocks, size)

    def finish(self, cache, job, logits, top=0, **_):
        """Each block: the reference tokens from its position on (its lead kept), confidence 1."""
        tokens, conf, alt = [], [], []
        for r, c, row_blocks in zip(job.rows, job.clean, job.blocks):
            hist = self.history.setdefault(r, [])
            del hist[cache.lengths[r]:]
            hist.extend(c)
            cache.lengths[r] += len(c)
            ref = self.refs[r]
            for b in row_blocks:
                first = len(hist) - len(c) + b.seen  # position of the block's first token
                right = [ref[p] if p < len(ref) else 1 for p in range(first, first + job.size)]
                unsure = [self.wrong_every and p % self.wrong_every == 0 for p in range(first, first + job.size)]
                pred = [(t + 1) % self.vocab if self.wrong or u else t for t, u in zip(right, unsure)]
                conf.append([0.5 if u else 1.0 for u in unsure])
                alt.append([t if u else (t + 1) % self.vocab for t, u in zip(right, unsure)])
                if b.lead is not None:
                    pred[0] = b.lead
                tokens.append(pred)
        t, second = torch.tensor(tokens), torch.tensor(alt)
        if not top:
            return Drafts(t, torch.tensor(conf))
        top_ids = torch.stack([t, second] + [(t + 2 + j) % self.vocab for j in range(top - 2)], -1)[..., :top]
        probs = torch.tensor(conf)
        top_probs = torch.stack([probs, torch.where(probs < 1, 0.45, 0.0)] + [torch.zeros_like(probs)] * (top - 2),
                                -1)[..., :top]
        return Drafts(t, probs, top_ids, top_probs)

    def draft_blocks(self, cache, rows, clean, blocks, size, top=0, **_):
        return self.finish(cache, self.start(cache, rows, clean, blocks, size), None, top)


class _OracleJob:
    def __init__(self, rows, clean, blocks, size):
        self.rows, self.clean, self.blocks, self.size = rows, clean, blocks, size

    def forward(self):
        return None


PROMPTS = [[3, 7, 1], [5], [2, 9, 11, 4, 8, 1, 1, 6], [10, 12]]


def reference(target, prompts, n, stops=()):
    return generate(target, prompts, max_new_tokens=n, stop_ids=list(stops)).tokens


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", ["random", "right", "wrong"])
@pytest.mark.parametrize("block_size", [2, 4, 7])
def test_greedy_equals_ar(mode, kind, block_size):
    target = tiny_target()
    ref = reference(target, PROMPTS, 30)
    if kind == "random":
        drafter = random_drafter(target, block_size)
    else:  # the oracle knows the continuation past the end too, so its last guesses are right as well
        longer = reference(target, PROMPTS, 30 + 2 * block_size)
        drafter = OracleDrafter([p + r for p, r in zip(PROMPTS, longer)], block_size, V, wrong=kind == "wrong")
    out = generate(target, PROMPTS, max_new_tokens=30, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode=mode, block_size=block_size))
    assert out.tokens == ref
    s = out.stats
    if kind == "right":
        assert s.accept_hist[block_size - 1] == s.rounds  # every round accepts everything
        if mode == "async":
            assert s.successor_hits == s.rounds and s.fallbacks == 0
    if kind == "wrong":
        assert s.accept_hist[0] == s.rounds and s.tau == 1.0
        if mode == "async":
            assert s.successor_hits == 0 and s.fallbacks == s.rounds


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_drafter_catches_up_on_a_window_of_the_context(mode, monkeypatch):
    """A drafter pass catches up on at most DRAFT_WINDOW committed tokens: a long prompt, or a long run of
    plain steps, starts the drafter's cache afresh that far before the anchor. Output stays ar's."""
    import d3d.decode.row_price as row_price

    monkeypatch.setattr(speculative, "DRAFT_WINDOW", 6)
    target = tiny_target()
    drafter = random_drafter(target, 4)
    prompts = [[(7 * i + 3) % (V - 1) for i in range(23)], [5, 9], [(5 * i + 1) % (V - 1) for i in range(14)]]
    ref = reference(target, prompts, 40)
    fed, calls = [], [0]
    start = Drafter.start

    def spy(self, cache, rows, clean, blocks, size):
        fed.extend(len(c) for c in clean)
        return start(self, cache, rows, clean, blocks, size)

    def steps_for_a_while(self, price, rows):  # rounds 3-14 take plain steps: the drafter falls 12 tokens behind
        calls[0] += 1
        return not 3 <= calls[0] <= 14

    monkeypatch.setattr(Drafter, "start", spy)
    monkeypatch.setattr(row_price.Fixed, "drafts", steps_for_a_while)
    out = generate(target, prompts, max_new_tokens=40, mode=mode, drafter=drafter, block_size=4)
    assert out.tokens == ref
    drafts = 0 if mode == "sync" else 3  # async's clean run takes the anchor and the drafts too
    assert fed and max(fed) <= 6 + 1 + drafts, fed
    assert max(fed) >= 6  # the window was reached, not skipped


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("min_prob", [0.05, 0.3, 1.0])
def test_verifying_only_likely_drafts_keeps_greedy_output(mode, min_prob):
    """verify_min_prob: the target verifies only the drafts the drafter believes in (the longest
    such run over the batch) — fewer verified rows, the same output; 1.0 verifies none (AR steps);
    the CPU default measures the threshold as it runs ("auto", ``d3d.decode.config.defaults``)."""
    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    full = generate(target, PROMPTS, max_new_tokens=30, stop_ids=[], drafter=drafter,
                    spec=SpecConfig(mode=mode, verify_min_prob=0))
    out = generate(target, PROMPTS, max_new_tokens=30, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode=mode, leaves=0, verify_min_prob=min_prob))  # leaves would lift τ above 1 at min_prob 1.0
    assert out.tokens == full.tokens == reference(target, PROMPTS, 30)
    per_round = out.stats.verified_drafts / out.stats.rounds
    assert full.stats.verified_drafts == 4 * full.stats.rounds and per_round < 4
    if min_prob == 1.0:
        assert out.stats.verified_drafts == 0 and out.stats.tau == 1.0
    default = library_generate(target, PROMPTS, max_new_tokens=30, stop_ids=[], drafter=drafter,
                               on_round=(seen := []).append, spec=SpecConfig(mode=mode, lookup=0))
    from d3d.decode.row_price import PricedCut, RowPrice

    n, p = len(PROMPTS), RowPrice().prior_at(max(map(len, PROMPTS)) + 1)  # auto: the prior at the context, scaled
    assert default.tokens == full.tokens and seen[0].min_prob == pytest.approx(n * p / (1 - p + n * p))  # to the batch

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    resolve = lambda device, **kw: SpecConfig(mode, **kw).resolve(device)  # noqa: E731
    assert resolve(cpu).verify_min_prob == PricedCut(gate=mode == "sync")  # auto: measured as it runs
    # leaves: two in sync on every device (the row price drops those not worth their row), none in async
    assert resolve(cpu).leaves == resolve(cuda).leaves == (2 if mode == "sync" else 0)
    assert resolve(cpu, leaves=3).leaves == 3
    assert default.stats.verified_leaves <= resolve(cpu).leaves * default.stats.rounds
    with pytest.raises(ValueError, match="verify_min_prob=1.5"):
        generate(target, PROMPTS, max_new_tokens=3, drafter=drafter,
                 spec=SpecConfig(mode=mode, verify_min_prob=1.5))


def test_likely_length_is_the_run_believed_in_jointly():
    from d3d.decode.speculative import Draft

    d = Draft([5, 6, 7, 8], [0.9, 0.5, 0.9, 0.1], [[5], [6], [7], [8]], [[0.9], [0.5], [0.9], [0.1]])
    assert [d.likely_length(p) for p in (0.0, 0.9, 0.45, 0.4, 0.04, 0.95)] == [4, 1, 2, 3, 4, 0]
    assert d.truncated(2).tokens == [5, 6] and d.truncated(2).top_probs == [[0.9], [0.5]]


def test_each_row_verifies_the_run_its_drafter_believes_in():
    from d3d.decode.speculative import Draft, verify_widths

    drafted = Draft([5, 6, 7, 8], [0.9, 0.5, 0.9, 0.1], [], [])  # joint 0.9, 0.45, 0.405, 0.04
    unsure = Draft([5, 6, 7, 8], [0.3, 0.9, 0.9, 0.9], [], [])  # joint 0.3, 0.27, ...
    copied = Draft([1, 2], [1.0, 1.0], [], [])  # a short copied chain
    assert verify_widths([drafted, unsure], 0.0) == [4, 4]
    assert verify_widths([drafted, unsure], 0.4) == [3, 0]  # 0: no draft worth a row, a plain step
    assert verify_widths([drafted, copied], 0.0) == [4, 2]
    assert verify_widths([drafted, copied], 0.95) == [0, 2]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_batch_one_each_prompt_alone(mode):
    target = tiny_target(seed=3)
    drafter = random_drafter(target, 5, seed=4)
    for p in PROMPTS:
        assert generate(target, p, max_new_tokens=23, stop_ids=[], drafter=drafter, spec=mode).tokens == \
            reference(target, [p], 23)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_stop_tokens_and_max_new_tokens_inside_a_block(mode):
    target = tiny_target(seed=5)
    free = reference(target, PROMPTS, 40)
    refs = [p + r for p, r in zip(PROMPTS, free)]
    stop = free[0][9]  # a token the first sequence emits mid-stream
    expected = reference(target, PROMPTS, 40, stops=[stop])
    assert expected[0][-1] == stop and len(expected[0]) == free[0].index(stop) + 1
    for block_size in (4, 16):
        oracle = OracleDrafter(refs, block_size, V)  # stops fall inside fully accepted blocks
        out = generate(target, PROMPTS, max_new_tokens=40, stop_ids=[stop], drafter=oracle,
                       spec=SpecConfig(mode=mode, block_size=block_size))
        assert out.tokens == expected
        assert out.stats.stopped[0]
        # max_new_tokens that is not a multiple of the block: cut exactly
        out = generate(target, PROMPTS, max_new_tokens=13, stop_ids=[], drafter=OracleDrafter(refs, block_size, V),
                       spec=SpecConfig(mode=mode, block_size=block_size))
        assert out.tokens == [r[:13] for r in free]


def test_a_sequence_keeps_its_own_tokens_limits_and_counts():
    """``Sequence.commit`` cuts at the first stop token or at max_new; ``generate``'s statistics are its
    sequences' figures summed (``GenerationStats.add``)."""
    from d3d.decode.sequence import Sequence

    seq = Sequence([1, 2], 5, stop_ids={9})
    assert seq.commit([3, 4]) == [3, 4] and not seq.done
    assert seq.commit([5, 9, 6]) == [5, 9] and seq.stopped and seq.done and seq.output == [3, 4, 5, 9]
    assert seq.tokens == [1, 2, 3, 4, 5, 9] and seq.output_since(3) == [9]
    capped = Sequence([1], 3)
    assert capped.commit([4, 5, 6, 7]) == [4, 5, 6] and capped.done and not capped.stopped
    target = tiny_target(seed=5)
    out = generate(target, PROMPTS, max_new_tokens=12, stop_ids=[], drafter=random_drafter(target, 4, seed=6),
                   spec=SpecConfig("sync", lookup=0, verify_min_prob=0))
    s = out.stats
    assert s.num_generated == [12] * len(PROMPTS) and s.num_prompt_tokens == [len(p) for p in PROMPTS]
    assert sum(s.accept_hist) == s.rounds and s.verified_drafts == 3 * s.rounds  # B = 4: 3 drafts a round


@pytest.mark.parametrize("hypotheses", [1, 4])
def test_async_overlap_strategies_agree_and_explain_rounds(hypotheses):
    """Every overlap runs the same rounds (with 4 hypotheses: sibling blocks through the joint packed
    pass and the serial pass alike) and the output is ar's."""
    target = tiny_target(seed=6)
    drafter = random_drafter(target, 4, seed=7)
    rounds = []
    outs = {ov: generate(target, PROMPTS, max_new_tokens=40, stop_ids=[], drafter=drafter,
                         on_round=rounds.append if ov == "none" else None,
                         spec=SpecConfig(mode="async", hypotheses=hypotheses, fanout=2, overlap=ov))
            for ov in ("packed", "none")}
    assert outs["packed"].tokens == outs["none"].tokens == reference(target, PROMPTS, 40)
    assert outs["packed"].stats.accept_hist == outs["none"].stats.accept_hist
    hits = [o.stats.successor_hits for o in outs.values()]
    assert hits[0] == hits[1] and (hypotheses == 1 or hits[0] > 0)
    assert rounds and all(r.draft_span is not None for r in rounds)
    assert sum(len(r.committed) for r in rounds) >= sum(outs["none"].stats.num_generated) - len(PROMPTS)


@pytest.mark.parametrize("overlap", ["packed", "none", "none/8x3"])
def test_no_memory_growth_over_many_rounds(monkeypatch, overlap):
    """Caches are allocated once per generation and never reallocated or grown."""
    seen = {}
    layout = KVCache.layout

    def recording_layout(self, *a, **kw):  # the storage in use at the first pass of each cache
        seen.setdefault(id(self), (self, [t.data_ptr() for t in self.k + self.v], [t.shape for t in self.k]))
        return layout(self, *a, **kw)

    monkeypatch.setattr(KVCache, "layout", recording_layout)
    target = tiny_target(seed=8)
    drafter = random_drafter(target, 4, seed=9)
    overlap, _, kf = overlap.partition("/")
    kw = dict(hypotheses=8, fanout=3) if kf else {}
    out = generate(target, [1, 2, 3], max_new_tokens=400, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode="async", overlap=overlap), **kw)
    assert out.stats.rounds > 100 and out.stats.successor_passes > 100
    assert len(seen) == 2  # one target cache, one drafter cache
    for cache, ptrs, shapes in seen.values():
        assert [t.data_ptr() for t in cache.k + cache.v] == ptrs
        assert [t.shape for t in cache.k] == shapes
        assert max(cache.lengths) <= cache.max_len


def test_successor_threshold_gates_the_successor_pass():
    target = tiny_target(seed=15)
    drafter = random_drafter(target, 4, seed=16)
    ref = reference(target, PROMPTS, 24)
    always = generate(target, PROMPTS, max_new_tokens=24, stop_ids=[], drafter=drafter, spec="async")
    seen = []
    generate(target, PROMPTS, max_new_tokens=24, stop_ids=[], drafter=drafter, on_round=seen.append, spec="async")
    total = lambda r: sum(h.score for h in r.hypotheses)  # noqa: E731  (estimated hit probability)
    threshold = sorted(total(r) for r in seen)[len(seen) // 2]  # a gate that must both pass and skip rows
    rounds = []
    gated = generate(target, PROMPTS, max_new_tokens=24, stop_ids=[], drafter=drafter, on_round=rounds.append,
                     spec=SpecConfig(mode="async", successor_threshold=threshold))
    drafted = [r.draft_span is not None for r in rounds]
    assert gated.tokens == ref and 0 < sum(drafted) < len(drafted)
    assert drafted == [total(r) >= threshold for r in rounds]  # exactly the promising rows get hypotheses
    assert gated.stats.successor_passes == sum(drafted)
    never = generate(target, PROMPTS, max_new_tokens=24, stop_ids=[], drafter=drafter,
                     spec=SpecConfig(mode="async", successor_threshold=1.01))
    assert always.tokens == never.tokens == ref
    assert always.stats.successor_passes == always.stats.rounds
    assert never.stats.successor_passes == 0 and never.stats.successor_hits == 0


def test_drafter_required_and_checked():
    target = tiny_target()
    with pytest.raises(ValueError, match="needs a drafter"):
        generate(target, [1, 2], spec="sync")
    other = tiny_target(vocab=V + 1)
    with pytest.raises(ValueError, match="vocab_size"):
        generate(target, [1, 2], drafter=random_drafter(other), spec="sync")
    with pytest.raises(ValueError, match="block_size"):
        generate(target, [1, 2], drafter=random_drafter(target), spec=SpecConfig(mode="sync", block_size=1))


# ------------------------------------------------------------------ T > 0: distribution test


def chi2_threshold(dof: int, z: float = 3.09) -> float:
    """Wilson–Hilferty approximation of the chi-square quantile (z = 3.09: p ≈ 0.001)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def exact_marginals(target, prompt, vocab):
    """P(x2) and P(x3) of the target at T = 1 after ``prompt``, by enumeration."""
    with torch.no_grad():
        p1 = target(torch.tensor([prompt])).softmax(-1)[0, -1]
        seqs = torch.tensor([prompt + [a, b] for a in range(vocab) for b in range(vocab)])
        logits = target(seqs).softmax(-1)
        p2_given = logits[::vocab, len(prompt)]  # [a] -> P(x2 | a)
        p3_given = logits[:, len(prompt) + 1].view(vocab, vocab, vocab)  # [a, b] -> P(x3 | a, b)
    joint12 = p1[:, None] * p2_given
    p2 = joint12.sum(0)
    p3 = (joint12[:, :, None] * p3_given).sum((0, 1))
    return p2.double(), p3.double()


def chi2(samples: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs * samples.numel()
    keep = expected >= 5  # pool rare cells
    stat = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    rest_c, rest_e = counts[~keep].sum(), expected[~keep].sum()
    if rest_e > 0:
        stat = stat + (rest_c - rest_e) ** 2 / rest_e
    return float(stat), int(keep.sum()) + (1 if rest_e > 0 else 0) - 1


def assert_samples_follow_target(target, prompt, monkeypatch, n=4000, **kw):
    """``n`` samples of 3 tokens at T = 1 with ``generate(**kw)``: tokens 2 and 3 must pass a chi-square
    test against the target's exact marginals, and the same generation with verification that ignores
    T (accepts a draft iff it is the target's argmax: the negative control) must fail it. Returns the
    unbiased output (for its statistics)."""
    p2, p3 = exact_marginals(target, prompt, target.cfg.vocab_size)
    out = generate(target, [prompt] * n, max_new_tokens=3, stop_ids=[], sampling=Sampling(temperature=1.0, seed=5),
                   **kw)
    toks = torch.tensor(out.tokens)
    for col, probs in ((1, p2), (2, p3)):
        stat, dof = chi2(toks[:, col], probs)
        assert stat < chi2_threshold(dof), f"token {col + 1}: chi2 {stat:.1f} with {dof} dof"
    with monkeypatch.context() as m:
        real_accept = speculative.accept
        m.setattr(speculative, "accept", lambda d, lg, temperature=0.0, seed=0: real_accept(d, lg, temperature=0.0))
        biased = torch.tensor(generate(target, [prompt] * n, max_new_tokens=3, stop_ids=[],
                                       sampling=Sampling(temperature=1.0, seed=5), **kw).tokens)
    stat, dof = chi2(biased[:, 1], p2)
    assert stat > chi2_threshold(dof), f"biased control passed: chi2 {stat:.1f} with {dof} dof"
    return out


@pytest.mark.parametrize("mode", ["sync", "async", "async/4x2", "sync/likely"])
def test_sampling_follows_the_target_distribution(mode, monkeypatch):
    """At T > 0 the output follows the target's distribution; async/4x2 drafts 4 outcome
    hypotheses (2 bonus candidates per accept length), and a hit is used only when it matches the
    *sampled* bonus; sync/likely verifies only the drafts the drafter believes in (verify_min_prob)."""
    target = tiny_target(seed=11, vocab=6, std=0.5)
    drafter = random_drafter(target, 3, seed=12)
    mode, _, hyps = mode.partition("/")
    kw = dict(hypotheses=4, fanout=2) if hyps == "4x2" else dict(verify_min_prob=0.3) if hyps else {}
    out = assert_samples_follow_target(target, [1, 2], monkeypatch, mode=mode, drafter=drafter, **kw)
    if hyps == "4x2":
        assert out.stats.successor_hits > 100  # hypotheses were used for some of the third tokens
    if hyps == "likely":  # some rounds verified fewer than the block's 2 drafts, some all
        assert 0.5 * out.stats.rounds < out.stats.verified_drafts < 2 * out.stats.rounds


@pytest.mark.parametrize("layers", [1, 2])
def test_packed_pass_equals_separate_passes(layers):
    """One joint pass of target and drafter gives the logits of two separate passes."""
    from d3d.decode.packed import PackedPair

    target = tiny_target(seed=13)
    drafter = random_drafter(target, 4, seed=14, layers=layers)
    pair = PackedPair(target, drafter.model)
    tcache, dcache = pair.new_caches(2, 2, 64)
    ref_t, ref_d = target.new_cache(2, 64), drafter.new_cache(2, 64)
    for caches in ((tcache, dcache), (ref_t, ref_d)):  # same prefixes in both
        target(torch.tensor([1, 2, 3, 4, 5, 6]), caches[0].layout([4, 2]), caches[0])
        drafter.model(torch.tensor([7, 8, 9]), caches[1].layout([1, 2]), caches[1])
    t_ids = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12])
    blocks = [[Block(2), Block(1, 7)], [Block(1)]]  # sibling blocks too (reach through the joint pass)
    job = drafter.start(dcache, [0, 1], [[3, 4], [5]], blocks, 4)
    job_ref = drafter.start(ref_d, [0, 1], [[3, 4], [5]], blocks, 4)
    t_logits, d_logits = pair.forward(t_ids, tcache.layout([4, 4]), tcache, job.ids, job.layout, dcache, job.index)
    ref_tl = target(t_ids, ref_t.layout([4, 4]), ref_t)
    ref_dl = drafter.model(job_ref.ids, job_ref.layout, ref_d, logits_index=job_ref.index)
    torch.testing.assert_close(t_logits, ref_tl, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(d_logits, ref_dl, atol=1e-5, rtol=1e-5)
    assert tcache.lengths == ref_t.lengths and dcache.lengths == ref_d.lengths


def test_exact_rejects_the_packed_overlap(monkeypatch):
    """Where attention is not row-invariant by itself (no d3d.kernels.attention_cpu)."""
    monkeypatch.setattr("d3d.kernels.attention_cpu.row_invariant", lambda device, cfg: False)
    target = tiny_target()
    drafter = random_drafter(target)
    with pytest.raises(ValueError, match="exact=True needs"):
        generate(target, [1, 2, 3], max_new_tokens=4, drafter=drafter,
                 spec=SpecConfig(mode="async", overlap="packed", exact=True))


@pytest.mark.parametrize("mode,kw", [("sync", {}), ("sync", dict(leaves=4)), ("async", {}),
                                     ("async", dict(overlap="packed", hypotheses=4, fanout=2))])
def test_bf16_defaults_equal_ar_without_asking_for_exact(mode, kw):
    """On a CPU the decoding attention computes every row alone (d3d.kernels.attention_cpu), so in bf16 the
    defaults, leaves, hypothesis blocks and the packed pass round as ar's steps do: equal token for token
    on near-tie weights, with no exact=True and no one-row-at-a-time attention."""
    from d3d.kernels import attention_cpu

    if not attention_cpu.row_invariant(torch.device("cpu")):
        pytest.skip(f"CPU attention kernel unavailable: {attention_cpu.why_unavailable()}")
    target = tiny_target().to(torch.bfloat16).pack_for_cpu()
    drafter = random_drafter(target)
    drafter.model.to(torch.bfloat16).pack_for_cpu()
    prompts = [[1, 2, 3, 4, 5], [7, 7, 7], [9, 3, 5, 1, 2, 8, 8]]
    ar = generate(target, prompts, max_new_tokens=40, stop_ids=[])
    out = generate(target, prompts, max_new_tokens=40, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode=mode, verify_min_prob=0.0, **kw))
    assert out.tokens == ar.tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_exact_greedy_equals_ar_in_every_dtype(dtype, mode):
    """exact=True verifies with row-invariant attention: with prepacked weights (row-invariant
    matmuls) a 4-token verification rounds exactly like 4 AR steps, so even bf16 outputs agree.
    Random weights (std 0.6) make the logits full of near-ties, which is what this must survive."""
    target = tiny_target().to(dtype).pack_for_cpu()
    drafter = random_drafter(target)
    drafter.model.to(dtype).pack_for_cpu()
    prompts = [[1, 2, 3, 4, 5], [7, 7, 7], [9, 3, 5, 1, 2, 8, 8]]
    ar = generate(target, prompts, max_new_tokens=40, stop_ids=[])
    out = generate(target, prompts, max_new_tokens=40, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode=mode, exact=True))
    assert out.tokens == ar.tokens


def test_stream_overlap_reads_nothing_back_before_verification_is_queued(monkeypatch):
    """overlap="stream": between starting the successor pass on the side stream and launching the
    verification, nothing may be read back to the host (tolist, item, int, bool, float on a
    tensor): on a GPU that read would wait for the successor and serialise the two passes. A CPU
    test double stands in for the CUDA stream; the models' own forwards are not counted (on CUDA
    they run Triton kernels that read nothing back; the CPU torch path does)."""
    import contextlib

    events, counting = [], [True]

    class FakeSideStream:
        def __init__(self, device):
            pass

        def follow(self):
            events.append("successor")

        def active(self):
            return contextlib.nullcontext()

        def join(self):
            events.append("join")

    monkeypatch.setattr(overlap_mod, "SideStream", FakeSideStream)

    def spy(orig):
        def read_back(self, *a, **kw):
            if counting[0]:
                events.append("read-back")
            return orig(self, *a, **kw)
        return read_back

    for name in ("tolist", "item", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, spy(getattr(torch.Tensor, name)))

    def quiet(forward, label=None):
        def run(*a, **kw):
            if label:
                events.append(label)
            counting[0] = False
            try:
                return forward(*a, **kw)
            finally:
                counting[0] = True
        return run

    target = tiny_target(seed=21)
    drafter = random_drafter(target, 4, seed=22)
    monkeypatch.setattr(target, "forward", quiet(target.forward, "verify"))
    monkeypatch.setattr(drafter.model, "forward", quiet(drafter.model.forward))
    ref = reference(target, PROMPTS, 16)
    out = generate(target, PROMPTS, max_new_tokens=16, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode="async", overlap="stream"))
    assert out.tokens == ref and out.stats.successor_passes > 0
    starts = [i for i, e in enumerate(events) if e == "successor"]
    assert len(starts) == out.stats.target_forwards - 1  # every verification had a successor beside it
    for i in starts:
        launch = events.index("verify", i)
        assert "read-back" not in events[i:launch], events[i:launch]


@pytest.mark.parametrize("hypotheses", [2, 4])
def test_hypotheses_catch_rejections(hypotheses):
    """A drafter unsure at every 5th position (right token second): hypothesis (a = that position,
    bonus = its second choice) is drafted beside verification and matches; the output is ar's."""
    target = tiny_target(seed=23)
    block = 7
    longer = reference(target, PROMPTS, 40 + 2 * block)
    oracle = OracleDrafter([p + r for p, r in zip(PROMPTS, longer)], block, V, wrong_every=5)
    rounds = []
    out = generate(target, PROMPTS, max_new_tokens=40, stop_ids=[], drafter=oracle, on_round=rounds.append,
                   spec=SpecConfig(mode="async", block_size=block, hypotheses=hypotheses, fanout=1))
    assert out.tokens == reference(target, PROMPTS, 40)
    s = out.stats
    early = sum(s.hits_by_accept[:block - 1])  # hits of outcomes with a rejected draft
    assert early > 0 and s.successor_hits >= 0.6 * s.rounds
    assert s.hypotheses == sum(len(r.hypotheses) for r in rounds if r.draft_span is not None)
    for r in rounds:  # a hit is the hypothesis with the outcome's (accepted, bonus)
        if r.hit is not None:
            h = r.hypotheses[r.hit]
            assert h.accepted == r.accepted and h.bonus in (None, r.bonus)
    used = sum(r.successor_used for r in rounds)  # a hit is the next round's draft (unless the sequence ended)
    assert s.successor_hits - len(PROMPTS) <= used <= s.successor_hits


def test_async_rounds_equal_sync_rounds():
    """With branching hypotheses (K=8, F=3) async drafts exactly what sync drafts, round by round: a
    hypothesis block sees the same tokens at the same positions as the synchronous draft it saves."""
    target = tiny_target(seed=25)
    drafter = random_drafter(target, 4, seed=26)
    sync_rounds, async_rounds = [], []
    ref = reference(target, PROMPTS, 60)
    sync = generate(target, PROMPTS, max_new_tokens=60, stop_ids=[], drafter=drafter, on_round=sync_rounds.append,
                    spec=SpecConfig(mode="sync", leaves=0))  # async's default: no leaves
    out = generate(target, PROMPTS, max_new_tokens=60, stop_ids=[], drafter=drafter, on_round=async_rounds.append,
                   spec=SpecConfig(mode="async", hypotheses=8, fanout=3))
    assert sync.tokens == out.tokens == ref
    key = lambda r: (r.seq, r.draft, r.accepted, r.bonus)  # noqa: E731
    assert sorted(map(key, sync_rounds)) == sorted(map(key, async_rounds))
    s = out.stats
    assert sum(s.hits_by_accept[:3]) > 0  # some hits came from outcomes with a rejected draft
    assert sum(r.successor_used for r in async_rounds) > 0
