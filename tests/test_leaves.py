"""Bonus leaves: the likeliest bonuses verified as one-token branches beside the drafts
(``leaves=L``, ``d3d.decode.speculative``) — lossless at T = 0 and T > 0, and a hit commits one more token."""

from __future__ import annotations

import pytest
import torch

from d3d.model.cache import KVCache
from d3d.decode.hypotheses import Hypothesis, bonus_leaves
from test_engines import (PROMPTS, V, OracleDrafter, assert_samples_follow_target, generate, random_drafter,
                          reference, tiny_target)
from d3d.decode.config import SpecConfig


def test_bonus_leaves_rank_the_proposed_bonuses():
    """a < n: the draft itself is never a leaf (it is verified); a = n: any top token may be."""
    drafts, conf = [5, 6, 7], [0.5, 0.8, 0.3]
    top_ids = [[5, 9, 2], [6, 1, 3], [4, 7, 8]]
    top_probs = [[0.5, 0.3, 0.1], [0.8, 0.15, 0.05], [0.6, 0.3, 0.1]]
    leaves = bonus_leaves(drafts, conf, top_ids, top_probs, n=2, k=4)
    # scores: (0,9) .3, (0,2) .1, (1,1) .5*.15=.075, (1,3) .025, (2,4) .4*.6=.24, (2,7) .12, (2,8) .04
    assert leaves == [Hypothesis(0, 9, pytest.approx(0.3)), Hypothesis(2, 4, pytest.approx(0.24)),
                      Hypothesis(2, 7, pytest.approx(0.12)), Hypothesis(0, 2, pytest.approx(0.1))]
    assert all(h.bonus != drafts[h.accepted] for h in bonus_leaves(drafts, conf, top_ids, top_probs, n=3, k=9))
    assert bonus_leaves(drafts, conf, top_ids, top_probs, n=0, k=2) == [
        Hypothesis(0, 5, pytest.approx(0.5)), Hypothesis(0, 9, pytest.approx(0.3))]  # nothing verified: d_1 a leaf
    assert bonus_leaves(drafts, conf, top_ids, top_probs, n=2, k=0) == []


def test_append_slot_moves_one_position_in_every_layer():
    target = tiny_target()
    cache = KVCache(target.cfg, rows=2, max_len=16)
    for t in cache.k + cache.v:
        t.copy_(torch.randn_like(t))
    cache.lengths = [9, 3]
    cache.crop(0, 5)
    cache.append_slot(0, 12)
    assert cache.lengths == [6, 3]
    for t in cache.k + cache.v:
        torch.testing.assert_close(t[0, :, 5], t[0, :, 12], rtol=0, atol=0)
    before = [t[1, :, 3].clone() for t in cache.k]
    cache.append_slot(1, 3)  # already in place: nothing moves
    assert cache.lengths == [6, 4] and all(torch.equal(b, t[1, :, 3]) for b, t in zip(before, cache.k))
    for slot in (2, 16):
        with pytest.raises(ValueError, match=f"append_slot\\(row=1, slot={slot}\\)"):
            cache.append_slot(1, slot)


