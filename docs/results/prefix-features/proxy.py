"""Does a frozen prefix of the 0.5B make the two-layer drafter stronger? The shipped drafter fine-tuned on the 1.5B's
answers for STEPS steps (8 rows of 256 tokens, the BD3 loss of ``train-drafter``: blocks of 16, 45% all-mask / 45%
anchored / 10% partial, weight exp(-(k-1)/7), lr 2e-4 with 50 warm-up steps and a cosine to 10%, bf16 autocast),
its clean context read one of three ways (ARM):

    ctl    the token embeddings, as shipped
    preK   the quantized 0.5B's hidden states after K layers instead (``features.py``)
    addK   the embeddings plus a learned projection (zero at the start) of those states, RMS-normalised and
           scaled to the embeddings' size (0.02; unscaled, the projection outgrew the embeddings within 25 steps)

Proxy τ (teacher-forced, no target run): the first 128 of the store's last 256 answers (never trained on), every
block of 16 aligned in the window whose first draft is an answer token, anchored (its first token given, 15
masks): 1 + the mean run of drafted tokens equal to the answer's (the 1.5B's greedy tokens), per request kind.
Run from the repository root:

    python docs/results/prefix-features/proxy.py ARM STEPS OUT.json FEATS [START]

START: the shipped drafter (default); ``layersI,J``: the 0.5B's own layers I and J and its final norm instead of
the shipped drafter's (its head rows and drafting vocabulary kept); or WEIGHTS.pt saved by a run (with STEPS 0:
the proxy of saved weights only). OUT.json gets the proxy at 0, 1/4, 1/2, 3/4 and all
steps; OUT.pt the trained weights (bf16).
"""
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

import d3d
from d3d.cpu import linear as cpu_linear
from d3d.data.answers import sealed_answers
from d3d.draft.drafter import load_drafter
from d3d.fetch import resolve_model
from d3d.train.bd3_compact import compact_layout, grouped_batch, kept_length, length_order
from d3d.train.drafter import noise_blocks, training_mask

arm, steps, out, feats_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if arm != "ctl" and not (arm[:3] in ("pre", "add") and arm[3:].isdigit()):
    sys.exit(f"ARM={arm!r}: expected ctl, preK or addK (K: a layer count of FEATS, e.g. pre8)")
K, ADD = (int(arm[3:]), arm.startswith("add")) if arm != "ctl" else (0, False)
HOLD, EVAL, B, LR, SCALE = 256, 128, 16, 2e-4, 0.02
torch.manual_seed(0)
torch.set_num_threads(2)
data = torch.load(feats_path)
ids, lmask, feats = data["ids"], data["mask"], data["feats"][K] if K else None
del data
N, L = ids.shape
kinds = [a.kind for a in sealed_answers("data/qwen2.5-coder-1.5b-answers")]
train_rows, hold_rows = torch.arange(N - HOLD), torch.arange(N - HOLD, N - HOLD + EVAL)
base = d3d.load_model(resolve_model("qwen2.5-coder-0.5b"), weights="float32")
drafter = load_drafter("models/d3d-drafter-qwen2.5-coder-0.5b", target=base, weights="float32")
model, mask_id, vmap = drafter.model, drafter.dcfg.mask_token_id, drafter.vocab_map
D = model.cfg.hidden_size
label_map = torch.full((model.cfg.vocab_size,), -1, dtype=torch.long)
label_map[vmap] = torch.arange(vmap.numel())
proj = torch.nn.Linear(D, D, bias=False)
torch.nn.init.zeros_(proj.weight)
params = [p for n, p in model.named_parameters() if n.startswith(("layers.", "norm."))] + ([proj.weight] if ADD else [])
model.requires_grad_(False)
for p in params:
    p.requires_grad_(True)
attn_full = training_mask(L, B, "causal")


