"""Hugging Face checkpoint directories: ``config.json`` + ``*.safetensors`` (single or sharded).

Loading goes through one explicit name map (our parameter -> the HF tensors it is made of) and
checks every tensor's shape; anything missing, unexpected, misshapen or unreadable is an error
that names the file and the tensor. The model is built on the meta device, so no memory is
spent on random initialisation, and the checkpoint tensors are assigned directly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import ModelConfig
from ..files import atomic, write_json
from .transformer import Transformer
from ..cpu import hugepages
from ..cpu.precision import DTYPES, auto_weights
from ..cpu.quant import Factored, QuantWeight, is_quantized, join, quantize


def parse_dtype(dtype: str | torch.dtype | None, what: str = "dtype") -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"{what}={dtype!r}: expected one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def name_map(cfg: ModelConfig, prefix: str = "model.") -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """Our parameter name -> [(HF tensor name, shape), ...], concatenated along dim 0 in that order."""
    d, f, q, kv, hd = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size, cfg.head_dim
    m: dict[str, list[tuple[str, tuple[int, ...]]]] = {"embed_tokens.weight": [(f"{prefix}embed_tokens.weight", (cfg.vocab_size, d))]}
    for i in range(cfg.num_hidden_layers):
        hf, ours = f"{prefix}layers.{i}.", f"layers.{i}."
        m[ours + "input_layernorm.weight"] = [(hf + "input_layernorm.weight", (d,))]
        m[ours + "self_attn.qkv_proj.weight"] = [(hf + "self_attn.q_proj.weight", (q, d)),
                                                 (hf + "self_attn.k_proj.weight", (kv, d)),
                                                 (hf + "self_attn.v_proj.weight", (kv, d))]
        if cfg.attention_bias:
            m[ours + "self_attn.qkv_proj.bias"] = [(hf + "self_attn.q_proj.bias", (q,)),
                                                   (hf + "self_attn.k_proj.bias", (kv,)),
                                                   (hf + "self_attn.v_proj.bias", (kv,))]
        m[ours + "self_attn.o_proj.weight"] = [(hf + "self_attn.o_proj.weight", (d, q))]
        if cfg.qk_norm:
            m[ours + "self_attn.q_norm.weight"] = [(hf + "self_attn.q_norm.weight", (hd,))]
            m[ours + "self_attn.k_norm.weight"] = [(hf + "self_attn.k_norm.weight", (hd,))]
        m[ours + "post_attention_layernorm.weight"] = [(hf + "post_attention_layernorm.weight", (d,))]
        m[ours + "mlp.gate_up_proj.weight"] = [(hf + "mlp.gate_proj.weight", (f, d)), (hf + "mlp.up_proj.weight", (f, d))]
        m[ours + "mlp.down_proj.weight"] = [(hf + "mlp.down_proj.weight", (d, f))]
    m["norm.weight"] = [(f"{prefix}norm.weight", (d,))]
    if not cfg.tie_word_embeddings:
        m["lm_head.weight"] = [("lm_head.weight", (cfg.vocab_size, d))]
    return m


def weight_files(path: Path) -> dict[str, Path]:
    """HF tensor name -> the file holding it (reads the shard index when there is one)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: not a valid shard index ({e!r})") from None
        files = {name: path / fname for name, fname in weight_map.items()}
        for f in set(files.values()):
            if not f.is_file():
                raise FileNotFoundError(f"{f}: listed in {index.name} but missing")
        return files
    single = path / "model.safetensors"
    if not single.is_file():
        found = sorted(p.name for p in path.glob("*.safetensors"))
        hint = f" (found {found} but no model.safetensors.index.json)" if found else ""
        raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json{hint}")
    return {name: single for name in _open(single).keys()}


def _open(file: Path):
    try:
        return safe_open(str(file), framework="pt")
    except Exception as e:  # SafetensorError, OSError, ... : the type varies by failure
        raise ValueError(f"{file}: not a readable safetensors file ({e})") from None


