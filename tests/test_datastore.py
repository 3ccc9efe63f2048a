"""Drafting from a datastore (``d3d.decode.datastore``): lookups against a loop oracle, lossless engines."""

from __future__ import annotations

import random

import pytest
import torch

from d3d.decode.datastore import SEPARATOR, Datastore, load_datastore, majority_walk, sorted_starts
from test_engines import assert_samples_follow_target, generate, random_drafter, reference, tiny_target
from d3d.decode.config import SpecConfig


def oracle_chain(docs, context, max_len, min_ngram, max_ngram, min_confidence=0.0):
    """A plain scan: every occurrence of the longest suffix of ``context`` (``min_ngram``..``max_ngram``
    tokens) in any doc that some occurrence continues, and the majority walk over what followed each
    (within its doc)."""
    for k in range(min(max_ngram, len(context)), min_ngram - 1, -1):
        tail = context[-k:]
        conts = [d[s + k:s + k + max_len] for d in docs for s in range(len(d) - k + 1) if d[s:s + k] == tail]
        if any(conts):  # some occurrence has a continuation
            break
    else:
        return [], []
    tokens, confidence, rows = [], [], conts
    for depth in range(max_len):
        column = [c[depth] for c in rows if depth < len(c)]
        if not column:
            break
        best = max(column.count(t) for t in set(column))
        t = min(t for t in set(column) if column.count(t) == best)
        tokens.append(t)
        confidence.append(best / len(rows))
        rows = [c for c in rows if depth < len(c) and c[depth] == t]
    if not tokens or confidence[0] < min_confidence:
        return [], []
    return tokens, confidence


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ngrams", [(1, 1), (2, 4), (3, 8)])
def test_chain_equals_a_plain_scan(seed, ngrams):
    rng = random.Random(seed)
    docs = [[rng.randrange(4) for _ in range(rng.randrange(0, 30))] for _ in range(25)]
    store = Datastore(docs, min_ngram=ngrams[0], max_ngram=ngrams[1], sample=10_000, prior=0.0)
    assert len(store) == sum(map(len, docs))
    for _ in range(60):
        context = [rng.randrange(5) for _ in range(rng.randrange(0, 12))]  # id 4: never in the store
        max_len = rng.randrange(1, 9)
        chain = store.chain(context, max_len)
        assert (chain.tokens, chain.confidence) == oracle_chain(docs, context, max_len, *ngrams), (context, max_len)


def test_chain_prefers_the_longest_match_and_respects_min_confidence():
    docs = [[1, 2, 3, 7, 7], [9, 2, 3, 5, 6], [8, 2, 3, 5, 4]]
    store = Datastore(docs, min_ngram=2, max_ngram=3, prior=0.0)  # raw shares
    lookup = lambda s, ctx: (s.chain(ctx, 5).tokens, s.chain(ctx, 5).confidence)  # noqa: E731
    assert lookup(store, [0, 1, 2, 3]) == ([7, 7], [1.0, 1.0])  # "1 2 3" occurs once: its continuation
    tokens, confidence = lookup(store, [0, 4, 2, 3])  # only "2 3" occurs: three continuations
    assert tokens == [5, 4] and confidence == pytest.approx([2 / 3, 1 / 2])
    chain = store.chain([0, 4, 2, 3], 5)
    assert chain.top_ids == [[5, 7], [4, 6]] and sum(chain.top_probs, []) == pytest.approx([2 / 3, 1 / 3, 1 / 2, 1 / 2])
    assert chain.support == [(3, 2), (2, 1)]
    smoothed = store.at(prior=1.0).chain([0, 4, 2, 3], 5)  # c / (n + 1)
    assert smoothed.tokens == [5, 4] and smoothed.confidence == pytest.approx([2 / 4, 1 / 3])
    assert smoothed.top_probs[0] == pytest.approx([2 / 4, 1 / 4])
    assert lookup(Datastore(docs, min_ngram=2, min_confidence=0.7), [4, 2, 3]) == ([], [])
    assert lookup(store, [6, 6]) == ([], []) and lookup(store, [3]) == ([], [])  # no match; shorter than min_ngram
    assert lookup(store, [9, 2, 3, 5, 6]) == ([], [])  # "5 6" and "6" end their doc: nothing follows
    assert lookup(store, [0, 9, 2, 3, 5]) == ([4], [0.5])  # "2 3 5" twice, then 6 or 4: a tie, the smaller id


def test_sampling_keeps_at_most_sample_occurrences():
    docs = [[1, 2, 3]] * 300 + [[1, 2, 4]] * 100
    chain = Datastore(docs, min_ngram=2, sample=40).chain([1, 2], 3)
    assert chain.tokens == [3] and chain.support[0][0] == 40 and 0.6 <= chain.confidence[0] <= 0.9  # evenly spaced


