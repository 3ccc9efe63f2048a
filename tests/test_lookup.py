"""Drafting by lookup (``d3d.decode.lookup``, ``lookup=n``): copied chains, lossless in every mode."""

from __future__ import annotations

import math
import random

import pytest
import torch

from d3d.decode.lookup import LONG, LONG_MATCH, SHORT_MATCH, NgramIndex, copy_confidence, lookup_chain, lookup_copy
from test_engines import assert_samples_follow_target, generate, random_drafter, reference, tiny_target
from d3d.decode.config import SpecConfig


def test_lookup_chain_copies_after_the_longest_most_recent_match():
    ctx = [1, 2, 3, 9, 9, 4, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup_chain(ctx, 3, 4) == [9, 9, 4, 2]  # "1 2 3" occurred once before
    assert lookup_chain(ctx, 2, 4) == [9, 9, 4, 2]  # the longest match wins over the more recent "2 3"
    assert lookup_chain(ctx[:-1] + [6], 1, 3) == []  # 6 never occurred
    assert lookup_chain([4, 5, 4, 5, 6, 4, 5], 2, 8) == [6, 4, 5]  # most recent: after the 2nd "4 5"
    assert lookup_chain([7, 7, 7], 2, 5) == [7]  # the match may overlap the tail
    assert lookup_chain([3, 1, 2, 3, 1], 1, 2, max_ngram=1) == [2, 3]
    assert lookup_chain([5], 1, 3) == [] and lookup_chain([], 1, 3) == []
    with pytest.raises(ValueError, match="min_ngram and max_len must be >= 1"):
        lookup_chain([1, 2], 0, 3)


def test_a_copy_knows_how_long_its_match_is_and_estimates_by_it():
    """The match is measured back past max_ngram (up to LONG): a restatement of 16+ tokens is
    trusted at every position, a short match less, and more the longer the copy holds."""
    line = list(range(10, 30))  # 20 tokens, then their first 5 again: a match of 5 (the text starts there)
    found = lookup_copy(line + [1] + line[:5], 3, 6)
    assert found.tokens == line[5:11] and found.match == 5
    long = lookup_copy([7] + line + [1] + [7] + line[:17], 3, 4)  # a match of 18 tokens, counted to LONG
    assert long.tokens == line[17:] + [1] and long.match == LONG
    assert long.confidence == [LONG_MATCH] * 4
    assert found.confidence == list(SHORT_MATCH[:6])
    assert copy_confidence(3, 17)[-2:] == [SHORT_MATCH[-1]] * 2  # past the table: its last value
    assert all(a <= b for a, b in zip(SHORT_MATCH[:8], SHORT_MATCH[1:9]))  # survival raises the odds
    assert lookup_copy([1, 2, 3], 2, 4) is None


@pytest.mark.parametrize("min_ngram,max_ngram", [(1, 1), (1, 4), (2, 8), (3, 8), (3, 3), (4, 9), (3, 2)])
def test_the_index_finds_what_the_scan_finds_as_the_context_grows(min_ngram, max_ngram):
    """An ``NgramIndex`` kept across calls gives the scan's copy and match length at every length of a
    growing context: small alphabets (many matches, ties between equally long ones), pasted repeats of
    earlier stretches (long matches, past LONG), the tail overlapping its match."""
    rng = random.Random(min_ngram * 100 + max_ngram)
    for trial in range(12):
        alphabet = rng.choice([2, 3, 5, 40])
        ctx, index, checked = [], NgramIndex(min_ngram), 0
        while len(ctx) < 160:
            if ctx and rng.random() < 0.3:  # repeat an earlier stretch (sometimes longer than LONG)
                a = rng.randrange(len(ctx))
                ctx += ctx[a:a + rng.randrange(1, 2 * LONG)]
            else:
                ctx += [rng.randrange(alphabet) for _ in range(rng.randrange(1, 4))]
            for L in range(max(1, len(ctx) - 3), len(ctx) + 1):  # each length, as rounds commit 1-4 tokens
                max_len = rng.choice([1, 4, 15])
                fast = lookup_copy(ctx[:L], min_ngram, max_len, max_ngram, index=index)
                slow = lookup_copy(ctx[:L], min_ngram, max_len, max_ngram)
                assert (fast and (fast.tokens, fast.match)) == (slow and (slow.tokens, slow.match)), (ctx[:L], min_ngram)
                checked += slow is not None
        assert checked or alphabet == 40 or max_ngram < min_ngram  # the small alphabets do match
    # the list may only grow: a shorter one starts afresh and still agrees
    ctx = [1, 2, 3, 1, 2, 3, 1, 2]
    index = NgramIndex(min_ngram)
    for L in (8, 5, 8):
        fast, slow = lookup_copy(ctx[:L], min_ngram, 4, max_ngram, index=index), lookup_copy(ctx[:L], min_ngram, 4, max_ngram)
        assert (fast and fast.tokens) == (slow and slow.tokens)


def test_an_index_serves_one_ngram_length():
    with pytest.raises(ValueError, match="an index of 2-grams for min_ngram=3"):
        lookup_copy([1, 2, 3, 1, 2, 3], 3, 4, index=NgramIndex(2))
    with pytest.raises(ValueError, match="n must be >= 1"):
        NgramIndex(0)


REPEATING = [[3, 7, 1, 3, 7], [5, 5, 5], [2, 9, 11, 4, 8, 1, 1, 6], [10, 12]]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("ngram", [1, 3])
def test_greedy_with_lookup_equals_ar(mode, ngram):
    """Copied chains (of any length, beside drafted ones in a batch) never change the output; the
    tiny random target repeats itself, so chains are copied and accepted."""
    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    ref = reference(target, REPEATING, 40)
    plain = generate(target, REPEATING, max_new_tokens=40, stop_ids=[], drafter=drafter,
                     spec=SpecConfig(mode=mode, verify_min_prob=0.0))  # every round drafts: τ does not hang on timing
    out = generate(target, REPEATING, max_new_tokens=40, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode=mode, lookup=ngram, verify_min_prob=0.0))
    assert out.tokens == plain.tokens == ref
    assert plain.stats.lookup_drafts == 0 < out.stats.lookup_drafts < out.stats.rounds
    assert out.stats.tau > plain.stats.tau
    for p, r in zip(REPEATING, ref):  # batch of one: chains of their own length
        assert generate(target, p, max_new_tokens=40, stop_ids=[], drafter=drafter,
                        spec=SpecConfig(mode=mode, lookup=ngram)).tokens == [r]


