"""The DFlash baseline drafter: block diffusion conditioned on the target's hidden states.

DFlash (arXiv 2602.06036) drafts a block ``[anchor, mask x (B-1)]`` in one pass of a few Qwen3
layers that share the target's embedding and LM head. It is conditioned on the *target's*
hidden states of every committed token: the outputs of ``n`` evenly spaced target layers
(``target_layer_ids``) are concatenated, projected by a bias-free linear layer and RMS-normed
into one context vector per token; every drafter layer turns the context vectors into extra
keys/values with its own k/v projections (K-norm and RoPE at the tokens' positions). The
block's queries see all context keys and the whole block (non-causal inside the block).

Because the next draft needs this round's target hidden states, DFlash is synchronous by
construction — the contrast with D3D, whose drafter needs only tokens.

The context K/V of each drafter layer live in an ordinary ``KVCache`` (one entry per committed
token but the anchor); the block's own K/V are never cached (``packed_attention`` with ``k``
given reads the cache and the new keys side by side).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..cpu import linear as cpu_linear
from ..cpu.precision import auto_weights
from ..model.cache import KVCache, make_layout
from ..model.checkpoint import SHARED_EMBEDDINGS, is_quantized_checkpoint, read_state, save_model
from ..model.config import ModelConfig
from ..kernels import use_triton
from ..kernels.attention import attend_torch, packed_attention
from ..model.transformer import RMSNorm, Transformer, apply_rope


def target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's rule: target layers (0-based) whose outputs condition the drafter.

    One drafter layer reads the middle target layer (L // 2); n > 1 read n layers spread evenly
    from layer 1 to layer L - 3 (rounded).
    """
    if num_draft_layers < 1 or num_target_layers < 1:
        raise ValueError("layer counts must be positive")
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end < start:
        raise ValueError(f"a {num_target_layers}-layer target is too shallow for DFlash's rule (needs >= 4 layers)")
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass
class DFlashConfig:
    """The ``"dflash"`` section of a DFlash drafter's config.json."""

    block_size: int = 16
    mask_token_id: int = 0
    target_vocab: int = 0
    target_layer_ids: tuple[int, ...] = ()


