"""convert-gguf on a tiny GGUF written with the gguf package from a random transformers model."""

from pathlib import Path

import numpy as np
import pytest
import torch

import d3d

from helpers import make_hf_model

gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed (pip install -e '.[gguf]')")

REVERSE = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
BLOCK = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


def to_gguf_name(name):
    if name in REVERSE:
        return REVERSE[name]
    _, _, i, rest = name.split(".", 3)
    return f"blk.{i}.{BLOCK[rest]}"


def write_gguf(hf, path: Path, arch: str, skip: str | None = None):
    cfg = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) else cfg.rope_theta)
    if arch == "qwen3":
        w.add_key_length(cfg.head_dim)
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings or name == skip:
            continue
        w.add_tensor(to_gguf_name(name), t.float().numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_converted_model_matches_transformers(tmp_path, kind):
    hf = make_hf_model(kind, heads=4, kv_heads=2, head_dim=16, hidden=64, max_pos=128)
    write_gguf(hf, tmp_path / "m.gguf", kind)
    d3d_main = __import__("d3d.__main__", fromlist=["main"]).main
    assert d3d_main(["convert-gguf", str(tmp_path / "m.gguf"), str(tmp_path / "hf")]) == 0
    model = d3d.load_model(tmp_path / "hf")
    ids = torch.randint(0, hf.config.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=2e-5, rtol=2e-5)
    assert (tmp_path / "hf" / "tokenizer.json").exists()


def test_bad_gguf_inputs(tmp_path):
    from d3d.model.gguf import convert_gguf

    hf = make_hf_model("qwen2", heads=4, kv_heads=2, hidden=64, max_pos=128)
    write_gguf(hf, tmp_path / "llama.gguf", "llama")
    with pytest.raises(ValueError, match="architecture 'llama' is not supported"):
        convert_gguf(tmp_path / "llama.gguf", tmp_path / "o1")
    write_gguf(hf, tmp_path / "missing.gguf", "qwen2", skip="model.layers.1.mlp.up_proj.weight")
    with pytest.raises(ValueError, match="missing tensor"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "o2")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match="not a readable GGUF"):
        convert_gguf(tmp_path / "junk.gguf", tmp_path / "o3")


def test_conversion_is_all_or_nothing(tmp_path, monkeypatch):
    """Dependencies are checked before any work, and a conversion that fails part-way (or is
    killed) leaves no directory that looks like a checkpoint; a re-run then succeeds."""
    import d3d.model.gguf as g

    hf = make_hf_model("qwen3", heads=4, kv_heads=2, head_dim=16, hidden=64, max_pos=128)
    write_gguf(hf, tmp_path / "m.gguf", "qwen3")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        g.convert_gguf(tmp_path / "m.gguf", tmp_path / "out", tokenizer_dir=tmp_path / "no-tokenizer")
    assert not (tmp_path / "out").exists()

    def dies(*a, **kw):
        raise KeyboardInterrupt  # as if killed while writing the weights

    monkeypatch.setattr(g, "save_file", dies)
    with pytest.raises(KeyboardInterrupt):
        g.convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]  # no out/, no partial directory
    monkeypatch.undo()
    g.convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert d3d.load_model(tmp_path / "out").cfg.num_hidden_layers == hf.config.num_hidden_layers
    with pytest.raises(FileExistsError, match="not an empty directory"):
        g.convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