def test_sorted_starts_orders_positions_by_their_next_tokens():
    rng = random.Random(3)
    toks = [rng.randrange(3) if rng.random() > 0.1 else SEPARATOR for _ in range(200)]
    order = sorted_starts(torch.tensor(toks, dtype=torch.int32), 4).tolist()
    keys = [toks[p:p + 4] for p in order]
    assert sorted(order) == list(range(200)) and keys == sorted(keys)
    assert majority_walk([[5, 1], [5, 2], [6]], top=2) == [(3, [(5, 2), (6, 1)]), (2, [(1, 1), (2, 1)])]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        Datastore([[1]], min_ngram=4, max_ngram=3)
    with pytest.raises(ValueError, match="min_confidence=1.5"):
        Datastore([[1]], min_confidence=1.5)
    with pytest.raises(ValueError, match="prior=-1"):
        Datastore([[1]]).at(prior=-1)
    with pytest.raises(ValueError, match="token ids must be >= 0"):
        Datastore([[1, -3]])


def own_text_store(target, prompts, n=40, **kw):
    """A datastore of the target's greedy continuations of other prompts: its own phrasing."""
    return Datastore(reference(target, prompts, n), **kw)


OTHER = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 2, 5], [9, 3, 1, 4]]
PROMPTS = [[3, 7, 1], [5, 5, 5, 2], [2, 9, 11, 4, 8], [10, 12]]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_greedy_with_a_datastore_equals_ar(mode):
    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    store = own_text_store(target, OTHER, min_ngram=2)
    ref = reference(target, PROMPTS, 40)
    plain = generate(target, PROMPTS, max_new_tokens=40, stop_ids=[], drafter=drafter,
                     spec=SpecConfig(mode=mode, lookup=0, verify_min_prob=0.0))  # every round drafts
    rounds = []
    out = generate(target, PROMPTS, max_new_tokens=40, stop_ids=[], drafter=drafter, on_round=rounds.append,
                   spec=SpecConfig(mode=mode, lookup=0, datastore=store, verify_min_prob=0.0))
    assert out.tokens == plain.tokens == ref
    assert 0 < out.stats.datastore_drafts < out.stats.rounds and out.stats.lookup_drafts == 0
    assert out.stats.tau > plain.stats.tau  # the target's own continuations are accepted
    stored = [r for r in rounds if r.stored]
    assert len(stored) == out.stats.datastore_drafts and all(r.copied and not r.sync_draft_seconds for r in stored)
    for p, r in zip(PROMPTS, ref):  # batch of one: chains of their own length
        assert generate(target, p, max_new_tokens=40, stop_ids=[], drafter=drafter,
                        spec=SpecConfig(mode=mode, datastore=store)).tokens == [r]


def test_the_context_copy_comes_first_and_verify_min_prob_cuts_store_chains():
    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    store = own_text_store(target, OTHER, min_ngram=1)
    both = generate(target, PROMPTS, max_new_tokens=40, stop_ids=[], drafter=drafter,
                    spec=SpecConfig(mode="sync", lookup=1, datastore=store))
    alone = generate(target, PROMPTS, max_new_tokens=40, stop_ids=[], drafter=drafter,
                     spec=SpecConfig(mode="sync", lookup=1))
    assert both.tokens == alone.tokens and both.stats.lookup_drafts > 0 and both.stats.datastore_drafts > 0
    assert both.stats.lookup_drafts + both.stats.datastore_drafts <= both.stats.rounds
    unsure = own_text_store(target, OTHER + [[t] for t in range(13)] * 3, min_ngram=1)  # confidences < 1
    cut = generate(target, PROMPTS, max_new_tokens=40, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode="sync", lookup=0, verify_min_prob=0.99, datastore=unsure))
    full = generate(target, PROMPTS, max_new_tokens=40, stop_ids=[], drafter=drafter,
                    spec=SpecConfig(mode="sync", lookup=0, verify_min_prob=0.0, datastore=unsure))
    assert cut.tokens == full.tokens and cut.stats.verified_drafts < full.stats.verified_drafts


def test_sampling_with_a_datastore_follows_the_target_distribution(monkeypatch):
    """A datastore chain is a deterministic draft: accepted with the target's probability, so sampled
    outputs keep the target's distribution (control: acceptance that ignores T must fail)."""
    target = tiny_target(seed=11, vocab=6, std=0.5)
    drafter = random_drafter(target, 3, seed=12)
    store = Datastore([[a, b, c] for a in range(6) for b in range(6) for c in (b, (b + 1) % 6)], min_ngram=1)
    out = assert_samples_follow_target(target, [0, 1, 2, 3, 4, 5], monkeypatch, mode="sync", drafter=drafter,
                                       lookup=0, datastore=store)
    assert out.stats.datastore_drafts >= 4000


