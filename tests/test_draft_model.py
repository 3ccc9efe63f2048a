"""A smaller model as a draft source (``d3d.decode.draft_model``): its chains against a loop oracle, lossless
engines, named errors."""

from __future__ import annotations

import pytest
import torch

from d3d.decode.config import SpecConfig
from d3d.decode import draft_model
from d3d.decode.draft_model import EXPECT, START_ROUNDS, START_TAU, ModelChain, chain_head, chain_vocabulary
from d3d.decode.row_price import RowPrice
from d3d.decode.sequence import Sequence
from test_engines import assert_samples_follow_target, generate, random_drafter, reference, tiny_target

PROMPTS = [[3, 7, 1], [5, 5, 5, 2], [2, 9, 11, 4, 8], [10, 12]]


def greedy_chain(model, tokens, n, vocab=None):
    """The oracle: n greedy tokens of ``model`` after ``tokens``, each from a fresh pass over everything (no cache),
    the argmax over ``vocab``'s ids only where given, with its softmax probability over them."""
    out, probs = [], []
    for _ in range(n):
        logits = model(torch.tensor([tokens + out]))[0, -1].double()
        if vocab is not None:
            logits = logits[vocab]
        p = torch.softmax(logits, -1)
        best = int(p.argmax())
        out.append(best if vocab is None else int(vocab[best]))
        probs.append(float(p[best]))
    return out, probs


def seq_at(tokens, row=0, rounds=START_ROUNDS, tau=1.0):
    """A sequence in ``row`` whose ``rounds`` rounds committed ``tau`` tokens each (by default: the chain starts)."""
    s = Sequence(list(tokens), 100)
    s.row, s.tally.rounds, s.tally.accept_hist = row, rounds, [0] * 16
    s.tally.accept_hist[round(tau) - 1] = rounds
    return s


@pytest.fixture
def from_the_first_round(monkeypatch):
    """Chains start at admission (engine tests that count the chain's drafts)."""
    monkeypatch.setattr(draft_model, "START_ROUNDS", 0)
    monkeypatch.setattr(draft_model, "START_TAU", float("inf"))


def test_a_sequences_chain_starts_where_its_rounds_commit_little_and_stays():
    chain = ModelChain(tiny_target(seed=5), rows=2, max_len=64, price=RowPrice())
    tokens = [3, 7, 1]
    assert chain.propose(seq_at(tokens, rounds=START_ROUNDS - 1), 15) is None  # too early to tell
    assert chain.propose(seq_at(tokens, tau=START_TAU + 1), 15) is None  # the rounds commit enough without it
    assert chain.cache.lengths[0] == 0  # nothing fed
    assert chain.propose(seq_at(tokens, tau=1), 15).tokens  # starts: the whole sequence fed in one pass
    assert chain.cached[0][:3] == tokens
    assert chain.propose(seq_at(tokens, tau=START_TAU + 1), 15).tokens  # started: it stays
    assert chain.propose(seq_at(tokens, row=1, tau=START_TAU + 1), 15) is None  # per row
    chain.admit([seq_at(tokens, row=0)])  # a new sequence in row 0 starts without it
    assert chain.propose(seq_at(tokens, tau=START_TAU + 1), 15) is None


@pytest.mark.parametrize("vocab", [None, "half"])
def test_the_chain_is_the_small_models_greedy_run_whatever_its_cache_held(vocab):
    small = tiny_target(seed=5)
    ids = None if vocab is None else torch.arange(0, small.cfg.vocab_size, 2)
    chain = ModelChain(small, rows=2, max_len=64, price=RowPrice(), vocab=ids, longest=5)
    chain.min_prob = lambda: 0.0  # every step taken: the whole chain
    history = [[3, 7, 1], [3, 7, 1, 4], [3, 7, 2, 2, 9], [3, 7, 2, 2, 9, 9, 9, 1], [1]]  # grows, parts, restarts
    for tokens in history:
        d = chain.propose(seq_at(tokens, row=1), max_len=15)
        want, probs = greedy_chain(small, tokens, 5, ids)
        assert d.tokens == want and d.confidence == pytest.approx(probs, rel=1e-4)
        assert chain.cached[1] == tokens + want[:-1] and chain.cache.lengths[1] == len(tokens) + 4
    assert chain.cache.lengths[0] == 0  # the other row untouched


