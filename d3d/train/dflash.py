"""Training the DFlash baseline drafter (``python -m d3d train-dflash``), on the same data and
budget as the D3D drafter (``d3d.train.drafter``): the target's greedy continuations.

DFlash's recipe: pick random anchors in each sequence; the block after each anchor is
``[x_anchor, mask x (B-1)]``; a block's queries see the target context (fused hidden states)
of the tokens *strictly before* its anchor plus their own block; the loss on the k-th drafted
position is weighted exp(-(k-1)/γ). The target runs without gradients to provide the hidden
states; the drafter shares (and freezes) the target's embedding and LM head.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..model.checkpoint import load_model
from ..draft.dflash import DFlashConfig, DFlashDrafter, save_dflash, target_layer_ids
from ..decode.engines import generate
from ..files import write_json
from ..model.transformer import apply_rope
from ..data.prompts import heldout_prompts
from ..model.tokenizer import Tokenizer
from .common import make_optimizer
from .drafter import init_from_target_layers, labelling_model, make_training_data, pick_mask_id
from .loop import TrainSettings, train_loop
from ..decode.config import SpecConfig


@dataclass(kw_only=True)
class DFlashTrainConfig(TrainSettings):
    target: str
    num_layers: int = 3
    block_size: int = 16
    # data and budget as train-drafter's defaults: the baseline reuses the D3D drafter's cached
    # continuations (--data-dir; the cache key includes the count) and trains as long
    n_sequences: int = 4096
    prompt_len: int = 32
    gen_len: int = 224
    blocks_per_sequence: int = 8
    gamma: float = 7.0
    eval_every: int = 500
    eval_prompts: int = 8
    eval_new_tokens: int = 64
    log_every: int = 25
    data_dir: str | None = None  # where the target continuations are cached (default OUT/data)
    mask_token_id: int = -1  # -1: <|mask|>, or else the first embedding row past the tokenizer's ids


def block_hidden(drafter: DFlashDrafter, hidden: list[torch.Tensor], x0: torch.Tensor, anchors: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """Drafter outputs [b, m, B, d] for the blocks ``[x0[a], mask x (B-1)]`` at ``anchors`` [b, m].

    Dense training form of ``DFlashDrafter.draft``: one SDPA call per layer whose keys are the
    context of every position plus all blocks, masked so block j sees context < anchor_j and
    itself (tested equal to the cached inference pass).
    """
    b, L = x0.shape
    m, B, d = anchors.shape[1], block_size, drafter.cfg
    ctx = drafter.context(hidden)  # [b, L, hidden]
    pos = (anchors[..., None] + torch.arange(B)).view(b, m * B)
    ids = torch.full((b, m, B), drafter.dcfg.mask_token_id, dtype=torch.long)
    ids[..., 0] = torch.gather(x0, 1, anchors)
    see_ctx = torch.arange(L)[None, None, :] < anchors.repeat_interleave(B, dim=1)[..., None]  # [b, mB, L]
    blk = torch.arange(m).repeat_interleave(B)
    see_blk = (blk[:, None] == blk[None, :]).expand(b, -1, -1)
    mask = torch.cat([see_ctx, see_blk], dim=2)[:, None]  # [b, 1, mB, L + mB]
    cos, sin = drafter.model.rope()
    cos_c, sin_c = cos[:L][None, :, None], sin[:L][None, :, None]
    cos_b, sin_b = cos[pos][:, :, None], sin[pos][:, :, None]
    x = drafter.model.embed_tokens(ids.view(b, m * B))
    H, Hkv, D = d.num_attention_heads, d.num_key_value_heads, d.head_dim
    for layer in drafter.model.layers:
        attn = layer.self_attn
        _, kc, vc = attn.qkv_proj(ctx).split([d.q_size, d.kv_size, d.kv_size], dim=-1)
        kc, vc = kc.view(b, L, Hkv, D), vc.view(b, L, Hkv, D)
        h = layer.input_layernorm(x)
        q, k, v = attn.qkv_proj(h).split([d.q_size, d.kv_size, d.kv_size], dim=-1)
        q, k, v = q.view(b, m * B, H, D), k.view(b, m * B, Hkv, D), v.view(b, m * B, Hkv, D)
        if d.qk_norm:
            q, k, kc = attn.q_norm(q), attn.k_norm(k), attn.k_norm(kc)
        q, k, kc = apply_rope(q, cos_b, sin_b), apply_rope(k, cos_b, sin_b), apply_rope(kc, cos_c, sin_c)
        keys, values = torch.cat([kc, k], 1), torch.cat([vc, v], 1)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                           attn_mask=mask, enable_gqa=H != Hkv).transpose(1, 2)
        x = x + attn.o_proj(o.reshape(b, m * B, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return drafter.model.norm(x).view(b, m, B, -1)


def dflash_loss(drafter: DFlashDrafter, target, x0: torch.Tensor, cfg: DFlashTrainConfig, gen: torch.Generator):
    b, L = x0.shape
    B, m = cfg.block_size, cfg.blocks_per_sequence
    with torch.no_grad():
        _, hidden = target(x0, hidden_layers=drafter.hidden_layers)
    # anchors in the continuation, leaving room for a whole block after each
    anchors = torch.randint(cfg.prompt_len, L - B + 1, (b, m), generator=gen)
    pos = (anchors[..., None] + torch.arange(B)).view(b, m * B)
    labels = torch.gather(x0, 1, pos).view(b, m, B)[:, :, 1:]
    logits = F.linear(block_hidden(drafter, hidden, x0, anchors, B)[:, :, 1:], drafter.model.output_weight())
    weight = torch.exp(-torch.arange(B - 1).float() / cfg.gamma).expand(b, m, B - 1)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), reduction="none")
    return (ce * weight.reshape(-1)).sum() / weight.sum()


def measure_dflash_tau(target, drafter, prompts, max_new_tokens, block_size) -> float:
    out = generate(target, prompts, max_new_tokens=max_new_tokens, drafter=drafter, stop_ids=[],
                   spec=SpecConfig(mode="dflash", block_size=block_size))
    return out.stats.tau


def train_dflash(cfg: DFlashTrainConfig, resume: bool = False, log=print) -> dict:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_model(cfg.target, dtype="float32").requires_grad_(False)  # fp32 master; compute_dtype autocasts
    tok = Tokenizer.load(cfg.target)
    data = make_training_data(labelling_model(cfg.target, target), tok, cfg.corpus, cfg.heldout_fraction, cfg.n_sequences, cfg.prompt_len,
                              cfg.gen_len, cfg.seed, Path(cfg.data_dir) if cfg.data_dir else out / "data", log=log)
    mask_id = pick_mask_id(tok, target.cfg.vocab_size, cfg.mask_token_id)  # the D3D trainer's rule
    ids = tuple(target_layer_ids(target.cfg.num_hidden_layers, cfg.num_layers))
    dcfg = DFlashConfig(block_size=cfg.block_size, mask_token_id=mask_id, target_vocab=target.cfg.vocab_size,
                        target_layer_ids=ids)
    with torch.random.fork_rng():  # the context projection's random init: a function of cfg.seed alone
        torch.manual_seed(cfg.seed)
        drafter = DFlashDrafter(target.cfg.replace(num_hidden_layers=cfg.num_layers, extra={}), dcfg, target)
    init_from_target_layers(drafter.model, target)  # the same start as the D3D drafter
    trainable = [p for n, p in drafter.named_parameters() if not n.startswith(("model.embed_tokens", "model.lm_head"))]
    for p in drafter.parameters():
        p.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    optimizer = make_optimizer(drafter, cfg.lr, cfg.weight_decay)
    n_train = sum(p.numel() for p in trainable)
    log(f"DFlash drafter: {cfg.num_layers} layers reading target layers {list(ids)}, {n_train / 1e6:.2f}M trainable")
    prompts = heldout_prompts(tok, cfg.corpus, cfg.heldout_fraction, cfg.eval_prompts, cfg.prompt_len)

    def loss_fn(step, gen):
        idx = torch.randint(0, data.shape[0], (cfg.batch_size,), generator=gen)
        return dflash_loss(drafter, target, data[idx], cfg, gen), cfg.batch_size * data.shape[1]

    def held_out(step):
        tau = measure_dflash_tau(target, drafter, prompts, cfg.eval_new_tokens, cfg.block_size)
        log(f"  held-out τ (B={cfg.block_size}, greedy, {cfg.eval_prompts} prompts): {tau:.3f}")
        return {"tau": tau}

    t0 = time.perf_counter()

    def save(step, history):  # a usable drafter at every evaluation
        save_dflash(drafter, out)
        summary = {"config": asdict(cfg), "trainable_parameters": n_train, "steps_done": step,
                   "train_seconds": time.perf_counter() - t0, "history": history}
        write_json(out / "train_summary.json", summary)

    train_loop(drafter, optimizer, cfg, out / "training_state.pt", loss_fn, held_out, on_eval=save, resume=resume,
               log=log)
    return json.loads((out / "train_summary.json").read_text())