def test_datastore_errors_are_named(tmp_path):
    from d3d.decode.engines import generate as library_generate
    from d3d.data.answers import AnswerStore, target_fingerprint

    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    with pytest.raises(ValueError, match="datastore: expected a d3d.decode.datastore.Datastore"):
        library_generate(target, [1, 2], max_new_tokens=3, drafter=drafter,
                         spec=SpecConfig(mode="sync", datastore=[[1, 2]]))
    with pytest.raises(ValueError, match="datastore with mode='ar'"):
        library_generate(target, [1, 2], max_new_tokens=3, spec=SpecConfig(datastore=Datastore([[1, 2]])))
    other = tiny_target(seed=99)
    store = AnswerStore(tmp_path / "s", target_fingerprint(other), 8)
    store.prepare()
    torch.save([[("code", [1, 2], [3, 4, 5])]], store.pending_path)
    store.seal(None, "float32")
    assert len(load_datastore(tmp_path / "s", other)) == 3 and len(load_datastore(tmp_path / "s")) == 3
    with pytest.raises(ValueError, match="the answers of another model"):
        load_datastore(tmp_path / "s", target)
    mine = AnswerStore(tmp_path / "t", target_fingerprint(target), 8)  # several stores: one index, in order
    mine.prepare()
    torch.save([[("chat", [1], [7, 8])]], mine.pending_path)
    mine.seal(None, "float32")
    both = load_datastore([tmp_path / "t", tmp_path / "t"], target)
    assert len(both) == 2 * len(load_datastore(tmp_path / "t", target))
    with pytest.raises(ValueError, match=f"{tmp_path / 's'}: the answers of another model"):
        load_datastore([tmp_path / "t", tmp_path / "s"], target)
    with pytest.raises(ValueError, match="no answer store"):
        load_datastore([])


def test_every_draft_source_proposes_a_draft():
    """The context lookup and the datastore are draft sources of one shape (d3d.decode.sources):
    ``propose(seq, max_len)`` gives a Draft after the sequence's tokens or None, and its origin names its
    stats counter."""
    from d3d.decode.generation import GenerationStats
    from d3d.decode.sequence import Sequence
    from d3d.decode.sources import ContextLookup, Draft, Origin

    lookup, store = ContextLookup(2), Datastore([[5, 6, 7, 8, 9]], min_ngram=2)
    for source in (lookup, store):
        assert source.origin in Origin and hasattr(GenerationStats("sync", 1, [1], [0]), f"{source.origin.value}_drafts")
    copied = lookup.propose(Sequence([1, 2, 3, 4, 1, 2], 8), 3)
    assert isinstance(copied, Draft) and copied.tokens == [3, 4, 1] and len(copied.confidence) == 3
    assert lookup.propose(Sequence([1, 2, 3], 8), 3) is None
    stored = store.propose(Sequence([0, 5, 6], 8), 2)
    assert isinstance(stored, Draft) and stored.tokens == [7, 8] and stored.top_ids[0][0] == 7
    assert store.propose(Sequence([0, 1, 2], 8), 2) is None


def test_a_store_of_another_checkpoint_of_the_same_real_model_is_accepted(tmp_path, monkeypatch):
    """The fingerprint names a checkpoint (the HF weights and the GGUF's blocks of one model differ); a store whose
    manifest names the real model that answered (``AnswerStore(model=)``) serves a target loaded as that model
    (``d3d.fetch.real_model_name`` of its ``source``), and no other."""
    from d3d.data.answers import AnswerStore, read_manifest, target_fingerprint
    from d3d.fetch import model_dir, real_model_name

    monkeypatch.setenv("D3D_CACHE", str(tmp_path / "cache"))
    writer, target = tiny_target(seed=21), tiny_target(seed=22)
    for name, model in (("same", "qwen2.5-coder-0.5b"), ("other", "qwen2.5-coder-1.5b")):
        store = AnswerStore(tmp_path / name, target_fingerprint(writer), 8, model)
        store.prepare()
        torch.save([[("chat", [1, 2], [3, 4, 5])]], store.pending_path)
        store.seal(None, "float32")
        assert read_manifest(tmp_path / name)["model"] == model
    target.source = model_dir("qwen2.5-coder-0.5b").resolve()
    assert real_model_name(target.source) == "qwen2.5-coder-0.5b" and real_model_name(tmp_path) is None
    assert len(load_datastore([tmp_path / "same"], target)) == 3
    with pytest.raises(ValueError, match="model qwen2.5-coder-1.5b; this target's .*, qwen2.5-coder-0.5b"):
        load_datastore([tmp_path / "same", tmp_path / "other"], target)
    target.source = tmp_path  # not a fetched real model: the fingerprint alone decides
    with pytest.raises(ValueError, match="the answers of another model"):
        load_datastore(tmp_path / "same", target)
