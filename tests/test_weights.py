"""One weights vocabulary for target and drafter: ``d3d.cpu.precision.auto_weights`` reads the WEIGHTS words
for both, ``Transformer.load_weights`` applies the choice and keeps it as ``weights_choice``, and ``dtype`` and
``weights`` cannot contradict each other."""

import pytest
import torch

import d3d
from d3d.assets import BUNDLED_DRAFTER, BUNDLED_TARGET, bundled
from d3d.cpu import precision
from d3d.kernels import quant as kernel
from d3d.model.config import preset
from d3d.model.transformer import Transformer


@pytest.fixture
def cfg():
    return preset("qwen3-tiny")


def test_dtype_and_weights_that_disagree_are_an_error_naming_both(cfg):
    for weights, dtype in (("bf16", "float32"), ("int8", "bfloat16"), ("int4", "float16"), ("fp32", torch.bfloat16)):
        with pytest.raises(ValueError, match=f"weights={weights!r} and dtype=.* disagree"):
            precision.auto_weights(weights, dtype, "cpu", cfg, False)
    assert precision.auto_weights("bf16", "bfloat16", "cpu", cfg, False).weights == "bfloat16"  # they agree
    assert precision.auto_weights("dense", "bfloat16", "cpu", cfg, False).weights == "dense"  # dense: dtype's
    if kernel.available():
        assert precision.auto_weights("int8", "float32", "cpu", cfg, False).weights == "int8"


def test_auto_yields_to_an_explicit_dtype(monkeypatch, cfg):
    """auto never contradicts dtype: what it would pick in another dtype becomes dense matrices in dtype."""
    monkeypatch.setenv("D3D_WEIGHTS", "int8")
    dense = precision.WeightsChoice("dense", "dtype given")
    assert precision.auto_weights("auto", "bfloat16", "cpu", cfg, False) == dense
    monkeypatch.delenv("D3D_WEIGHTS")
    quantized = precision.auto_weights("auto", "bfloat16", "cpu", cfg, True)  # a quantized checkpoint's blocks
    assert quantized.weights == "dense" and quantized.compute_dtype("bfloat16") == torch.bfloat16
    assert precision.auto_weights("auto", "float32", "cpu", cfg, True).weights == (
        "checkpoint" if kernel.available() else "dense")  # its blocks compute in float32: they stay


def test_a_drafter_follows_its_target(monkeypatch, cfg):
    monkeypatch.setenv("D3D_WEIGHTS", "dense")  # beside a target the target's choice counts, not the environment's
    beside_bf16 = precision.auto_weights("auto", None, "cpu", cfg, False, follow="bfloat16")
    assert beside_bf16.weights == "bfloat16" and beside_bf16.reason == "follows the target (bfloat16)"
    for target, word in (("int4", "int4"), ("int8", "int8"), ("int8+int5", "int8"), ("int8+int5+int4", "int8")):
        choice = precision.auto_weights("auto", None, "cpu", cfg, False, follow=target)
        assert choice.weights == (word if kernel.available() else "dense"), target
    assert precision.auto_weights("int4", None, "cpu", cfg, False, follow="int8").weights in ("int4", "dense")
    assert precision.auto_weights("auto", "float32", "cpu", cfg, False, follow="bfloat16").weights == "dense"


def test_quantized_weights_off_a_cpu_warn_for_target_and_drafter_alike(cfg):
    for follow in (None, "int8"):
        with pytest.warns(UserWarning, match="run on a CPU only"):
            assert precision.auto_weights("int8", "auto", "meta", cfg, False, follow=follow).weights == "dense"


def test_weights_choice_is_the_models_own():
    model = Transformer(preset("qwen3-tiny"))
    assert model.weights_choice is None  # built here, not loaded
    target = d3d.load_model(bundled(BUNDLED_TARGET), weights="fp32")
    assert target.weights_choice == precision.WeightsChoice("float32", "asked for")
    drafter = d3d.load_drafter(bundled(BUNDLED_DRAFTER), target=target)
    assert drafter.model.weights_choice.reason == "follows the target (float32)"
    assert drafter.model.dtype == torch.float32 and not drafter.model.quantized


