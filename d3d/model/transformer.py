"""The transformer shared by target and drafter: Qwen3 (and Qwen2) written for reading.

One forward pass takes packed new tokens of N sequences, their cache rows and an attention
layout (see ``d3d.model.cache.PassLayout`` and ``d3d.kernels.attention``), appends their K/V to the
cache and returns logits. Called on a ``[batch, seq]`` LongTensor with no cache it is a plain
causal forward returning ``[batch, seq, vocab]``.

Shapes: T = packed new tokens, d = hidden, H/Hkv = query/KV heads, D = head_dim.

Two projections are fused for speed (q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``):
on a CPU with a small model every matmul call costs a fixed overhead whatever its size, and
fusing cuts 7 matmuls per layer to 4 (docs/results.md, "Measurements behind the code"). The checkpoint name map in ``d3d.model.checkpoint`` splits and
joins them, so files keep the Hugging Face names.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..cpu import linear as cpu_linear, prefill
from .cache import KVCache, PassLayout
from .config import ModelConfig
from ..kernels import glue_cpu, layers_cpu, use_triton
from ..kernels.attention import attend_torch, packed_attention
from ..kernels.attention_cpu import CpuPlan, attend_cpu, fits
from ..cpu.precision import WeightsChoice
from ..cpu.greedy_head import GreedyHead
from ..cpu.quant import QuantWeight, Stacked, is_quantized, quantize


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * w over the last dim, computed in fp32 and rounded once.

    On CPU, without autograd, one call of ``d3d.kernels.glue_cpu.rms_norm`` (docs/results/vnni-streams/);
    where it is not built, as LayerNorm of [x, -x]: that vector has mean 0 and variance mean(x^2), so the
    first half of LayerNorm's output (weight [w, 0]) is RMSNorm's (torch's CPU ``layer_norm`` is one
    fused kernel while ``rms_norm`` runs as a chain of small ops: docs/results.md, "Measurements behind
    the code").
    """
    d = x.shape[-1]
    if x.is_cuda or torch.is_grad_enabled():
        if weight is not None and weight.dtype != x.dtype:  # bf16 activations of fp32 weights (autocast)
            return F.rms_norm(x.float(), (d,), weight.float(), eps).to(x.dtype)
        return F.rms_norm(x, (d,), weight, eps)
    if glue_cpu.available() and x.dtype in (torch.float32, torch.bfloat16) and (
            weight is None or weight.dtype in (x.dtype, torch.float32)):
        return glue_cpu.rms_norm(x, weight, eps)
    return F.layer_norm(torch.cat([x, -x], dim=-1), (2 * d,), _padded(weight), None, eps)[..., :d]