def read_tensors(path: Path, wanted: dict[str, tuple[int, ...]], optional: set[str] = frozenset(),
                 lazy: bool = False, partial: bool = False) -> dict[str, torch.Tensor]:
    """Read exactly the tensors in ``wanted`` (name -> shape, or None: checked by the caller) from
    the directory ``path``.

    Every name must be present with that shape; any other tensor in the files is an error,
    except those in ``optional`` (read if present and shape-checked, e.g. a tied lm_head).
    ``lazy``: return a ``LazyTensors`` that reads each tensor from its file when it is taken
    (a quantized checkpoint is converted matrix by matrix, never held whole next to its panels).
    ``partial``: the files may hold other tensors too; they are left unread.
    """
    files = weight_files(path)
    if partial:
        files = {n: f for n, f in files.items() if n in wanted or n in optional}
    missing = [n for n in wanted if n not in files]
    unexpected = [n for n in files if n not in wanted and n not in optional]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensor(s): {', '.join(missing[:8])}{' …' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"unexpected tensor(s): {', '.join(unexpected[:8])}{' …' if len(unexpected) > 8 else ''}")
        raise ValueError(f"{path}: checkpoint does not match config.json: " + "; ".join(parts))

    def check(f, name, shape):
        want = wanted.get(name)
        if want is not None and tuple(shape) != tuple(want):
            raise ValueError(f"{f}: tensor {name!r} has shape {tuple(shape)}, config.json implies {tuple(want)}")

    if lazy:
        entries = {}
        for f in set(files.values()):
            for name, (dtype, shape, start, end) in _header(f).items():
                if name in files:
                    check(f, name, shape)
                    entries[name] = (f, dtype, shape, start, end)
        return LazyTensors(entries)
    out: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name, f in files.items():
        by_file.setdefault(f, []).append(name)
    for f, names in by_file.items():
        handle = _open(f)
        with handle as sf:
            for name in names:
                try:
                    t = sf.get_tensor(name)
                except Exception as e:
                    raise ValueError(f"{f}: cannot read tensor {name!r} ({e})") from None
                check(f, name, t.shape)
                out[name] = t
    return out


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