@pytest.mark.parametrize("vocab", [None, "half"])
def test_each_drafts_runners_up_are_the_small_models_next_likeliest_tokens(vocab):
    """What leaves are made of: per position the ``top`` likeliest tokens (the draft first) and their softmax
    probabilities over the chain's ids, from the loop oracle's pass over the whole sequence."""
    small = tiny_target(seed=5)
    ids = None if vocab is None else torch.arange(0, small.cfg.vocab_size, 2)
    chain = ModelChain(small, rows=1, max_len=64, price=RowPrice(), vocab=ids, longest=4, top=3)
    chain.min_prob = lambda: 0.0
    tokens = [3, 7, 1]
    d = chain.propose(seq_at(tokens), max_len=15)
    assert len(d.top_ids) == len(d.top_probs) == len(d.tokens) == 4
    for k, (top, probs) in enumerate(zip(d.top_ids, d.top_probs)):
        logits = small(torch.tensor([tokens + d.tokens[:k]]))[0, -1].double()
        p = torch.softmax(logits if ids is None else logits[ids], -1)
        want_p, want = p.topk(3)
        assert top[0] == d.tokens[k] and probs[0] == d.confidence[k]
        assert top == (want if ids is None else ids[want]).tolist()
        assert probs == pytest.approx(want_p.tolist(), rel=1e-4)


def test_the_chain_stops_where_its_joint_probability_falls_below_the_cut():
    small = tiny_target(seed=5)
    chain = ModelChain(small, rows=1, max_len=64, price=RowPrice(), longest=15)
    tokens = [3, 7, 1]
    want, probs = greedy_chain(small, tokens, 15)
    for cut in (0.0, 0.05, 0.3, 0.9, 2.0):
        chain.min_prob = lambda cut=cut: cut
        d = chain.propose(seq_at(tokens), max_len=15)
        n, joint = 1, probs[0]  # the first token always; another while the joint times EXPECT reaches the cut
        while n < 15 and joint * EXPECT >= cut:
            joint *= probs[n]
            n += 1
        assert d.tokens == want[:n]


def test_a_models_chain_head_is_made_once_for_its_rows():
    small = tiny_target(seed=5)
    evens, odds = torch.arange(0, small.cfg.vocab_size, 2), torch.arange(1, small.cfg.vocab_size, 2)
    a = ModelChain(small, rows=1, max_len=64, price=RowPrice(), vocab=evens)
    assert a.head is ModelChain(small, rows=1, max_len=64, price=RowPrice(), vocab=evens.clone()).head
    assert chain_head(small, odds) is not a.head  # other rows: a head of its own ...
    torch.testing.assert_close(chain_head(small, odds).weight, small.output_weight()[odds])  # ... over them


def test_chain_vocabulary_holds_the_low_ids_the_special_ones_and_the_drafters():
    ids = chain_vocabulary(40000, torch.tensor([39000, 5, 33000]), special_from=39990)
    assert ids.tolist() == sorted(set(range(32768)) | set(range(39990, 40000)) | {39000, 33000})
    assert chain_vocabulary(100).tolist() == list(range(100))