def _padded(weight: torch.Tensor | None) -> torch.Tensor | None:
    """[w, 0...0], kept on the weight tensor (rebuilt if the weight changed in place)."""
    if weight is None:
        return None
    cached = getattr(weight, "_d3d_padded", None)
    if cached is None or cached[0] != weight._version:
        cached = (weight._version, F.pad(weight.detach(), (0, weight.shape[-1])))
        weight._d3d_padded = cached
    return cached[1]


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * w (``rms_norm``). In low precision the result is rounded
    once (HF rounds the normalised x, then the product: one rounding is closer to fp32)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_tables(cfg: ModelConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables ``(cos, signed_sin)`` [max_positions, D] in fp32 for ``apply_rope``.

    Non-interleaved halves, as HF: angle_j = pos * theta^(-2j/D) for j < D/2, repeated for both
    halves; ``signed_sin`` is sin with the first half negated, so that the rotation
    ``x * cos + rotate_half(x) * sin`` becomes ``x * cos + roll(x, D/2) * signed_sin``.
    """
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=device) / d))
    sign = torch.cat([-torch.ones(d // 2, dtype=torch.float64, device=device),
                      torch.ones(d // 2, dtype=torch.float64, device=device)])
    n = cfg.max_position_embeddings
    cos, sin = (torch.empty(n, d, device=device) for _ in range(2))
    for p in range(0, n, 4096):  # in chunks: the float64 temporaries of 32k positions would be ~100 MB
        t = torch.arange(p, min(n, p + 4096), dtype=torch.float64, device=device)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos[p: p + len(t)], sin[p: p + len(t)] = emb.cos(), emb.sin() * sign
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, dtype: torch.dtype | None = None
               ) -> torch.Tensor:
    """x: [..., heads, D]; cos/signed_sin: broadcastable (e.g. [T, 1, D], fp32, ``rope_tables``).

    x * cos + rotate_half(x) * sin, with rotate_half(x) * sin = roll(x, D/2) * signed_sin: three
    ops, computed in fp32 (cos is fp32) and rounded once to ``dtype`` (default: x's).
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin).to(dtype or x.dtype)


class Linear(nn.Linear):
    """``nn.Linear`` whose inference matmul goes through the weight's prepacked copy, if it has
    one (``d3d.cpu.linear``; ``Transformer.pack_for_cpu`` makes them)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_linear.linear(x, self.weight, self.bias)


class QuantLinear(nn.Module):
    """A linear layer over a quantized matrix (``d3d.cpu.quant``), swapped in whole where a ``Linear`` was
    (``Transformer.set_weight``; gpt-fast's ``WeightOnlyInt8Linear``). ``weight`` is the quantized matrix, a
    plain attribute (no Parameter: ``state_dict`` and ``.to()`` leave it alone); ``bias`` stays a Parameter.
    Its matmul is ``Linear``'s call, which hands a quantized matrix to its own kernel."""

    def __init__(self, weight, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight = weight
        self.register_parameter("bias", bias)
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_linear.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.weight!r}, bias={self.bias is not None}"


class QuantEmbedding(nn.Module):
    """The token embedding as a quantized matrix (``d3d.cpu.quant``): a lookup dequantizes only the rows it reads,
    and keeps them (up to ``KEPT`` rows, then it starts over): a row's dequantization is ~50 small torch ops,
    ~85 µs for one token of the 0.5B's int5 table and ~170 µs for 16, where a kept row costs a copy, and
    decoding reads the same tokens again and again (docs/results/pass-rest/). The drafter that borrows the
    table shares its rows."""

    KEPT = 8192  # rows: 29 MB of fp32 for the 0.5B's 896 wide, 50 MB for the 1.5B's 1536

    def __init__(self, weight):
        super().__init__()
        self.weight = weight
        self.num_embeddings, self.embedding_dim = weight.shape
        self._slot, self._rows, self._of = {}, torch.empty(0, self.embedding_dim), None  # token id -> row of _rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # a new matrix swapped in: its own rows; rows kept under inference_mode cannot be written outside it
        if self._of is not self.weight or (self._rows.is_inference() and not torch.is_inference_mode_enabled()):
            self._slot, self._rows, self._of = {}, torch.empty(0, self.embedding_dim), self.weight
        wanted = ids.reshape(-1).tolist()
        new = [i for i in dict.fromkeys(wanted) if i not in self._slot]
        if len(self._slot) + len(new) > self.KEPT:  # full: start over with this lookup's rows
            self._slot, new = {}, list(dict.fromkeys(wanted))
            if len(new) > self.KEPT:  # more distinct tokens than it keeps (a long prompt): dequantized as they are
                return self.weight.dequantize(ids.reshape(-1)).view(*ids.shape, self.embedding_dim)
        if new:
            rows = self.weight.dequantize(torch.tensor(new, dtype=torch.long))
            if len(self._slot) + len(new) > len(self._rows):  # grow by doubling, up to KEPT
                size = min(self.KEPT, max(2 * len(self._rows), len(self._slot) + len(new), 64))
                self._rows = torch.cat([self._rows[:len(self._slot)], self._rows.new_empty(size - len(self._slot),
                                                                                          self.embedding_dim)])
            first = len(self._slot)
            self._rows[first: first + len(new)] = rows
            self._slot.update((i, first + n) for n, i in enumerate(new))
        index = torch.tensor([self._slot[i] for i in wanted], dtype=torch.long)
        return self._rows.index_select(0, index).view(*ids.shape, self.embedding_dim)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.cpu_kernel_fits = fits(self.head_dim, self.n_heads, self.n_kv)  # else SDPA computes CPU decoding too
        self.qkv_proj = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def qk_norm_weight(self) -> torch.Tensor:
        """The QK norms' weights as one [H + Hkv, D] tensor: q's for each query head, then k's for each kv head."""
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        return torch.cat([self.q_norm.weight.expand(H, D), self.k_norm.weight.expand(Hkv, D)])

    def qkv(self, x, cos, sin, qk_dtype=None):
        """Projected, QK-normed and rotated q [.., H, D], k [.., Hkv, D] (in ``qk_dtype``, default
        x's) and v [.., Hkv, D].

        q and k are rotated together, as one [.., H + Hkv, D] tensor (one RoPE instead of two).
        """
        shape, H, Hkv, D = x.shape[:-1], self.n_heads, self.n_kv, self.head_dim
        qkv = self.qkv_proj(x)
        qk, v = qkv[..., : (H + Hkv) * D].unflatten(-1, (H + Hkv, D)), qkv[..., (H + Hkv) * D:]
        if self.cfg.qk_norm:  # both norms in one call: per-head RMSNorm, then each head's weight
            qk = rms_norm(qk, None, self.cfg.rms_norm_eps) * self.qk_norm_weight()
        q, k = apply_rope(qk, cos, sin, qk_dtype).split([H, Hkv], dim=-2)
        return q, k, v.view(*shape, Hkv, D)

    def fused_rope_write(self, x: torch.Tensor, k_cache: torch.Tensor) -> bool:
        """Whether ``glue_cpu.rope_write`` takes this pass's RoPE and cache writes: a packed CPU pass over an
        fp32 cache without QK norms (Qwen2), the kernel built. It takes ~20 small ops a layer down to one
        call with the same bits (docs/results/vnni-streams/README.md)."""
        return (not self.cfg.qk_norm and x.dim() == 2 and x.device.type == "cpu" and k_cache.dtype == torch.float32
                and x.dtype in (torch.float32, torch.bfloat16) and not torch.is_grad_enabled()
                and self.head_dim % 2 == 0 and glue_cpu.available())

    def forward(self, x, cos, sin, layout: PassLayout | None, k_cache=None, v_cache=None, attn_mask=None, keep=None):
        """x: [T, d] packed (with ``layout``) or [B, S, d] dense (training: causal or ``attn_mask``). ``keep``
        (packed): the rows whose output is wanted, in this order (every row's K/V is still written)."""
        shape = x.shape[:-1]
        if k_cache is not None and self.fused_rope_write(x, k_cache):  # CPU decoding: one call, the same bits
            D = self.head_dim
            q = glue_cpu.rope_write(self.qkv_proj(x), cos.reshape(-1, D), sin.reshape(-1, D), k_cache, v_cache,
                                    layout.write_rows, layout.slots, self.n_heads, self.n_kv)
            k = v = None
        else:
            q, k, v = self.qkv(x, cos, sin, None if k_cache is None else k_cache.dtype)
        if layout is None:
            # Dense batch [B, S]: one SDPA call (the training path, autograd-friendly).
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask,
                is_causal=attn_mask is None, enable_gqa=self.n_heads != self.n_kv).transpose(1, 2)
        elif k_cache is None:
            out = packed_attention(q, k, v, None, None, layout.cu_seqlens, layout.cache_lens,
                                   layout.group_ids, max_seqlen=layout.max_seqlen, reach=layout.reach)
        else:
            # Write the new K/V into the cache first (unless rope_write did), then attend to it in place.
            if k is not None:
                layout.write(k_cache, k)
                layout.write(v_cache, v)
            if use_triton(q):
                out = packed_attention(q, None, None, k_cache, v_cache, layout.cu_seqlens, layout.cache_lens,
                                       layout.group_ids, cache_rows=layout.rows, max_seqlen=layout.max_seqlen,
                                       reach=layout.reach)
            else:  # CPU: the layout's plan (masks, spans) is built once per pass, not per layer
                plan = layout.plan()
                if isinstance(plan, CpuPlan) and self.cpu_kernel_fits:
                    out = attend_cpu(q, k_cache, v_cache, plan, self.head_dim ** -0.5)
                else:
                    plan = layout.sdpa_plan() if isinstance(plan, CpuPlan) else plan
                    out = attend_torch(q, None, None, k_cache, v_cache, plan, self.head_dim ** -0.5)
        out = out.reshape(*shape, self.cfg.q_size)
        return self.o_proj((out if keep is None else out.index_select(0, keep)).to(x.dtype))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, layout, k_cache=None, v_cache=None, attn_mask=None, keep=None):
        """``keep`` (packed passes): only these rows go on past attention (``Transformer.forward``'s last layer)."""
        h = self.self_attn(self.input_layernorm(x), cos, sin, layout, k_cache, v_cache, attn_mask, keep)
        x = (x if keep is None else x.index_select(0, keep)) + h
        return x + self.mlp(self.post_attention_layernorm(x))


PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")  # layers_cpu's order


def cpu_layer_parts(weight, dtype: torch.dtype) -> list[dict] | None:
    """A projection's matrix as ``d3d.kernels.layers_cpu`` takes it (its blocks' ``add_part`` arguments), or None
    where that kernel has no path for it: quantized blocks multiplying int8 activations (an fp32 model), or a
    dense matrix in the model's dtype with its packed copy (``d3d.cpu.linear``: fp32 panels or oneDNN blocks)."""
    if isinstance(weight, (QuantWeight, Stacked)):
        blocks = weight.parts if isinstance(weight, Stacked) else [weight]
        if dtype != torch.float32 or not all(b.int8_activations for b in blocks):
            return None
        return [dict(kind=layers_cpu.INT8, **b.kernel_args()) for b in blocks]
    if not isinstance(weight, torch.Tensor) or weight.dtype != dtype:
        return None
    packed = cpu_linear.packed(weight)
    if packed is None:  # F.linear multiplies it (pack_for_cpu did not pack it)
        return None
    kind = layers_cpu.PANELS if isinstance(packed, cpu_linear.PanelWeight) else layers_cpu.ONEDNN
    return [dict(kind=kind, q=packed.packed, n=packed.out_features)]


def bind_cpu_layers(model: "Transformer"):
    """``model``'s decoder layers bound to ``d3d.kernels.layers_cpu`` (a decoding pass's layers in one C++ call,
    the same bits) and the dense tensors it copied from (a copy is stale once its tensor's ``_version`` moves),
    or None where that does not apply: a CPU model in fp32 or bf16 whose every projection ``cpu_layer_parts``
    takes, with heads attend_cpu computes, the kernels built."""
    cfg = model.cfg
    if (model.device.type != "cpu" or model.dtype not in (torch.float32, torch.bfloat16) or not model.layers
            or not fits(cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads)):
        return None
    parts = [[cpu_layer_parts(layer.get_submodule(name).weight, model.dtype) for name in PROJECTIONS]
             for layer in model.layers]
    if any(p is None for layer in parts for p in layer) or not layers_cpu.available():
        return None
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    bound, copied, empty = layers_cpu.new_layers(H, Hkv, D, cfg.rms_norm_eps), [], torch.empty(0)
    for layer, blocks in zip(model.layers, parts):
        attn, qk_norm = layer.self_attn, empty
        if cfg.qk_norm:  # Attention.qkv's weights, joined once
            qk_norm = attn.qk_norm_weight()
            copied += [attn.q_norm.weight, attn.k_norm.weight]
        bound.add_layer(layer.input_layernorm.weight, layer.post_attention_layernorm.weight, qk_norm)
        for which, (name, bs) in enumerate(zip(PROJECTIONS, blocks)):
            module = layer.get_submodule(name)
            for b in bs:  # what a kind has not: empty tensors and zeros
                bound.add_part(which, **(dict(h=empty, s=empty, m=empty, sd=empty, md=empty, n=0, group=0, bits=0)
                                         | {k: v for k, v in b.items() if v is not None}))
            if isinstance(module.weight, torch.Tensor):
                copied.append(module.weight)
            if module.bias is not None:
                bound.set_bias(which, module.bias)
    return bound, [(t, t._version) for t in copied]


