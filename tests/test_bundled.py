"""The bundled models under models/: they load, generate code-like text, and match transformers."""

import pytest
import torch

import d3d
from d3d.assets import BUNDLED_DRAFTER, BUNDLED_TARGET, models_dir

TARGET = models_dir() / BUNDLED_TARGET
DRAFTER = models_dir() / BUNDLED_DRAFTER


@pytest.fixture(scope="module")
def target():
    return d3d.load_model(TARGET)


def test_target_generates_python(target):
    tok = d3d.load_tokenizer(TARGET)
    assert tok.vocab_size == target.cfg.vocab_size == 8192
    assert tok.token_id("<|mask|>") == 3
    ids = tok.encode("def is_even(n):\n    ")
    out = d3d.generate(target, ids, max_new_tokens=24)
    text = tok.decode(out.tokens[0])
    assert out.stats.num_generated[0] >= 1
    assert any(word in text for word in ("return", "if", "n", "=")), text


def test_target_matches_transformers(target):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    ids = torch.randint(0, 8192, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(target(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not (DRAFTER / "config.json").exists(), reason="bundled drafter not trained yet")
def test_bundled_pair_is_lossless_and_drafts_well(target):
    drafter = d3d.load_drafter(DRAFTER, target=target)
    tok = d3d.load_tokenizer(TARGET)
    ids = tok.encode("import os\n\n\ndef read_lines(path):\n    ")
    ar = d3d.generate(target, ids, max_new_tokens=64, stop_ids=[])
    for mode in ("sync", "async"):
        out = d3d.generate(target, ids, max_new_tokens=64, stop_ids=[], mode=mode, drafter=drafter)
        assert out.tokens == ar.tokens
        assert out.stats.tau > 1.5