def _header(file: Path) -> dict:
    """A safetensors file's index: name -> (dtype, shape, absolute start, end)."""
    try:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            meta = json.loads(f.read(n))
        return {name: (_ST_DTYPES[e["dtype"]], tuple(e["shape"]), 8 + n + e["data_offsets"][0],
                       8 + n + e["data_offsets"][1]) for name, e in meta.items() if name != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{file}: not a readable safetensors file ({e!r})") from None


class LazyTensors:
    """name -> tensor, read from its file (into memory of its own, no mmap) when taken with ``pop``,
    ``get`` or ``[]``; values set with ``[]=`` are kept as given."""

    def __init__(self, entries: dict):
        self.entries, self.kept = entries, {}

    def _read(self, name):
        file, dtype, shape, start, end = self.entries[name]
        buf = bytearray(end - start)
        with open(file, "rb") as f:
            f.seek(start)
            if f.readinto(buf) != len(buf):
                raise ValueError(f"{file}: tensor {name!r} is cut short")
        return torch.frombuffer(buf, dtype=dtype).reshape(shape) if buf else torch.empty(shape, dtype=dtype)

    def __contains__(self, name):
        return name in self.kept or name in self.entries

    def __getitem__(self, name):
        return self.kept[name] if name in self.kept else self._read(name)

    def __setitem__(self, name, value):
        self.entries.pop(name, None)
        self.kept[name] = value

    def get(self, name, default=None):
        return self[name] if name in self else default

    def pop(self, name, *default):
        if name in self.kept:
            return self.kept.pop(name)
        if name in self.entries:
            value = self._read(name)
            del self.entries[name]
            return value
        if default:
            return default[0]
        raise KeyError(name)


SHARED_EMBEDDINGS = ("embed_tokens.weight", "lm_head.weight")


QSCALE, QMIN, QHIGH = ".qscale", ".qmin", ".qhigh"  # a quantized matrix's scales, mins, high bits (``d3d.cpu.quant``)
FACTOR = "_d"  # ``.qscale_d``/``.qmin_d``: the fp16 super-block factors of ``Factored`` (int8) scales and mins
INT8_SCALE = ".int8_scale"  # the per-row scale [N] of drafters saved before QSCALE existed (read only)


def quant_tensors(name: str, w: QuantWeight | tuple) -> dict[str, torch.Tensor]:
    """The file tensors of a quantized matrix (or its row-major ``(q, scale, min, high)``) stored under
    the HF name ``name``: ``name`` holds q (int8 [N, K], or uint8 [N, K/2] for int4/int5),
    ``name.qscale`` [N, K/G] and ``name.qmin`` (int4) fp32 — or, ``Factored``, int8 with their fp16
    factors in ``name.qscale_d``/``name.qmin_d`` [N, D] — and ``name.qhigh`` (int5's high bits, uint8 [N, K/8])."""
    q, scale, mins, high = w.parts() if isinstance(w, QuantWeight) else w
    out = {name: q.contiguous()}
    for key, t in ((QSCALE, scale), (QMIN, mins)):
        if isinstance(t, Factored):
            out[name + key], out[name + key + FACTOR] = t.f.contiguous(), t.d.half().contiguous()
        elif t is not None:
            out[name + key] = t.float().contiguous()
    if high is not None:
        out[name + QHIGH] = high.contiguous()
    return out


def _quant_parts(tensors: dict, name: str, shape: tuple[int, ...], where: Path) -> tuple:
    """The row-major ``(q, scale, min, high)`` of the quantized matrix ``name``, shape-checked."""
    scale = tensors.pop(name + QSCALE, None)
    if scale is None:
        scale = tensors.pop(name + INT8_SCALE).float()[:, None]
    q, mins, high = tensors.pop(name), tensors.pop(name + QMIN, None), tensors.pop(name + QHIGH, None)
    scale_d, mins_d = tensors.pop(name + QSCALE + FACTOR, None), tensors.pop(name + QMIN + FACTOR, None)
    if scale_d is not None:
        scale = Factored(scale, scale_d.float())
    if mins_d is not None:
        mins = Factored(mins, mins_d.float())
    k = q.shape[1] * (1 if q.dtype == torch.int8 else 2) if q.dim() == 2 else None
    if q.dim() != 2 or q.dtype not in (torch.int8, torch.uint8) or (q.shape[0], k) != tuple(shape):
        raise ValueError(f"{where}: tensor {name!r}: q must be 2-D int8 (int8) or uint8 (int4/int5, two per byte) "
                         f"holding {tuple(shape)} as config.json implies, got {q.dtype} {tuple(q.shape)}")
    return q, scale, mins, high


def read_state(path: Path, cfg: ModelConfig, skip: tuple[str, ...] = (),
               extra: dict[str, tuple[int, ...]] | None = None, keep_quantized: bool = False,
               partial: bool = False) -> tuple[dict, dict]:
    """Read the weights of ``cfg`` from ``path`` through the name map, shape-checked.

    skip: our parameter names not stored in the files (a drafter's shared embedding/LM head), or, with
    ``partial``, not to be read from them (``load_embeddings``).
    extra: further HF tensors (name -> shape) the files must hold (a DFlash projection).
    Quantized matrices (``name`` + ``.qscale``/``.qmin``, or a drafter's ``.int8_scale``) are
    recognised by their tensors: with ``keep_quantized`` they come back as ``d3d.cpu.quant`` matrices
    (fused projections joined by ``quant.join``), else dequantized to fp32.
    Returns ``(state under our names with fused projections joined, extra tensors)``.
    """
    nmap = {k: v for k, v in name_map(cfg).items() if k not in skip}
    wanted: dict[str, tuple[int, ...] | None] = {hf: shape for parts in nmap.values() for hf, shape in parts}
    names = set(weight_files(path))
    quantized = {hf: shape for hf, shape in wanted.items()
                 if len(shape) == 2 and (hf + QSCALE in names or hf + INT8_SCALE in names)}
    optional = {"lm_head.weight"} if cfg.tie_word_embeddings and not skip else set()  # a tied copy may be stored
    for hf in quantized:
        wanted[hf] = None  # q's shape depends on the format: checked below
        wanted[hf + (QSCALE if hf + QSCALE in names else INT8_SCALE)] = None
        optional.update({hf + QMIN, hf + QHIGH, hf + QSCALE + FACTOR, hf + QMIN + FACTOR})
    wanted.update(extra or {})
    tensors = read_tensors(path, wanted, optional, lazy=bool(quantized), partial=partial)
    state = {}
    # one matrix at a time, its file bytes freed once it is in panels; the largest first, while little else is
    # held, so the peak is the model plus a small matrix's temporaries, not plus the LM head's
    by_size = sorted(nmap.items(), key=lambda item: -sum(math.prod(shape) for _, shape in item[1]))
    for ours, parts in by_size:
        ws = [_quant_parts(tensors, hf, shape, path) if hf in quantized else tensors.pop(hf) for hf, shape in parts]
        if any(hf in quantized for hf, _ in parts):
            if not all(hf in quantized for hf, _ in parts):
                raise ValueError(f"{path}: {', '.join(hf for hf, _ in parts)} are fused into one matrix, but only "
                                 f"some of them are quantized")
            w = join(ws, what=f"{path}: {', '.join(hf for hf, _ in parts)}")
            state[ours] = w if keep_quantized else w.dequantize()
        else:
            state[ours] = torch.cat(ws) if len(ws) > 1 else ws[0]
    extras = {k: tensors[k] for k in (extra or {})}
    return state, extras


def is_quantized_checkpoint(path: Path) -> bool:
    """Whether the checkpoint directory ``path`` stores quantized matrices."""
    return any(n.endswith((QSCALE, INT8_SCALE)) for n in weight_files(Path(path)))


def load_model(
    path: str | Path,
    dtype: str | torch.dtype | None = "auto",
    device: str | torch.device = "cpu",
    cfg: ModelConfig | None = None,
    weights: str = "auto",
) -> Transformer:
    """Load a Qwen3/Qwen2 checkpoint directory into a ``Transformer`` in eval mode.

    dtype: ``"auto"`` (default): the dtype policy of ``d3d.cpu.precision`` — bf16 on a CPU with fast
        bf16 matmuls, fp32 on other CPUs, the checkpoint's dtype on a GPU.
    weights: how the matrices are held (``d3d.cpu.precision.auto_weights``): ``"auto"`` (default) keeps a
        quantized checkpoint quantized and gives a dense one int8 where that is faster on this CPU;
        ``"fp32"``/``"bf16"`` dense (a quantized checkpoint is dequantized); ``"int8"``/``"int4"``
        quantize dense matrices (a quantized checkpoint keeps its own blocks). Quantized models
        compute in fp32 on a CPU, so ``dtype`` and ``weights`` must agree (a ValueError names both where
        they do not); with ``weights="auto"`` an explicit ``dtype`` wins. The choice is the model's
        ``weights_choice`` (``Transformer.load_weights``, the drafter's too).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a directory (expected a HF checkpoint directory)")
    cfg = cfg or ModelConfig.load(path)
    device = torch.device(device)
    choice = auto_weights(weights, dtype, device, cfg, is_quantized_checkpoint(path))
    state, _ = read_state(path, cfg, keep_quantized=choice.quantized)
    with torch.device("meta"):
        model = Transformer(cfg)
    model.load_weights(state, choice, dtype, device)
    model.source = path.resolve()
    hugepages.advise_model(model)  # before any kernel binds to the matrices
    hugepages.trim_heap()
    return model


class Embeddings:
    """A checkpoint's token embedding and output matrix, and nothing else (``load_embeddings``): what a
    standalone drafter borrows from the model it was made from, whatever its target."""

    def __init__(self, embed_tokens: torch.nn.Module, output):
        self.embed_tokens, self._output = embed_tokens, output

    def output_weight(self):
        return self._output


def load_embeddings(path: str | Path) -> Embeddings:
    """Read only the embedding and the LM head (the embedding where tied) of the checkpoint at ``path``:
    quantized matrices stay quantized (a lookup dequantizes the rows it reads), dense ones are fp32."""
    from .transformer import QuantEmbedding

    path = Path(path)
    cfg = ModelConfig.load(path)
    others = tuple(k for k in name_map(cfg) if k not in SHARED_EMBEDDINGS)
    state, _ = read_state(path, cfg, skip=others, keep_quantized=True, partial=True)
    w = state["embed_tokens.weight"]
    embed = QuantEmbedding(w) if is_quantized(w) else torch.nn.Embedding.from_pretrained(w.float(), freeze=True)
    head = state.get("lm_head.weight", w)
    return Embeddings(embed, head if is_quantized(head) else head.float())


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under HF names (fused projections split back)."""
    ours = model.state_dict()
    out = {}
    for name, parts in name_map(model.cfg).items():
        if len(parts) == 1:  # not fused: kept whole (a drafter's reduced LM head has its own row count)
            out[parts[0][0]] = ours[name]
            continue
        pieces = ours[name].split([shape[0] for _, shape in parts], dim=0)
        for (hf, _), t in zip(parts, pieces):
            out[hf] = t
    return out


def save_model(model: Transformer, path: str | Path, dtype: str | torch.dtype | None = None,
               max_shard_bytes: int | None = None, exclude: tuple[str, ...] = (),
               extra: dict[str, torch.Tensor] | None = None, int8: bool = False,
               config_extra: dict | None = None) -> None:
    """Write ``config.json`` and safetensors (sharded with an index when over ``max_shard_bytes``).

    ``exclude``: HF tensor names to leave out (a drafter's shared embedding, for instance).
    ``extra``: further tensors to store under their own names (floating ones cast to ``dtype``,
    integer ones kept as they are: a drafting vocabulary, a DFlash projection).
    ``int8``: store every matrix as int8 + a per-row fp32 scale (``d3d.cpu.quant.quantize``); vectors
    keep ``dtype``. ``read_state`` recognises them.
    ``config_extra``: further top-level ``config.json`` entries (a drafter's own settings).
    Every file is written atomically (``d3d.files``).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dtype = parse_dtype(dtype) or model.dtype
    tensors = {}
    for k, v in hf_state_dict(model).items():
        if k in exclude:
            continue
        if int8 and v.dim() == 2:
            tensors.update(quant_tensors(k, quantize(v.cpu(), "int8")))
        else:
            tensors[k] = v.detach().to("cpu", dtype).contiguous()
    for k, v in (extra or {}).items():
        tensors[k] = v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
    cfg = model.cfg.replace(torch_dtype=str(dtype).removeprefix("torch."))
    cfg.save(path, extra=config_extra)
    meta = {"format": "pt"}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        with atomic(path / "model.safetensors") as tmp:
            save_file(tensors, str(tmp), metadata=meta)
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        with atomic(path / fname) as tmp:
            save_file(shard, str(tmp), metadata=meta)
        weight_map.update({name: fname for name in shard})
    write_json(path / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
