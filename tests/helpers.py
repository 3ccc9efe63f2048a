"""Shared test helpers: tiny random Hugging Face checkpoints built with transformers (the oracle)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

# The test suite's own environment variables, read only through ``suite_env`` (d3d's are d3d/env.py's):
# what a run of the suite cannot be told otherwise. docs/design.md §10 lists them (tests/test_env.py checks).
SUITE_VARIABLES = {
    "D3D_REAL_MODELS": "real models whose tests must run, comma-separated: a missing one fails instead of "
                       "skipping (make test sets it)",
    "D3D_QWEN25": "another directory for the 0.5B's tests (a converted or trained Qwen2.5-Coder-0.5B)",
    "D3D_PAGE_SCREENSHOT": "a file where the served page's browser test saves a screenshot",
}


def suite_env(name: str) -> str:
    """The value of the suite's variable ``name`` ('' where unset)."""
    if name not in SUITE_VARIABLES:
        raise KeyError(f"{name!r} is not one of the suite's variables (tests/helpers.py SUITE_VARIABLES)")
    return os.environ.get(name, "")


def make_hf_model(kind: str = "qwen3", *, vocab=257, hidden=64, inter=96, layers=2, heads=4, kv_heads=2,
                  head_dim=16, tied=False, max_pos=512, seed=0, eos=None):
    """A random tiny transformers Qwen3/Qwen2 causal LM in eval mode (fp32)."""
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
                  tie_word_embeddings=tied, rope_theta=10000.0 + seed, eos_token_id=eos)
    if kind == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=head_dim, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        raise ValueError(kind)
    # Random init leaves norms at 1 and biases at 0: perturb them so the test sees them.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def save_hf(model, path: Path, *, layout: str = "new", max_shard_size: str | None = None) -> Path:
    """save_pretrained, then optionally rewrite config.json in the old layout (rope_theta/torch_dtype)."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    cfg_file = Path(path) / "config.json"
    raw = json.loads(cfg_file.read_text())
    if layout == "old":
        rope = raw.pop("rope_parameters", None) or {}
        raw["rope_theta"] = rope.get("rope_theta", raw.get("rope_theta"))
        raw["torch_dtype"] = raw.pop("dtype", "float32")
    elif layout == "new":
        theta = raw.pop("rope_theta", None)
        raw.setdefault("rope_parameters", {"rope_theta": theta, "rope_type": "default"})
        raw.pop("torch_dtype", None)
    cfg_file.write_text(json.dumps(raw, indent=2))
    return Path(path)


def bundled_server(draft_model=None, **kw):
    """``d3d serve`` on the bundled pair (sync with its drafter; ``draft_model``: a smaller model's chains too) on a
    free port of 127.0.0.1, quiet, and what it serves: (server, target, tokenizer, drafter). The caller drains the
    server."""
    import d3d
    from d3d.assets import BUNDLED_TARGET, models_dir
    from d3d.draft.pick import pick_drafter
    from d3d.serve.server import serve

    target = d3d.load_model(models_dir() / BUNDLED_TARGET)
    tok = d3d.load_tokenizer(models_dir() / BUNDLED_TARGET)
    mode, drafter, _ = pick_drafter(target, "sync")
    spec = d3d.SpecConfig(mode, draft_model=target if draft_model == "target" else draft_model)
    return serve(target, tok, drafter, spec, "target-16m", port=0, quiet=True, **kw), target, tok, drafter


def real_model_dir(name: str) -> Path:
    """The converted directory of a real model (``python -m d3d fetch NAME``, in the d3d cache; for the
    0.5B ``D3D_QWEN25`` may name another). Missing, its tests skip and say how to get it, unless
    ``D3D_REAL_MODELS`` lists the name (``make test`` fetches the 0.5B first and sets it, so in CI a
    missing model is a failure, not a silent skip)."""
    import pytest

    from d3d.fetch import is_fetched, lookup, model_dir

    name = lookup(name).name
    if name == "qwen2.5-coder-0.5b" and suite_env("D3D_QWEN25"):
        return Path(suite_env("D3D_QWEN25"))
    if is_fetched(name):
        return model_dir(name)
    why = f"{name} is not fetched (python -m d3d fetch {name}; about a minute per 0.5 GB)"
    if name in suite_env("D3D_REAL_MODELS").split(","):
        pytest.fail(f"D3D_REAL_MODELS requires {name}, but {why}")
    pytest.skip(why)