def run(cids, rows, x0, attn_mask, positions, index):
    """The drafter's dense pass; clean positions come as -(1 + j) and read row j's token and/or features."""
    clean, j = cids < 0, (-cids - 1).clamp(min=0)
    x = model.embed_tokens(torch.where(clean, torch.gather(x0, 1, j), cids))
    if K:
        f = torch.gather(feats[rows], 1, j[..., None].expand(-1, -1, D)).to(x.dtype)
        if ADD:
            f = x + proj(f * torch.rsqrt(f.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(f.dtype) * SCALE)
        x = torch.where(clean[..., None], f, x)
    _, _, cos, sin, am = model._pass_inputs(cids.clamp(min=0), None, None, attn_mask, positions)
    for layer in model.layers:
        x = layer(x, cos, sin, None, None, None, am, None)
    x = x.reshape(-1, D).index_select(0, index)
    return cpu_linear.linear(model.norm(x), model.output_weight())


def loss_fn(rows, gen):
    x0 = ids[rows]
    xt, weight = noise_blocks(x0, B, mask_id, (0.45, 0.45, 0.1), 7.0, gen)
    labels = label_map[x0]
    weight = weight * lmask[rows] * (labels >= 0)
    sel = weight.flatten().nonzero().squeeze(1)
    cids, positions, am, index = compact_layout(xt, -(1 + torch.arange(L)).expand_as(x0), weight, attn_full, B)
    ce = F.cross_entropy(run(cids, rows, x0, am, positions, index).float(), labels.flatten()[sel], reduction="none")
    w = weight.flatten()[sel]
    return (ce * w).sum() / w.sum()


@torch.no_grad()
def proxy_tau() -> dict:
    acc, blocks, j = {}, {}, torch.arange(L) % B
    for i in range(0, EVAL, 8):
        rows = hold_rows[i:i + 8]
        x0, lm, b = ids[rows], lmask[rows], len(rows)
        xt = torch.where(j > 0, torch.full_like(x0, mask_id), x0)
        cids = torch.cat([xt, -(1 + torch.arange(L)).expand_as(x0)], 1)
        index = (torch.arange(b)[:, None] * 2 * L + torch.arange(L)).flatten()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = run(cids, rows, x0, attn_full, torch.arange(L).repeat(2), index)
        pred = vmap[logits.float().argmax(-1)].view(b, L)
        ok = ((pred == x0) & (lm > 0)).view(b, L // B, B)[..., 1:].int()
        runs, valid = ok.cumprod(-1).sum(-1), lm.view(b, L // B, B)[..., 1] > 0
        for r in range(b):
            kind = kinds[int(rows[r])]
            acc[kind] = acc.get(kind, 0) + int(runs[r][valid[r]].sum())
            blocks[kind] = blocks.get(kind, 0) + int(valid[r].sum())
    tau = {k: round(1 + acc[k] / blocks[k], 4) for k in sorted(acc)}
    return tau | {"all": round(1 + sum(acc.values()) / sum(blocks.values()), 4)}


start = sys.argv[5] if len(sys.argv) > 5 else "shipped"
if start.startswith("layers"):
    for mine, i in zip(model.layers, [int(i) for i in start[6:].split(",")]):
        mine.load_state_dict(base.layers[i].state_dict())
    model.norm.load_state_dict(base.norm.state_dict())
elif start != "shipped":
    saved = torch.load(start)
    if "proj" in saved:
        proj.weight.data.copy_(saved.pop("proj"))
    model.load_state_dict({k: v.float() for k, v in saved.items()}, strict=False)
hist = [{"step": 0, "tau": proxy_tau()}]
print(hist[-1], flush=True)
opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0, betas=(0.9, 0.95))
order, gen, t0 = length_order(kept_length(lmask[train_rows], B), 0), torch.Generator().manual_seed(1), time.time()
for step in range(1, steps + 1):
    for g in opt.param_groups:
        g["lr"] = LR * min(1.0, step / 50) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn(train_rows[grouped_batch(order, 8, gen)], gen)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    if step % 25 == 0:
        print(f"step {step} loss {loss.item():.3f} {time.time() - t0:.0f}s", flush=True)
    if step % max(steps // 4, 1) == 0:
        hist.append({"step": step, "tau": proxy_tau(), "seconds": round(time.time() - t0)})
        print(hist[-1], flush=True)
with open(out, "w") as f:
    json.dump({"arm": arm, "start": start, "steps": steps, "lr": LR, "history": hist}, f, indent=1)
if steps:
    torch.save({"proj": proj.weight.detach()} | {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()
                                                if n.startswith(("layers.", "norm."))}, out.replace(".json", ".pt"))
