"""Bad checkpoints and bad generation arguments get clear errors naming the file/argument."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from d3d.model.checkpoint import load_model
from d3d.model.config import ModelConfig
from d3d.decode.engines import generate

from helpers import make_hf_model, save_hf
from d3d.decode.config import Sampling, SpecConfig


@pytest.fixture
def ckpt(tmp_path):
    save_hf(make_hf_model("qwen3", max_pos=64), tmp_path)
    return tmp_path


def _rewrite(path, fn):
    tensors = load_file(path / "model.safetensors")
    fn(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor(ckpt):
    _rewrite(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensor\(s\): model.layers.1.mlp.up_proj.weight"):
        load_model(ckpt)


def test_unexpected_tensor(ckpt):
    _rewrite(ckpt, lambda t: t.update({"model.layers.7.extra": torch.zeros(2)}))
    with pytest.raises(ValueError, match=r"unexpected tensor\(s\): model.layers.7.extra"):
        load_model(ckpt)


def test_wrong_shape(ckpt):
    _rewrite(ckpt, lambda t: t.update({"model.norm.weight": torch.ones(63)}))
    with pytest.raises(ValueError, match=r"model.safetensors: tensor 'model.norm.weight' has shape \(63,\), config.json implies \(64,\)"):
        load_model(ckpt)


def test_truncated_and_not_safetensors(ckpt):
    f = ckpt / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        load_model(ckpt)
    f.write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_model(ckpt)


def test_no_weights_or_dir(ckpt, tmp_path):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_model(ckpt)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_model(tmp_path / "nope")


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.update(model_type="llama"), "unknown model_type 'llama'"),
    (lambda c: c.pop("hidden_size"), "missing field"),
    (lambda c: c.update(num_key_value_heads=3), "not a multiple of num_key_value_heads"),
    (lambda c: (c.pop("rope_parameters", None), c.pop("rope_theta", None)), "rope_theta"),
])
def test_bad_config(ckpt, edit, message):
    f = ckpt / "config.json"
    raw = json.loads(f.read_text())
    edit(raw)
    f.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=message) as info:
        load_model(ckpt)
    assert "config.json" in str(info.value)


def test_config_json_not_json(ckpt):
    (ckpt / "config.json").write_text("{ nope")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        ModelConfig.load(ckpt)


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt_ids=[]), "empty prompt"),
    (dict(prompt_ids=[[1, 2], []]), r"prompt_ids\[1\]: empty prompt"),
    (dict(prompt_ids=[1, 999]), r"token id\(s\) \[999\] out of range"),
    (dict(prompt_ids=[1, -1]), "out of range"),
    (dict(prompt_ids=list(range(60)), max_new_tokens=10), "exceeds the model's max_position_embeddings=64"),
    (dict(prompt_ids=[1], max_new_tokens=0), "max_new_tokens=0"),
    (dict(prompt_ids=[1], max_new_tokens=-3), "max_new_tokens=-3"),
    (dict(prompt_ids=[1], sampling=Sampling(temperature=-0.5)), "temperature=-0.5"),
    (dict(prompt_ids=[1], sampling=Sampling(temperature=float("nan"))), "temperature=nan"),
    (dict(prompt_ids=[1], sampling=Sampling(top_p=1.5)), "top_p=1.5"),
    (dict(prompt_ids=[1], sampling=Sampling(top_k=0)), "top_k=0"),
    (dict(prompt_ids=[1], spec=SpecConfig("warp")), "mode='warp'"),
    (dict(prompt_ids=[1], spec="sync leaves=-1"), "leaves=-1"),
    (dict(prompt_ids=[1], spec="sync lookahead=3"), "'lookahead=3' is not NAME=VALUE"),
])
def test_bad_generate_arguments(ckpt, kwargs, message):
    model = load_model(ckpt)
    with pytest.raises(ValueError, match=message):
        generate(model, **{"max_new_tokens": 4, **kwargs})


def test_a_killed_save_keeps_the_previous_checkpoint(ckpt, tmp_path, monkeypatch):
    """Every file is written through a temporary file and renamed (d3d.files): a save that dies
    half-way (here: the weights writer raises after writing part of its file) leaves the previous
    checkpoint loadable and no temporary files behind."""
    import d3d.model.checkpoint as checkpoint
    from d3d.model.checkpoint import save_model
    from d3d.files import atomic, write_json

    model = load_model(ckpt, dtype="float32")
    out = tmp_path / "saved"
    save_model(model, out)
    before = load_model(out, dtype="float32").state_dict()
    mask = os.umask(0o022)  # files come out readable as open() makes them (safetensors alone: 0600)
    os.umask(mask)
    assert {f.name: f.stat().st_mode & 0o777 for f in out.iterdir()} == {
        f.name: 0o666 & ~mask for f in out.iterdir()}

    def dies_half_way(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_file", dies_half_way)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        save_model(model, out)
    after = load_model(out, dtype="float32").state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]

    write_json(out / "summary.json", {"step": 1})
    with pytest.raises(RuntimeError), atomic(out / "summary.json") as tmp:
        tmp.write_text('{"step": ')
        raise RuntimeError("killed")
    assert json.loads((out / "summary.json").read_text()) == {"step": 1}