def test_a_drafter_beside_a_quantized_target_holds_int4():
    """``weights="auto"`` beside a quantized target (int8 or int4 alike): the drafter's layers are int4 in groups of
    32 (``as_int4``; the embedding it shares stays the target's), its greedy output through sync equal to ar's;
    asked for int8, they are int8."""
    from d3d.model.transformer import QuantLinear

    def layers(drafter):
        return [m.weight for n, m in drafter.model.named_modules()
                if isinstance(m, QuantLinear) and n.startswith("layers.")]

    for word in ("int8", "int4"):
        target = d3d.load_model(bundled(BUNDLED_TARGET), weights=word)
        drafter = d3d.load_drafter(bundled(BUNDLED_DRAFTER), target=target)
        assert drafter.model.embed_tokens is target.embed_tokens
        assert drafter.model.weights_choice == precision.WeightsChoice(
            "int4", f"follows the target ({word}); int4 beside a quantized target")
        assert layers(drafter) and all(w.format == "int4" and w.group == 32 for w in layers(drafter))
        ids = list(range(5, 30))
        assert d3d.generate(target, ids, max_new_tokens=24, stop_ids=[], drafter=drafter, spec="sync").tokens \
            == d3d.generate(target, ids, max_new_tokens=24, stop_ids=[]).tokens
    asked = d3d.load_drafter(bundled(BUNDLED_DRAFTER), target=target, weights="int8")
    assert all(w.format == "int8" for w in layers(asked))


def test_load_drafter_takes_load_models_words_and_errors(monkeypatch):
    target = d3d.load_model(bundled(BUNDLED_TARGET), weights="fp32")
    with pytest.raises(ValueError, match="weights='int3': expected one of auto, dense, fp32"):
        d3d.load_drafter(bundled(BUNDLED_DRAFTER), target=target, weights="int3")
    with pytest.raises(ValueError, match="weights='bf16' and dtype='float32' disagree"):
        d3d.load_drafter(bundled(BUNDLED_DRAFTER), target=target, weights="bf16", dtype="float32")
    drafter = d3d.load_drafter(bundled(BUNDLED_DRAFTER), target=target, weights="bfloat16")
    assert drafter.model.dtype == torch.bfloat16 and drafter.model.weights_choice.weights == "bfloat16"


def test_load_dflash_takes_load_models_words_and_follows_the_target():
    from d3d.assets import BUNDLED_DFLASH
    from d3d.draft.dflash import load_dflash

    target = d3d.load_model(bundled(BUNDLED_TARGET), weights="fp32")
    dflash = load_dflash(bundled(BUNDLED_DFLASH), target)
    assert dflash.model.weights_choice == precision.WeightsChoice("float32", "follows the target (float32)")
    assert dflash.fc.weight.dtype == dflash.hidden_norm.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="weights='int3': expected one of auto, dense, fp32"):
        load_dflash(bundled(BUNDLED_DFLASH), target, weights="int3")
    with pytest.raises(ValueError, match="weights='bf16' and dtype='float32' disagree"):
        load_dflash(bundled(BUNDLED_DFLASH), target, weights="bf16", dtype="float32")
    with pytest.raises(ValueError, match="compute in bfloat16, the target in float32"):  # it reads the target's states
        load_dflash(bundled(BUNDLED_DFLASH), target, weights="bf16")
    if kernel.available():
        assert load_dflash(bundled(BUNDLED_DFLASH), target, weights="int8").model.weights == "int8"
        quantized = d3d.load_model(bundled(BUNDLED_TARGET), weights="int4")
        follows = load_dflash(bundled(BUNDLED_DFLASH), quantized)
        assert follows.model.weights == "int4" and follows.model.weights_choice.reason == "follows the target (int4)"
        ids = list(range(5, 30))
        assert d3d.generate(quantized, ids, max_new_tokens=24, stop_ids=[], drafter=follows, spec="dflash").tokens \
            == d3d.generate(quantized, ids, max_new_tokens=24, stop_ids=[]).tokens
