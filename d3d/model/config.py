"""Model configuration: one dataclass for Qwen3 and Qwen2, read from and written to HF `config.json`.

Two `config.json` layouts exist in the wild and both are accepted:
  old: ``"rope_theta": 1e6, "torch_dtype": "bfloat16"``
  new: ``"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}, "dtype": "bfloat16"``
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..files import write_json

# model_type -> (attention biases on q/k/v, per-head RMSNorm on q and k)
ARCHITECTURES = {
    "qwen3": dict(attention_bias=False, qk_norm=True, hf_class="Qwen3ForCausalLM"),
    "qwen2": dict(attention_bias=True, qk_norm=False, hf_class="Qwen2ForCausalLM"),
}

_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


@dataclass
class ModelConfig:
    model_type: str = "qwen3"
    vocab_size: int = 151936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    qk_norm: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    torch_dtype: str = "float32"
    # Anything else in config.json that we do not interpret (kept so a save round-trips it,
    # e.g. the drafter's "d3d" section).
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.model_type not in ARCHITECTURES:
            raise ValueError(
                f"unknown model_type {self.model_type!r}: supported are {sorted(ARCHITECTURES)}"
            )
        problems = []
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name}={value!r} must be a positive integer")
        if not problems and self.num_attention_heads % self.num_key_value_heads:
            problems.append(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2 if isinstance(self.head_dim, int) else False:
            problems.append(f"head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        if problems:
            raise ValueError("invalid model config: " + "; ".join(problems))

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id)

    def num_parameters(self, include_embeddings: bool = True) -> int:
        d, f, q, kv = self.hidden_size, self.intermediate_size, self.q_size, self.kv_size
        per_layer = d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d
        if self.attention_bias:
            per_layer += q + 2 * kv
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        total = self.num_hidden_layers * per_layer + d
        if include_embeddings:
            total += self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return total

    # ------------------------------------------------------------------ HF config.json

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        """Build from a parsed HF ``config.json`` (old or new layout). ``source`` names the file in errors."""
        if not isinstance(raw, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        model_type = raw.get("model_type")
        if model_type is None:
            raise ValueError(f"{source}: missing field 'model_type'")
        if model_type not in ARCHITECTURES:
            raise ValueError(
                f"{source}: unknown model_type {model_type!r}; supported are {sorted(ARCHITECTURES)}"
            )
        missing = [k for k in _REQUIRED if k not in raw]
        if missing:
            raise ValueError(f"{source}: missing field(s) {', '.join(missing)}")
        arch = ARCHITECTURES[model_type]
        heads = raw["num_attention_heads"]
        rope = raw.get("rope_parameters") or {}
        rope_theta = rope.get("rope_theta", raw.get("rope_theta"))
        if rope_theta is None:
            raise ValueError(f"{source}: missing 'rope_theta' (or 'rope_parameters.rope_theta')")
        rope_type = rope.get("rope_type", (raw.get("rope_scaling") or {}).get("rope_type", "default"))
        if rope_type not in (None, "default"):
            raise ValueError(f"{source}: rope_type {rope_type!r} is not supported (only 'default')")
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        known = set(_REQUIRED) | {
            "model_type", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
            "rope_parameters", "rope_scaling", "max_position_embeddings", "tie_word_embeddings",
            "attention_bias", "bos_token_id", "eos_token_id", "torch_dtype", "dtype",
        }
        try:
            return cls(
                model_type=model_type,
                vocab_size=raw["vocab_size"],
                hidden_size=raw["hidden_size"],
                intermediate_size=raw["intermediate_size"],
                num_hidden_layers=raw["num_hidden_layers"],
                num_attention_heads=heads,
                num_key_value_heads=raw.get("num_key_value_heads") or heads,
                head_dim=head_dim,
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta),
                max_position_embeddings=raw.get("max_position_embeddings", 32768),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                attention_bias=bool(raw.get("attention_bias", arch["attention_bias"])),
                qk_norm=arch["qk_norm"],
                bos_token_id=raw.get("bos_token_id"),
                eos_token_id=raw.get("eos_token_id"),
                torch_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
                extra={k: v for k, v in raw.items() if k not in known},
            )
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def to_hf(self) -> dict[str, Any]:
        """The ``config.json`` dict. Writes both rope layouts so old and new readers agree."""
        arch = ARCHITECTURES[self.model_type]
        out = dict(self.extra)
        out.update(
            architectures=[arch["hf_class"]],
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            hidden_act="silu",
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_parameters={"rope_theta": self.rope_theta, "rope_type": "default"},
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            attention_bias=self.attention_bias,
            use_sliding_window=False,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            torch_dtype=self.torch_dtype,
            dtype=self.torch_dtype,
        )
        return out

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        """Read ``path`` (a config.json file or a directory that holds one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (expected a HF config.json)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_hf(raw, source=str(path))

    def save(self, path: str | Path, extra: dict | None = None) -> None:
        """Write ``config.json`` (into ``path`` if it is a directory), with ``extra`` top-level entries."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        write_json(path, {**self.to_hf(), **(extra or {})})

    def replace(self, **changes) -> "ModelConfig":
        d = asdict(self)
        d.update(changes)
        return ModelConfig(**d)


# Presets used by tests and benchmarks (Qwen3 shapes; vocab matches the real Qwen3 tokenizer).
PRESETS: dict[str, dict[str, Any]] = {
    # a few hundred thousand parameters besides the embedding: for trying the pipeline quickly.
    "qwen3-tiny": dict(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       max_position_embeddings=2048, tie_word_embeddings=True),
    # ~15M parameters without embeddings: overhead-bound on a CPU.
    "qwen3-15m": dict(vocab_size=8192, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                      max_position_embeddings=4096, tie_word_embeddings=True),
    # ~100M parameters: memory-bound on a CPU.
    "qwen3-100m": dict(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                       num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                       max_position_embeddings=4096, tie_word_embeddings=True),
    # the shape of Qwen3-1.7B (random weights): the GPU pass-cost bench (python -m bench gpu).
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, rope_theta=1000000.0, tie_word_embeddings=True),
}


def preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: choose from {sorted(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
