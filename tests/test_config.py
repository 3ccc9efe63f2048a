"""SpecConfig: the compact form round-trips, every bad knob is named, defaults come from one table."""

import pytest
import torch

from d3d.decode.config import HELP, SpecConfig, defaults


def test_compact_form_round_trips():
    for text in ("ar", "sync", "sync lookup=0 leaves=3", "async hypotheses=4 fanout=2 successor_threshold=0.0 overlap=packed",
                 "sync verify_min_prob=auto exact=True", "dflash block_size=8"):
        spec = SpecConfig.parse(text)
        assert str(spec) == text and SpecConfig.parse(str(spec)) == spec
    assert SpecConfig.parse("sync,lookup=0,leaves=3") == SpecConfig("sync", lookup=0, leaves=3)  # the bench's commas


@pytest.mark.parametrize("text, message", [
    ("", "must start with a mode"), ("lookup=3", "must start with a mode"), ("warp", "mode='warp'"),
    ("sync lookup", "'lookup' is not NAME=VALUE"), ("sync speed=3", "'speed=3' is not NAME=VALUE"),
    ("sync leaves=-1", "leaves=-1: must be an integer >= 0"), ("sync lookup=two", "lookup='two': expected a number"),
    ("sync verify_min_prob=2", "verify_min_prob=2.0"), ("async overlap=thread", "overlap='thread'"),
    ("sync exact=maybe", "exact='maybe'"), ("sync block_size=1", "block_size=1"),
])
def test_bad_specs_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        SpecConfig.parse(text)


def test_resolve_fills_only_unset_knobs_and_refuses_contradictions():
    cpu = torch.device("cpu")
    table = defaults(cpu, "sync")
    assert set(table) == set(HELP) - {"block_size", "exact"}  # every knob but the drafter's B and exact has a default
    spec = SpecConfig("sync", lookup=0).resolve(cpu)
    assert spec.lookup == 0 and spec.leaves == table["leaves"] == 2 and spec.exact is False
    assert SpecConfig("async").resolve(torch.device("cuda")).overlap == "stream"
    assert SpecConfig("sync").resolve(cpu, int8_activations=True).exact is True
    with pytest.raises(ValueError, match="exact=True with leaves=2"):
        SpecConfig("sync", exact=True, leaves=2).resolve(cpu)
    with pytest.raises(ValueError, match="leaves=1 with a target with int8 activations"):
        SpecConfig("sync", leaves=1).resolve(cpu, int8_activations=True)
    with pytest.raises(ValueError, match="overlap='none'"):
        SpecConfig("async", exact=True, overlap="packed").resolve(cpu)


def test_resolve_leaves_nothing_to_decide_in_a_round():
    """A resolved spec has a value in every field (thresholds as the rules a round calls, B the drafter's),
    writes back the compact form it came from, and resolving it again changes nothing."""
    from d3d.decode.row_price import Fixed, PricedCut, PricedSuccessor, RowPrice

    cpu = torch.device("cpu")
    for text in ("sync", "async", "sync verify_min_prob=0.2 successor_threshold=0 block_size=8"):
        spec = SpecConfig.parse(text).resolve(cpu, drafter_block_size=16)
        assert all(getattr(spec, k) is not None for k in HELP) and spec.block_size == (8 if "block_size" in text else 16)
        assert SpecConfig.parse(str(spec)).resolve(cpu, drafter_block_size=16) == spec == spec.resolve(cpu)
    sync, fixed = SpecConfig("sync").resolve(cpu), SpecConfig("async", verify_min_prob=0.2).resolve(cpu)
    assert sync.verify_min_prob == PricedCut(gate=True) and sync.successor_threshold == PricedSuccessor()
    assert SpecConfig("async").resolve(cpu).verify_min_prob == PricedCut(gate=False)  # async never skips drafting
    assert fixed.verify_min_prob == Fixed(0.2) and fixed.verify_min_prob(RowPrice()) == 0.2
    assert sync.verify_min_prob(RowPrice(prior=0.07)) == 0.07  # measured: the price's prior until it knows more


def test_the_mode_is_decided_in_one_place():
    from d3d.decode.config import Sampling
    from d3d.draft.pick import decide_mode

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert decide_mode(None) == "ar" and decide_mode("sync") == "sync" and decide_mode(None, cpu, "dflash") == "dflash"
    assert decide_mode(None, cpu, "d3d") == "sync" and decide_mode(None, cuda, "d3d") == "async"
    assert decide_mode(None, default="async") == "async" and decide_mode("ar", default="async") == "ar"
    assert decide_mode("sync", sampling=Sampling(1.0, top_p=0.9)) == "ar"  # lossless at T, not at a truncation
    assert decide_mode("sync", sampling=Sampling(0.0, top_p=0.9)) == decide_mode("sync", sampling=Sampling(1.0)) == "sync"