def test_leaf_logits_are_the_branch_logits_and_a_hit_moves_its_cache_entry():
    """Two rows with uneven leaves in one pass: each leaf's logits equal a plain forward over the
    prefix, the anchor, the drafts before its position and the leaf; committing a leaf hit leaves
    the cache as if the branch had been the drafts."""
    from d3d.decode.sequence import Sequence, Tally
    from d3d.decode.speculative import Outcome, Verifier

    target = tiny_target(seed=31)
    prompts = [[3, 7, 1, 4], [5, 9]]
    n, verifier = 3, Verifier(target, target.new_cache(2, 32))
    seqs = [Sequence(p, 20, id=i) for i, p in enumerate(prompts)]
    for i, seq in enumerate(seqs):
        seq.row, seq.tally = i, Tally(block_size=4)
    target(torch.tensor([3, 7, 1, 5]), verifier.tcache.layout([3, 1]), verifier.tcache)  # all but the anchors
    drafts = torch.tensor([[11, 12, 13], [21, 22, 23]])
    leaves = [[Hypothesis(0, 30, 0.5)], [Hypothesis(2, 31, 0.4), Hypothesis(0, 32, 0.3), Hypothesis(3, 33, 0.2)]]
    v = verifier.verification(seqs, drafts.tolist(), leaves=leaves)
    logits = target(v.ids, v.layout, v.cache)

    def plain(seq):  # a fresh forward over the whole sequence: the last position's logits
        return target(torch.tensor([seq]))[0, -1]

    starts = [0, n + 1 + 1]
    for j, (p, row) in enumerate(zip(prompts, leaves)):
        for m, h in enumerate(row):
            branch = p + drafts[j, :h.accepted].tolist() + [h.bonus]
            torch.testing.assert_close(logits[starts[j] + n + 1 + m], plain(branch), rtol=1e-4, atol=1e-4)
        for k in range(n + 1):  # the drafts' rows are untouched by the leaves
            torch.testing.assert_close(logits[starts[j] + k], plain(p + drafts[j, :k].tolist()), rtol=1e-4, atol=1e-4)
    # row 1 accepts d_1, d_2 and the leaf (2, 31): its cache then holds prompt + [21, 22, 31]
    o = Outcome([21, 22, 31], 40, 0)
    verifier.keep(seqs[1], o, n)
    seqs[1].commit(o.accepted + [o.bonus])
    assert verifier.tcache.lengths[1] == 5 and seqs[1].tokens == [5, 9, 21, 22, 31, 40]
    ref = target.new_cache(1, 32)
    target(torch.tensor([5, 9, 21, 22, 31]), ref.layout([5]), ref)
    for mine, theirs in zip(verifier.tcache.k + verifier.tcache.v, ref.k + ref.v):
        torch.testing.assert_close(mine[1, :, :5], theirs[0, :, :5], rtol=1e-4, atol=1e-5)
    assert seqs[1].tally.leaf_hits == 1 and seqs[1].tally.accept_hist[3] == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("block_size", [2, 5])
@pytest.mark.parametrize("min_prob", [0.0, 0.3, 1.0])
def test_greedy_with_leaves_equals_ar(mode, block_size, min_prob):
    """A random drafter is almost never right, but its runners-up sometimes are: leaves raise τ and
    the output stays ar's (min_prob 1.0 verifies no drafts: the leaves are then d_1 and its rivals)."""
    target = tiny_target(seed=21)
    drafter = random_drafter(target, block_size, seed=22)
    ref = reference(target, PROMPTS, 30)
    plain = generate(target, PROMPTS, max_new_tokens=30, stop_ids=[], drafter=drafter,
                     spec=SpecConfig(mode=mode, leaves=0, verify_min_prob=min_prob))
    out = generate(target, PROMPTS, max_new_tokens=30, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode=mode, leaves=6, verify_min_prob=min_prob))
    assert plain.tokens == out.tokens == ref
    s = out.stats
    assert plain.stats.leaf_hits == plain.stats.verified_leaves == 0
    assert s.leaf_hits > 0 and s.tau > plain.stats.tau and s.rounds < plain.stats.rounds
    assert s.verified_leaves == 6 * s.rounds
    assert round(s.tau * s.rounds) >= sum(s.num_generated) - len(PROMPTS)  # leaf hits count as accepted drafts


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_every_unsure_rejection_is_caught_by_a_leaf(mode):
    """An oracle wrong at every 3rd position with the right token as its runner-up: with one leaf
    every rejection is a leaf hit, so every round commits the accepted drafts, the leaf and a bonus."""
    target = tiny_target(seed=5)
    free = reference(target, PROMPTS, 40)
    refs = [p + r for p, r in zip(PROMPTS, reference(target, PROMPTS, 60))]
    rounds = []
    out = generate(target, PROMPTS, max_new_tokens=40, stop_ids=[],
                   drafter=OracleDrafter(refs, 8, V, wrong_every=3), on_round=rounds.append,
                   spec=SpecConfig(mode=mode, block_size=8, leaves=1, verify_min_prob=0.0))
    assert out.tokens == free
    hits = [r for r in rounds if r.leaf is not None]
    assert out.stats.leaf_hits == len(hits) > 0
    for r in rounds:
        a = r.accepted - (r.leaf is not None)
        if a < len(r.draft):  # a rejection: the leaf was the target's token there
            assert r.leaf == 0 and r.committed[:a] == r.draft[:a] and r.committed[a] != r.draft[a]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_leaves_keep_stop_tokens_and_max_new_tokens(mode):
    target = tiny_target(seed=5)
    free = reference(target, PROMPTS, 40)
    stop = free[0][9]
    expected = reference(target, PROMPTS, 40, stops=[stop])
    drafter = random_drafter(target, 4, seed=3)
    out = generate(target, PROMPTS, max_new_tokens=40, stop_ids=[stop], drafter=drafter,
                   spec=SpecConfig(mode=mode, leaves=5))
    assert out.tokens == expected and out.stats.stopped[0]
    out = generate(target, PROMPTS, max_new_tokens=13, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode=mode, leaves=5))
    assert out.tokens == [r[:13] for r in free]