def test_default_lookup_three_for_sync_none_for_async():
    from d3d.decode.engines import generate as library_generate

    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    sync = library_generate(target, REPEATING, max_new_tokens=40, stop_ids=[], drafter=drafter,
                            spec=SpecConfig(mode="sync", verify_min_prob=0.05))  # as the helper below: auto's rounds depend on timing
    three = generate(target, REPEATING, max_new_tokens=40, stop_ids=[], drafter=drafter,
                     spec=SpecConfig(mode="sync", lookup=3))
    assert sync.stats.lookup_drafts == three.stats.lookup_drafts > 0
    assert library_generate(target, REPEATING, max_new_tokens=40, stop_ids=[], drafter=drafter, spec="async").stats.lookup_drafts == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_draft_size_shortens_the_drafters_blocks_not_the_copies(mode):
    """draft_size=2: every drafter block drafts 2 tokens, copied chains still run to B - 1 = 4, and the output
    is ar's; the CPU default in sync is 4 drafted tokens, elsewhere the whole block."""
    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    rounds = []
    out = generate(target, REPEATING, max_new_tokens=40, stop_ids=[], drafter=drafter, on_round=rounds.append,
                   spec=SpecConfig(mode=mode, lookup=1, draft_size=2, verify_min_prob=0.0))
    assert out.tokens == reference(target, REPEATING, 40)
    drafted = [r for r in rounds if not r.copied and not r.successor_used and r.draft]
    assert drafted and all(len(r.draft) == 2 for r in drafted)
    assert max(len(r.draft) for r in rounds if r.copied) == 4
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert SpecConfig("sync").resolve(cpu, drafter_block_size=16).draft_size == 4
    assert SpecConfig("sync").resolve(cuda, drafter_block_size=16).draft_size == 15
    assert SpecConfig("async").resolve(cpu, drafter_block_size=16).draft_size == 15
    assert SpecConfig("sync", draft_size=9).resolve(cpu, drafter_block_size=5).draft_size == 4
    with pytest.raises(ValueError, match="draft_size=0"):
        SpecConfig.parse("sync draft_size=0")


def test_copied_rounds_are_reported():
    target = tiny_target(seed=21)
    drafter = random_drafter(target, 5, seed=22)
    rounds = []
    out = generate(target, REPEATING[:1], max_new_tokens=30, stop_ids=[], drafter=drafter, on_round=rounds.append,
                   spec=SpecConfig(mode="async", lookup=1))
    copied = [r for r in rounds if r.copied]
    assert len(copied) == out.stats.lookup_drafts > 0
    # their confidence is the estimate's (d3d.decode.lookup), not certainty
    drafted = [r for r in copied if r.draft]
    assert drafted and all(any(math.isclose(r.confidence, math.prod(copy_confidence(m, len(r.draft))))
                               for m in (3, LONG)) for r in drafted)
    assert not any(r.successor_used or r.sync_draft_seconds for r in copied)


def test_lookup_with_exact_stops_and_bad_values():
    target = tiny_target(seed=5).to(torch.bfloat16).pack_for_cpu()
    drafter = random_drafter(target, 4, seed=3)
    drafter.model.to(torch.bfloat16).pack_for_cpu()
    ar = generate(target, REPEATING, max_new_tokens=30, stop_ids=[])
    out = generate(target, REPEATING, max_new_tokens=30, stop_ids=[], drafter=drafter,
                   spec=SpecConfig(mode="sync", lookup=2, exact=True))
    assert out.tokens == ar.tokens and out.stats.lookup_drafts > 0  # bit-exact in bf16 too
    stop = ar.tokens[0][7]
    expected = generate(target, REPEATING, max_new_tokens=30, stop_ids=[stop]).tokens
    assert generate(target, REPEATING, max_new_tokens=30, stop_ids=[stop], drafter=drafter,
                    spec=SpecConfig(mode="sync", lookup=1)).tokens == expected
    for bad in (-1, 2.0):
        with pytest.raises(ValueError, match=f"lookup={bad!r}: must be an integer >= 0"):
            generate(target, [1, 2], max_new_tokens=3, drafter=drafter, spec=SpecConfig(mode="sync", lookup=bad))


def test_sampling_with_lookup_follows_the_target_distribution(monkeypatch):
    """A copied chain is a deterministic draft like the drafter's argmax: accepted with the target's
    probability, so sampled outputs keep the target's distribution (control: acceptance that ignores
    T must fail)."""
    target = tiny_target(seed=11, vocab=6, std=0.5)
    drafter = random_drafter(target, 3, seed=12)
    prompt = [0, 1, 2, 3, 4, 5]  # every token occurred: each row's first draft is copied
    out = assert_samples_follow_target(target, prompt, monkeypatch, mode="sync", drafter=drafter, lookup=1)
    assert out.stats.lookup_drafts >= 4000
