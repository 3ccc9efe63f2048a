"""One forward pass for two models: the target's verification and the drafter's successor block.

When drafter and target share their layer shapes (width, heads, head_dim, MLP size — the
default drafter shape: the target's layers, fewer of them), their passes can run *as one*:
layer by layer, the two models' projections become one batched matmul over stacked weights, and
both models' attention is one packed attention launch over a cache tensor that holds the
target's rows and the drafter's rows side by side. The deeper model's remaining layers run alone.

    target  : verify [anchor, d1..d(B-1)]            layers 0..Lt-1
    drafter : clean [d1..d(B-1)] ⊕ [mask x B]        layers 0..Ld-1  (Ld <= Lt)
    shared  : layers 0..Ld-1 — bmm([2, T, d] x [2, d, out]) and one packed_attention call

This is the CPU alternative to a second thread: it removes the drafter's per-op overhead (one
call does both models' work) instead of running the drafter's ops concurrently.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.cache import KVCache, PassLayout
from ..kernels.attention import packed_attention
from ..model.transformer import Transformer, apply_rope

_SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "attention_bias", "qk_norm", "rms_norm_eps")


def can_pack(target: Transformer, drafter_model: Transformer) -> bool:
    return (all(getattr(target.cfg, f) == getattr(drafter_model.cfg, f) for f in _SHAPE_FIELDS)
            and not target.quantized and not drafter_model.quantized  # stacked weights are dense
            and target.dtype == drafter_model.dtype and target.device == drafter_model.device
            and drafter_model.cfg.num_hidden_layers <= target.cfg.num_hidden_layers)


class PackedPair:
    """Stacked weights of the layers the two models share in shape, and their joint pass."""

    def __init__(self, target: Transformer, drafter_model: Transformer):
        if not can_pack(target, drafter_model):
            raise ValueError("packed passes need the drafter to have the target's layer shapes, dtype and "
                             "device, and at most as many layers")
        self.t, self.d = target, drafter_model
        self.cfg = target.cfg
        self.n_shared = drafter_model.cfg.num_hidden_layers

        def stack(get):  # [2, in, out]: (target, drafter) weights, transposed for bmm
            return [torch.stack([get(self.t.layers[i]).t(), get(self.d.layers[i]).t()]).contiguous()
                    for i in range(self.n_shared)]

        def stack_vec(get):  # [2, 1, n]
            return [torch.stack([get(self.t.layers[i]), get(self.d.layers[i])]).unsqueeze(1)
                    for i in range(self.n_shared)]

        self.w_qkv = stack(lambda l: l.self_attn.qkv_proj.weight)
        self.w_o = stack(lambda l: l.self_attn.o_proj.weight)
        self.w_gate_up = stack(lambda l: l.mlp.gate_up_proj.weight)
        self.w_down = stack(lambda l: l.mlp.down_proj.weight)
        self.n_in = stack_vec(lambda l: l.input_layernorm.weight)
        self.n_post = stack_vec(lambda l: l.post_attention_layernorm.weight)
        self.b_qkv = stack_vec(lambda l: l.self_attn.qkv_proj.bias) if self.cfg.attention_bias else None
        if self.cfg.qk_norm:
            self.n_q = [torch.stack([self.t.layers[i].self_attn.q_norm.weight, self.d.layers[i].self_attn.q_norm.weight])
                        .view(2, 1, 1, -1) for i in range(self.n_shared)]
            self.n_k = [torch.stack([self.t.layers[i].self_attn.k_norm.weight, self.d.layers[i].self_attn.k_norm.weight])
                        .view(2, 1, 1, -1) for i in range(self.n_shared)]

    def new_caches(self, t_rows: int, d_rows: int, max_len: int) -> tuple[KVCache, KVCache]:
        """Target and drafter caches whose first ``n_shared`` layers live in one tensor per layer
        (target rows first), so one attention launch can read both."""
        cfg, dev, dt = self.cfg, self.t.device, self.t.dtype
        shape = (t_rows + d_rows, cfg.num_key_value_heads, max_len, cfg.head_dim)
        joint_k = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(self.n_shared)]
        joint_v = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(self.n_shared)]
        tcache = KVCache(cfg, t_rows, max_len, dt, dev, num_layers=cfg.num_hidden_layers - self.n_shared)
        tcache.k = [k[:t_rows] for k in joint_k] + tcache.k
        tcache.v = [v[:t_rows] for v in joint_v] + tcache.v
        dcache = KVCache(self.d.cfg, d_rows, max_len, dt, dev, num_layers=0)
        dcache.k = [k[t_rows:] for k in joint_k]
        dcache.v = [v[t_rows:] for v in joint_v]
        self.joint_k, self.joint_v, self.t_rows = joint_k, joint_v, t_rows
        return tcache, dcache

    def _norm(self, x, w, eps):
        return F.rms_norm(x, (x.shape[-1],), None, eps) * w

    @torch.inference_mode()
    def forward(self, t_ids: torch.Tensor, t_layout: PassLayout, tcache: KVCache,
                d_ids: torch.Tensor, d_layout: PassLayout, dcache: KVCache,
                d_logits_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Target logits ``[Tt, V]`` and drafter logits at ``d_logits_index`` ``[M, V]``; both caches advance."""
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        Tt, Td = t_ids.numel(), d_ids.numel()
        T = max(Tt, Td)
        cos_t, sin_t = self.t.rope()
        cos_d, sin_d = self.d.rope()

        def pad(a, b):  # two [Ta, ...], [Tb, ...] -> [2, T, ...]
            out = a.new_zeros((2, T) + a.shape[1:])
            out[0, :Tt], out[1, :Td] = a, b
            return out

        cos = pad(cos_t[t_layout.positions], cos_d[d_layout.positions]).unsqueeze(2)  # [2, T, 1, D]
        sin = pad(sin_t[t_layout.positions], sin_d[d_layout.positions]).unsqueeze(2)
        x = pad(self.t.embed_tokens(t_ids), self.d.embed_tokens(d_ids))  # [2, T, d]

        # one layout for both: target sequences first, drafter sequences on rows offset by t_rows
        cu = torch.cat([t_layout.cu_seqlens, d_layout.cu_seqlens[1:] + Tt])
        cache_lens = torch.cat([t_layout.cache_lens, d_layout.cache_lens])
        groups = torch.cat([t_layout.group_ids, d_layout.group_ids])
        rows = torch.cat([t_layout.rows, d_layout.rows + self.t_rows])
        write_rows = torch.cat([t_layout.write_rows, d_layout.write_rows + self.t_rows])
        slots = torch.cat([t_layout.slots, d_layout.slots])
        reach = None if t_layout.reach is None and d_layout.reach is None else torch.cat(
            [t_layout.group_ids if t_layout.reach is None else t_layout.reach,
             d_layout.group_ids if d_layout.reach is None else d_layout.reach])
        max_seqlen = max(t_layout.max_seqlen, d_layout.max_seqlen)

        for i in range(self.n_shared):
            h = self._norm(x, self.n_in[i], eps)
            qkv = torch.bmm(h, self.w_qkv[i])
            if self.b_qkv is not None:
                qkv = qkv + self.b_qkv[i]
            q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            q, k, v = q.view(2, T, H, D), k.view(2, T, Hkv, D), v.view(2, T, Hkv, D)
            if cfg.qk_norm:
                q, k = self._norm(q, self.n_q[i], eps), self._norm(k, self.n_k[i], eps)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            q_all = torch.cat([q[0, :Tt], q[1, :Td]])
            self.joint_k[i][write_rows, :, slots] = torch.cat([k[0, :Tt], k[1, :Td]])
            self.joint_v[i][write_rows, :, slots] = torch.cat([v[0, :Tt], v[1, :Td]])
            att = packed_attention(q_all, None, None, self.joint_k[i], self.joint_v[i], cu, cache_lens, groups,
                                   cache_rows=rows, max_seqlen=max_seqlen, reach=reach)
            x = x + torch.bmm(pad(att[:Tt].reshape(Tt, -1), att[Tt:].reshape(Td, -1)), self.w_o[i])
            gate, up = torch.bmm(self._norm(x, self.n_post[i], eps), self.w_gate_up[i]).chunk(2, dim=-1)
            x = x + torch.bmm(F.silu(gate) * up, self.w_down[i])

        xt, xd = x[0, :Tt], x[1, :Td]
        cos_t, sin_t = cos[0, :Tt], sin[0, :Tt]
        for i in range(self.n_shared, cfg.num_hidden_layers):
            xt = self.t.layers[i](xt, cos_t, sin_t, t_layout, tcache.k[i], tcache.v[i])
        tcache.advance(t_layout)
        dcache.advance(d_layout)
        t_logits = F.linear(self.t.norm(xt), self.t.output_weight())
        d_logits = F.linear(self.d.norm(xd.index_select(0, d_logits_index)), self.d.output_weight())
        return t_logits, d_logits