@pytest.mark.parametrize("same", [True, False])
def test_greedy_with_a_draft_model_equals_ar(same, from_the_first_round):
    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    small = target if same else tiny_target(seed=23)
    ref = reference(target, PROMPTS, 40)
    for p, r in zip(PROMPTS, ref):  # one sequence a round: the chain drafts
        out = generate(target, p, max_new_tokens=40, stop_ids=[], drafter=drafter,
                       spec=SpecConfig(mode="sync", lookup=0, draft_model=small))
        assert out.tokens == [r] and out.stats.model_drafts > 0
        if same:  # the target drafting for itself: every draft accepted
            assert out.stats.tau >= 2 and out.stats.accept_hist[0] == 0
    batch = generate(target, PROMPTS, max_new_tokens=40, stop_ids=[], drafter=drafter,
                     spec=SpecConfig(mode="sync", lookup=0, draft_model=small))
    assert batch.tokens == ref and batch.stats.model_drafts == 0  # a batch: the drafter drafts


def test_the_chains_runners_up_are_verified_as_leaves_and_hit(from_the_first_round):
    """With the spec's ``leaves`` a chain's runners-up go to verification as the drafter's do, some hit, and the
    output stays ar's; without, none is verified."""
    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    small = tiny_target(seed=23)
    ref = reference(target, PROMPTS, 40)

    def run(leaves):
        outs = [generate(target, p, max_new_tokens=40, stop_ids=[], drafter=drafter,
                         spec=SpecConfig(mode="sync", lookup=0, draft_model=small, verify_min_prob=0.0, leaves=leaves))
                for p in PROMPTS]
        assert [o.tokens[0] for o in outs] == ref
        assert all(o.stats.model_drafts == o.stats.rounds for o in outs)  # every round the chain's
        return sum(o.stats.verified_leaves for o in outs), sum(o.stats.leaf_hits for o in outs)

    verified, hits = run(2)
    assert verified > 0 and hits > 0
    assert run(0) == (0, 0)


def test_sampling_with_a_draft_model_follows_the_target_distribution(monkeypatch, from_the_first_round):
    """The chain's tokens are deterministic drafts: accepted with the target's probability, so sampled outputs
    keep the target's distribution (control: acceptance that ignores T must fail)."""
    target = tiny_target(seed=11, vocab=6, std=0.5)
    drafter = random_drafter(target, 3, seed=12)
    monkeypatch.setattr(ModelChain, "most_rows", 1 << 20)  # the 4,000 samples are one batch
    out = assert_samples_follow_target(target, [0, 1, 2, 3, 4, 5], monkeypatch, mode="sync", drafter=drafter,
                                       lookup=0, draft_model=tiny_target(seed=13, vocab=6, std=0.5))
    assert out.stats.model_drafts >= 4000


def test_the_default_draft_model_is_the_fetched_sibling_the_catalogue_names(monkeypatch):
    from d3d import fetch
    from d3d.draft.pick import default_draft_model

    fetched = {"qwen2.5-coder-0.5b"}
    monkeypatch.setattr(fetch, "is_fetched", lambda name, root=None: name in fetched)
    for name, want in (("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"), ("qwen2.5-coder-0.5b", None), (None, None)):
        monkeypatch.setattr(fetch, "real_model_name", lambda path, name=name: name)
        assert default_draft_model(tiny_target(seed=1)) == want
    fetched.clear()  # not fetched: none (nothing is downloaded for it)
    assert default_draft_model(tiny_target(seed=1)) is None


def test_draft_model_errors_are_named():
    from d3d.decode.engines import generate as library_generate

    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    with pytest.raises(ValueError, match="draft_model: expected a d3d Transformer"):
        library_generate(target, [1, 2], max_new_tokens=3, drafter=drafter, spec=SpecConfig("sync", draft_model="x"))
    with pytest.raises(ValueError, match="draft_model with mode='async'"):
        library_generate(target, [1, 2], max_new_tokens=3, drafter=drafter,
                         spec=SpecConfig("async", draft_model=target))
    with pytest.raises(ValueError, match="its vocabulary has 20 rows, the target's"):
        library_generate(target, [1, 2], max_new_tokens=3, drafter=drafter,
                         spec=SpecConfig("sync", draft_model=tiny_target(seed=1, vocab=20)))