class DFlashDrafter(nn.Module):
    """Drafter layers (a ``Transformer`` whose embedding/LM head are the target's) + the context projection."""

    def __init__(self, cfg: ModelConfig, dcfg: DFlashConfig, target: Transformer):
        super().__init__()
        self.cfg, self.dcfg = cfg, dcfg
        self.model = Transformer(cfg)
        self.model.embed_tokens = target.embed_tokens  # shared and frozen
        self.model.lm_head = target.lm_head
        d = cfg.hidden_size
        self.fc = nn.Linear(len(dcfg.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)

    @property
    def block_size(self) -> int:
        return self.dcfg.block_size

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """Indices for ``Transformer.forward(hidden_layers=...)``: output of target layer i is i + 1."""
        return tuple(i + 1 for i in self.dcfg.target_layer_ids)

    def new_cache(self, rows: int, max_len: int) -> KVCache:
        # fp32 on a CPU, as the models' own caches (``Transformer.cache_dtype``: SDPA is faster there)
        return KVCache(self.cfg, rows, max_len, self.model.cache_dtype, self.fc.weight.device)

    def context(self, hidden: list[torch.Tensor]) -> torch.Tensor:
        """[T, d] context vectors from the target's hidden states (one [T, d] per chosen layer)."""
        return self.hidden_norm(self.fc(torch.cat(hidden, dim=-1)))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor):
        """Per drafter layer: (k, v) [T, Hkv, D] of the context vectors at ``positions``."""
        cfg = self.cfg
        cos, sin = self.model.rope()
        cos, sin = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
        out = []
        for layer in self.model.layers:
            attn = layer.self_attn
            _, k, v = attn.qkv_proj(ctx).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            k = k.view(-1, cfg.num_key_value_heads, cfg.head_dim)
            v = v.view(-1, cfg.num_key_value_heads, cfg.head_dim)
            if cfg.qk_norm:
                k = attn.k_norm(k)
            out.append((apply_rope(k, cos, sin), v))
        return out

    @torch.inference_mode()
    def append_context(self, cache: KVCache, rows: list[int], hidden: list[torch.Tensor], lens: list[int]) -> None:
        """Append the context of ``lens[i]`` committed tokens of row ``rows[i]`` (packed in ``hidden``)."""
        layout = cache.layout(lens, rows)
        for layer_cache_k, layer_cache_v, (k, v) in zip(cache.k, cache.v,
                                                        self.context_kv(self.context(hidden), layout.positions)):
            layer_cache_k[layout.write_rows, :, layout.slots] = k.to(layer_cache_k.dtype)
            layer_cache_v[layout.write_rows, :, layout.slots] = v.to(layer_cache_v.dtype)
        cache.advance(layout)

    def block_forward(self, ids: torch.Tensor, layout, k_ctx: list[torch.Tensor], v_ctx: list[torch.Tensor]):
        """Hidden states [T, d] of packed blocks (``layout``: cache_lens = context lengths).

        The blocks' own K/V are not cached (given to attention beside the context cache); q/k norm
        and RoPE are the target-shaped layers' own (``Attention.qkv``); on the CPU the attention
        plan is built once per pass, not per layer (per layer it had cost a draft twice the D3D
        drafter's time for the same layer count: docs/results.md, "Measurements behind the code")."""
        cfg = self.cfg
        cos, sin = self.model.rope()
        cos, sin = cos[layout.positions].unsqueeze(1), sin[layout.positions].unsqueeze(1)
        x = self.model.embed_tokens(ids)
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            q, k, v = attn.qkv(layer.input_layernorm(x), cos, sin, k_ctx[i].dtype)
            if use_triton(q):
                o = packed_attention(q, k.to(q.dtype), v.to(q.dtype), k_ctx[i], v_ctx[i], layout.cu_seqlens,
                                     layout.cache_lens, layout.group_ids, cache_rows=layout.rows,
                                     max_seqlen=layout.max_seqlen)
            else:
                o = attend_torch(q, k, v.to(q.dtype), k_ctx[i], v_ctx[i], layout.sdpa_plan(), cfg.head_dim ** -0.5)
            x = x + attn.o_proj(o.reshape(-1, cfg.q_size).to(x.dtype))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.norm(x)

    @torch.inference_mode()
    def draft(self, cache: KVCache, rows: list[int], anchors: list[int], num_masks: int) -> torch.Tensor:
        """Greedy drafts [N, num_masks] after each anchor, from the block ``[anchor, mask x num_masks]``."""
        n, blk, dev = len(rows), num_masks + 1, self.fc.weight.device
        ids = torch.full((n, blk), self.dcfg.mask_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = torch.tensor(anchors, device=dev)
        layout = make_layout(rows, [blk] * n, [cache.lengths[r] for r in rows], dev, [[0] * blk] * n)
        h = self.block_forward(ids.flatten(), layout, cache.k, cache.v).view(n, blk, -1)[:, 1:]
        return cpu_linear.linear(h, self.model.output_weight()).argmax(-1)


# ----------------------------------------------------------------------------- files

def save_dflash(drafter: DFlashDrafter, path: str | Path, dtype=None) -> None:
    path = Path(path)
    save_model(drafter.model, path, dtype=dtype, exclude=("model.embed_tokens.weight", "lm_head.weight"),
               extra={"fc.weight": drafter.fc.weight, "hidden_norm.weight": drafter.hidden_norm.weight},
               config_extra={"dflash": {**asdict(drafter.dcfg), "target_layer_ids": list(drafter.dcfg.target_layer_ids)}})


def load_dflash(path: str | Path, target: Transformer, dtype=None, weights: str = "auto") -> DFlashDrafter:
    """Load a DFlash drafter directory beside ``target`` (on its device, sharing its embedding and head).
    ``weights`` and ``dtype``: ``load_drafter``'s (``d3d.cpu.precision.auto_weights``); ``"auto"`` follows the
    target (quantized beside a quantized target, else dense in its dtype); a choice computing in another
    dtype than the target's is refused (the drafter reads the target's hidden states). The context
    projection ``fc`` stays dense."""
    path = Path(path)
    cfg = ModelConfig.load(path)
    source = str(path / "config.json")
    section = cfg.extra.get("dflash")
    if not isinstance(section, dict):
        raise ValueError(f"{source}: not a DFlash drafter config (no 'dflash' section)")
    dcfg = DFlashConfig(**{**section, "target_layer_ids": tuple(section.get("target_layer_ids", ()))})
    if dcfg.target_vocab != target.cfg.vocab_size or cfg.hidden_size != target.cfg.hidden_size:
        raise ValueError(f"{source}: drafter (vocab {dcfg.target_vocab}, hidden {cfg.hidden_size}) does not match "
                         f"the target (vocab {target.cfg.vocab_size}, hidden {target.cfg.hidden_size})")
    bad = [i for i in dcfg.target_layer_ids if not 0 <= i < target.cfg.num_hidden_layers]
    if bad or not dcfg.target_layer_ids:
        raise ValueError(f"{source}: target_layer_ids {list(dcfg.target_layer_ids)} invalid for a "
                         f"{target.cfg.num_hidden_layers}-layer target")
    choice = auto_weights(weights, dtype, target.device, cfg, is_quantized_checkpoint(path), follow=target.weights)
    computes = choice.compute_dtype(dtype, target.device, cfg.torch_dtype)
    if computes != target.dtype:  # it reads the target's hidden states
        raise ValueError(f"{source}: weights={weights!r} and dtype={dtype!r} compute in "
                         f"{str(computes).removeprefix('torch.')}, the target in "
                         f"{str(target.dtype).removeprefix('torch.')}: a DFlash drafter computes in its target's dtype")
    state, tensors = read_state(path, cfg, skip=SHARED_EMBEDDINGS, extra={
        "fc.weight": (cfg.hidden_size, len(dcfg.target_layer_ids) * cfg.hidden_size),
        "hidden_norm.weight": (cfg.hidden_size,)}, keep_quantized=choice.quantized)
    with torch.device("meta"):
        drafter = DFlashDrafter(cfg, dcfg, target)
    drafter.model.load_weights(state, choice, dtype, target.device, strict=False)
    for module, name in ((drafter.fc, "fc.weight"), (drafter.hidden_norm, "hidden_norm.weight")):
        module.weight = nn.Parameter(tensors[name].to(target.device, drafter.model.dtype), requires_grad=False)
    leftover = [n for n, p in drafter.named_parameters() if p.is_meta]
    if leftover:
        raise ValueError(f"{source}: parameters not loaded: {leftover[:5]}")
    return drafter.eval()