def test_leaves_through_every_async_overlap():
    """The joint packed pass carries the target's reach (the leaves) beside the drafter's blocks."""
    target = tiny_target(seed=6)
    drafter = random_drafter(target, 4, seed=7)
    ref = reference(target, PROMPTS, 40)
    outs = {ov: generate(target, PROMPTS, max_new_tokens=40, stop_ids=[], drafter=drafter,
                         spec=SpecConfig(mode="async", leaves=3, hypotheses=4, fanout=2, overlap=ov))
            for ov in ("packed", "none")}
    assert all(o.tokens == ref for o in outs.values())
    assert len({o.stats.leaf_hits for o in outs.values()}) == 1 and outs["none"].stats.leaf_hits > 0


@pytest.mark.parametrize("matmul", ["panels", "onednn"])
def test_default_leaves_two_for_sync_none_for_async_or_exact(monkeypatch, matmul):
    """Two leaves in sync whatever the dtype and the fp32 matmul (the row price drops those not worth
    their row; docs/results/leaves/validation_fp32_onednn_auto.json); none for async, nor with exact
    where attention is not row-invariant by itself (d3d.kernels.attention_cpu: then leaves are exact
    too). verify_min_prob=0 keeps every leaf verified."""
    from d3d.kernels import attention_cpu

    exact_leaves = 2 if attention_cpu.row_invariant(torch.device("cpu")) else 0
    monkeypatch.setenv("D3D_CPU_MATMUL", matmul)
    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    half = tiny_target(seed=21).to(torch.bfloat16)
    half_drafter = random_drafter(half, 5, seed=22)
    half_drafter.model.to(torch.bfloat16)
    for model, d, mode, exact, per_round in ((target, drafter, "sync", False, 2), (half, half_drafter, "sync", False, 2),
                                             (half, half_drafter, "async", False, 0), (half, half_drafter, "sync", True, exact_leaves)):
        s = generate(model, PROMPTS, max_new_tokens=12, stop_ids=[], drafter=d,
                     spec=SpecConfig(mode=mode, verify_min_prob=0.0, exact=exact)).stats
        assert s.verified_leaves == per_round * s.rounds, (model.dtype, mode, exact)


def test_leaves_arguments_checked(monkeypatch):
    target = tiny_target()
    drafter = random_drafter(target)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"leaves={bad!r}: must be an integer >= 0"):
            generate(target, [1, 2, 3], max_new_tokens=4, drafter=drafter, spec=SpecConfig(mode="sync", leaves=bad))
    with monkeypatch.context() as m:  # where attention is not row-invariant by itself, exact refuses leaves
        m.setattr("d3d.kernels.attention_cpu.row_invariant", lambda device, cfg: False)
        with pytest.raises(ValueError, match="exact=True with leaves=2"):
            generate(target, [1, 2, 3], max_new_tokens=4, drafter=drafter,
                     spec=SpecConfig(mode="sync", leaves=2, exact=True))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sampling_with_leaves_follows_the_target_distribution(mode, monkeypatch):
    """At T > 0 a leaf is accepted only when the target's own sample at its position is the leaf, and
    the token after it is a fresh sample from the leaf's logits: the output keeps the target's
    distribution. Control: acceptance that ignores T must fail the same test."""
    target = tiny_target(seed=11, vocab=6, std=0.5)
    drafter = random_drafter(target, 3, seed=12)
    out = assert_samples_follow_target(target, [1, 2], monkeypatch, mode=mode, drafter=drafter, leaves=3,
                                       verify_min_prob=0.0)
    assert out.stats.leaf_hits > 500


def test_branches_lay_a_causal_run_and_blocks_off_its_prefixes():
    from d3d.model.cache import branches

    g, r, p = branches(10, 3, [(1, 2), (3, 1)])
    assert g == [0, 1, 2, 3, 3, 4]  # the run causal, each branch one group
    assert r == [0, 1, 2, 1, 1, 3]  # a branch sees the cache and the first `seen` tokens of the run
    assert p == [10, 11, 12, 11, 12, 13]  # ... and sits right after them
    assert branches(0, 2, []) == ([0, 1], [0, 1], [0, 1])