class Transformer(nn.Module):
    """Qwen3/Qwen2 decoder-only language model."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.source: Path | None = None  # the checkpoint directory it was loaded from, if any
        self.weights_choice: WeightsChoice | None = None  # how load_weights held the matrices (None: built here)
        self.cpu_layers = True  # decoding passes through d3d.kernels.layers_cpu where it applies (False: never)
        self._cpu_layers = None  # bind_cpu_layers' result once asked (False: does not apply)
        self.greedy_heads = True  # greedy passes read the LM head in two stages where it applies (False: never)
        self._greedy_head = None  # greedy_head's once asked (False: does not apply)

    # ---------------------------------------------------------------- helpers

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (fp32 when the matrices are quantized: ``d3d.cpu.quant``)."""
        return self.norm.weight.dtype

    def quantized_matrices(self) -> list:
        """The matrices held quantized (``d3d.cpu.quant``)."""
        return [m.weight for m in self.modules() if is_quantized(getattr(m, "weight", None))]

    @property
    def quantized(self) -> bool:
        return bool(self.quantized_matrices())

    @property
    def int8_activations(self) -> bool:
        """Whether some matrix multiplies int8-quantized activations (``d3d.cpu.quant.int8_activations``)."""
        return any(getattr(w, "int8_activations", False) for w in self.quantized_matrices())

    @property
    def weights(self) -> str:
        """How the matrices are stored: the dtype's name, or the quantized formats (``int8``, ``int8+int5+int4``)."""
        formats = {w.format for w in self.quantized_matrices()}
        if not formats:
            return str(self.dtype).removeprefix("torch.")
        return "+".join(sorted({f for fmt in formats for f in fmt.split("+")}, reverse=True))

    def greedy_head(self) -> "GreedyHead | None":
        """The LM head read in two stages for greedy passes (``d3d.cpu.greedy_head``), built on first use where it
        applies (an int8 head with groups of 32 multiplying int8 activations on a CPU), else None."""
        if self._greedy_head is None:
            w = self.output_weight()
            self._greedy_head = GreedyHead(w) if GreedyHead.fits(w) and glue_cpu.available() else False
        return self._greedy_head or None

    def _greedy_head_for(self, x: torch.Tensor) -> "GreedyHead | None":
        """``greedy_head`` for a greedy pass's final hidden rows ``x`` (fp32 [T, K]) where it takes their count."""
        if not self.greedy_heads or x.dim() != 2 or x.dtype != torch.float32:
            return None
        head = self.greedy_head()
        return head if head is not None and 0 < len(x) <= head.rows else None

    def _logits(self, x: torch.Tensor, greedy: bool, head: torch.nn.Module | None) -> torch.Tensor:
        """The final rows' logits: ``head``'s where given, else the greedy head's where it applies, else the model's."""
        if head is not None:
            return head(x)
        greedy_head = self._greedy_head_for(x) if greedy else None
        return greedy_head.logits(x) if greedy_head is not None else cpu_linear.linear(x, self.output_weight())

    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE tables, built on first use on the model's device (not a buffer: meta-device safe)."""
        if self._rope is None or self._rope[0].device != self.device:
            self._rope = rope_tables(self.cfg, self.device)
        return self._rope

    @property
    def cache_dtype(self) -> torch.dtype:
        """The KV cache's dtype, and so attention's: the model's, except fp32 on CPU, where SDPA in
        bf16 is several times slower than in fp32 for one query (docs/results.md, "Measurements behind the code") and fp32
        attention is exact."""
        return torch.float32 if self.device.type == "cpu" else self.dtype

    def pack_for_cpu(self) -> "Transformer":
        """Prepack every matrix for CPU inference (``d3d.cpu.linear``: faster skinny matmuls, a
        second copy of the weights); a no-op off CPU or without oneDNN."""
        for module in self.modules():
            if isinstance(module, nn.Linear) and isinstance(module.weight, torch.Tensor):
                cpu_linear.pack(module.weight)
        if isinstance(self.output_weight(), torch.Tensor):
            cpu_linear.pack(self.output_weight())
        return self

    def quantize_(self, fmt: str) -> "Transformer":
        """Quantize every dense matrix in place (``d3d.cpu.quant.quantize``: int8 or int4; the embedding
        and LM head too); the rest of the model moves to fp32 (quantized models compute in fp32)."""
        for name, p in list(self.named_parameters()):
            if p.dim() == 2:
                self.set_weight(name, quantize(p, fmt))
        self.weights_choice = WeightsChoice(fmt, "quantize_")
        return self.float().pack_for_cpu()

    def load_weights(self, state: dict, choice: WeightsChoice, dtype=None, device: torch.device | str = "cpu",
                     strict: bool = True) -> "Transformer":
        """Fill this model (built on the meta device) from ``state`` (our parameter names) held as ``choice``
        says (``d3d.cpu.precision.auto_weights``): how ``load_model`` and ``load_drafter`` alike load.
        Quantized matrices go in as they come, dense ones are quantized where the choice quantizes, and the
        rest moves to ``device`` in the dtype the choice computes in (``dtype``: the one asked for). Empties
        ``state`` as it goes (each tensor freed once placed) and keeps ``choice`` as ``weights_choice``."""
        for name in [n for n, v in state.items() if is_quantized(v) or (choice.quantizes and v.dim() == 2)]:
            w = state.pop(name)
            self.set_weight(name, w if is_quantized(w) else quantize(w, choice.weights))
        dtype = choice.compute_dtype(dtype, device, self.cfg.torch_dtype)
        self.load_state_dict({k: state.pop(k).to(device=device, dtype=dtype) for k in list(state)}, strict=strict,
                             assign=True)
        self.weights_choice = choice
        return self.eval().requires_grad_(False).pack_for_cpu()

    def _apply(self, fn, recurse=True):  # .to(), .float(), ...: layers bound to the old tensors are bound again
        self._cpu_layers = None
        return super()._apply(fn, recurse)

    def load_state_dict(self, *args, **kwargs):
        self._cpu_layers = None
        return super().load_state_dict(*args, **kwargs)

    def set_weight(self, name: str, weight) -> None:
        """Put a quantized matrix (``d3d.cpu.quant``) where the parameter ``name`` (ours, e.g.
        ``layers.0.mlp.down_proj.weight`` or ``embed_tokens.weight``) is: its module is replaced by a
        ``QuantLinear`` (keeping the bias) or a ``QuantEmbedding``."""
        self._cpu_layers = self._greedy_head = None  # bound (built) again when next asked
        if name == "embed_tokens.weight":
            self.embed_tokens = QuantEmbedding(weight)
            return
        path = name.removesuffix(".weight")
        parent, _, child = path.rpartition(".")
        module = self.get_submodule(path)
        if not isinstance(module, (Linear, QuantLinear)) or tuple(weight.shape) != tuple(module.weight.shape):
            raise ValueError(f"{name}: a {tuple(weight.shape)} matrix cannot replace {module}")
        setattr(self.get_submodule(parent), child, QuantLinear(weight, module.bias))

    def new_cache(self, rows: int, max_len: int, dtype: torch.dtype | None = None) -> KVCache:
        return KVCache(self.cfg, rows, max_len, dtype or self.cache_dtype, self.device)

    # ---------------------------------------------------------------- forward

    def _bound_cpu_layers(self, x, layout, cache):
        """``bind_cpu_layers``' layers where this pass can take them: a packed inference pass over an fp32 cache
        whose attention runs on attend_cpu (``CpuPlan``: at most ``MAX_QUERIES`` rows); else None."""
        if (cache is None or not self.cpu_layers or torch.is_grad_enabled() or x.dtype != self.dtype or x.dim() != 2
                or cache.k[0].dtype != torch.float32 or not isinstance(layout.plan(), CpuPlan) or prefill.marked()):
            return None  # (a long prompt's rows take AMX's tiles in the modules: d3d.cpu.prefill)
        if self._cpu_layers and any(t._version != v for t, v in self._cpu_layers[1]):
            self._cpu_layers = None  # a dense weight changed in place (training): its copies are made again
        if self._cpu_layers is None:
            self._cpu_layers = bind_cpu_layers(self) or False
        return self._cpu_layers[0] if self._cpu_layers else None

    def _pass_inputs(self, input_ids, layout, cache, attn_mask, positions):
        """``forward``'s inputs in the form the layers take: a dense pass gets RoPE tables per position
        (and a per-row mask one head axis); a packed one its layout (packing a ``[B, S]`` input)."""
        cos, sin = self.rope()
        if input_ids.dim() == 2 and cache is None and layout is None:  # dense
            S = input_ids.shape[1]
            pos = torch.arange(S, device=input_ids.device) if positions is None else positions
            if attn_mask is not None and attn_mask.dim() == 3:
                attn_mask = attn_mask.unsqueeze(1)  # [B, 1, S, S]: the same mask for every head
            return input_ids, layout, cos[pos].unsqueeze(-2), sin[pos].unsqueeze(-2), attn_mask
        if attn_mask is not None or positions is not None:
            raise ValueError("attn_mask/positions are for dense [B, S] passes; packed passes use a layout")
        if input_ids.dim() == 2:
            B, S = input_ids.shape
            if cache is None:
                raise ValueError("a [B, S] input with a layout needs packing: pass input_ids.reshape(-1)")
            layout = layout or cache.layout([S] * B)
            input_ids = input_ids.reshape(-1)
        if layout is None:
            raise ValueError("a packed [T] input needs a layout (see KVCache.layout / make_layout)")
        if input_ids.shape[0] != layout.num_tokens:
            raise ValueError(f"input_ids has {input_ids.shape[0]} tokens, layout describes {layout.num_tokens}")
        return input_ids, layout, cos[layout.positions].unsqueeze(1), sin[layout.positions].unsqueeze(1), attn_mask

    def _last_layer_rows(self, x: torch.Tensor, logits_index: torch.Tensor | None, wanted: set) -> torch.Tensor | None:
        """The rows a packed pass's last layer carries on past attention: those whose logits are wanted (the others
        only write their K/V), or None for every row (a dense pass, no index, the last layer's output wanted).
        A drafter's catch-up over a prompt skips about half its work, a prefill one layer's o and MLP
        (docs/results/last-layer-rows/)."""
        L = len(self.layers)
        if logits_index is None or x.dim() != 2 or L == 0 or L in wanted or logits_index.numel() == 0:
            return None
        return logits_index

    def forward(
        self,
        input_ids: torch.Tensor,
        layout: PassLayout | None = None,
        cache: KVCache | None = None,
        logits_index: torch.Tensor | None = None,
        hidden_layers: tuple[int, ...] = (),
        attn_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        greedy: bool = False,
        head: torch.nn.Module | None = None,
    ):
        """Run one pass.

        Inference (packed): ``input_ids`` ``[T]`` new tokens of N sequences described by
            ``layout``; with ``cache`` their K/V are appended and ``cache.lengths`` advance.
            A ``[B, S]`` input with a cache is packed for you (S new tokens per row).
        Dense (training): ``input_ids`` ``[B, S]`` with no cache and no layout — a causal
            forward, or ``attn_mask`` (bool ``[S, S]``, or ``[B, S, S]`` per row; True = may
            attend) with ``positions`` (``[S]`` or ``[B, S]``, default ``arange(S)``) for other
            layouts such as the BD3 training mask.
        logits_index: ``[M]`` indices into the (flattened) tokens whose logits are wanted (a packed pass's last
            layer carries only those rows past attention: ``_last_layer_rows``).
        hidden_layers: layer indices whose outputs are returned too (0 = embeddings, i = after
            layer i), in the order asked (repeats allowed), for DFlash-style conditioning.
        greedy: only each row's argmax will be read (every row decodes greedily): where ``greedy_head`` applies, the
            logits of the columns that can be a row's maximum, exact, and -inf elsewhere (the same argmax).
        head: an LM head over some of the vocabulary's rows instead of the model's (a draft model's:
            ``d3d.decode.draft_model``); its logits are returned, one column per row it holds.
        Returns logits ``[T, V]`` / ``[B, S, V]`` (``[M, V]`` with logits_index), or
        ``(logits, [hidden ...])`` when ``hidden_layers`` is non-empty.
        """
        batch_shape = input_ids.shape if input_ids.dim() == 2 and logits_index is None else None
        input_ids, layout, cos, sin, attn_mask = self._pass_inputs(input_ids, layout, cache, attn_mask, positions)
        x = self.embed_tokens(input_ids)
        wanted = set(hidden_layers)
        hidden = {0: x} if 0 in wanted else {}
        keep = self._last_layer_rows(x, logits_index, wanted)
        fused = None if wanted else self._bound_cpu_layers(x, layout, cache)
        if fused is not None:  # the same layers in one C++ call (d3d.kernels.layers_cpu): the same bits
            plan, D = layout.plan(), self.cfg.head_dim
            x = fused.run(x, cos.reshape(-1, D), sin.reshape(-1, D), cache.k, cache.v, layout.write_rows,
                          layout.slots, plan.rows, plan.nkeys, plan.first, plan.mask, D ** -0.5, keep)
        for i, layer in enumerate(self.layers if fused is None else ()):
            kc = vc = None
            if cache is not None:
                kc, vc = cache.k[i], cache.v[i]
            x = layer(x, cos, sin, layout, kc, vc, attn_mask, keep if i == len(self.layers) - 1 else None)
            if i + 1 in wanted:
                hidden[i + 1] = x
        if cache is not None:
            cache.advance(layout)
        if logits_index is not None and keep is None:
            x = x.reshape(-1, x.shape[-1]).index_select(0, logits_index)
        logits = self._logits(self.norm(x), greedy, head)
        if batch_shape is not None:
            logits = logits.view(*batch_shape, -1)
        return (logits, [hidden[i] for i in hidden_layers]) if hidden_layers else logits
