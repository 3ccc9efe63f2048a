"""What the compacted BD3 pass (d3d/train/bd3_compact.py) saves on the real chat data: one training
step (loss, backward; no optimizer step) of the 2-layer Qwen2.5-Coder drafter shape, batch 8 x 256,
bf16 autocast, in three ways measured side by side (interleaved, median of N):
  full      x_t ⊕ x_0 (512 positions a row), rows drawn at random (the trainer before this change)
  compact   only what supervised logits depend on, rows drawn at random
  grouped   compact, rows drawn from 128 neighbours in length order (what train-drafter now does)

    PYTHONPATH=. python docs/results/qwen-drafter/compact_probe.py TARGET RUN_DIR [N]  -> compact_probe.json
RUN_DIR: a chat run (its data/ holds the cached answers; nothing is generated).
"""
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.common import machine
from d3d.model.checkpoint import load_model
from d3d.files import write_json
from d3d.model.tokenizer import Tokenizer
from d3d.train.bd3_compact import compact_layout, grouped_batch, kept_length, length_order
from d3d.train.chat_data import make_chat_training_data
from d3d.train.drafter import (DrafterTrainConfig, bd3_loss, build_drafter, labelling_model, noise_blocks,
                               training_mask)
from d3d.train.loop import autocast_context

torch.set_num_threads(2)
target_dir, run_dir = sys.argv[1], Path(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 8
cfg = DrafterTrainConfig(target=target_dir, out=str(run_dir), num_layers=2, data="chat", n_sequences=5600,
                         gen_len=160, window=256)
target, tok = load_model(target_dir, dtype="float32"), Tokenizer.load(target_dir)
data, loss_mask = make_chat_training_data(labelling_model(target_dir, target), tok, None, 0.05, cfg.n_sequences,
                                          cfg.gen_len, cfg.window, cfg.seed, run_dir / "data",
                                          minutes=0)  # the trainer's cache; generate nothing
if data.shape[0] != cfg.n_sequences:
    raise SystemExit(f"{run_dir / 'data'}: no complete cached answers for these settings")
vocab_map = torch.load(run_dir / "draft_vocab.pt")
label_map = torch.full((target.cfg.vocab_size,), -1, dtype=torch.long)
label_map[vocab_map] = torch.arange(vocab_map.numel())
drafter = build_drafter(target, tok, cfg, vocab_map)
model = drafter.model.train()
for name, p in model.named_parameters():
    p.requires_grad_("embed_tokens" not in name and "lm_head" not in name)
mask = training_mask(cfg.window, cfg.block_size)
order = length_order(kept_length(loss_mask, cfg.block_size), cfg.seed)
autocast = autocast_context("auto", torch.device("cpu"))
ways = {"full": (False, False), "compact": (True, False), "grouped": (True, True)}
times = {w: [] for w in ways}
positions = {w: [] for w in ways}
for step in range(n + 1):  # step 0 warms up
    for way, (compact, grouped) in ways.items():
        gen = torch.Generator().manual_seed(step)
        idx = grouped_batch(order, 8, gen) if grouped else torch.randint(0, data.shape[0], (8,), generator=gen)
        noise_gen = torch.Generator().manual_seed(1000 + step)
        xt, weight = noise_blocks(data[idx], cfg.block_size, drafter.dcfg.mask_token_id, cfg.mix, cfg.gamma,
                                  torch.Generator().manual_seed(1000 + step))
        S = compact_layout(xt, data[idx], weight * loss_mask[idx], mask, cfg.block_size)[0].shape[1] if compact else 512
        t0 = time.perf_counter()
        with autocast():
            loss = bd3_loss(model, data[idx], loss_mask[idx], mask, cfg.block_size, drafter.dcfg.mask_token_id,
                            cfg.mix, cfg.gamma, noise_gen, label_map, compact=compact)
        loss.backward()
        model.zero_grad(set_to_none=True)
        if step:
            times[way].append(time.perf_counter() - t0)
            positions[way].append(S)
    print(step, {w: round(t[-1], 3) for w, t in times.items() if t}, flush=True)
median = {w: statistics.median(t) for w, t in times.items()}
mean = {w: statistics.mean(t) for w, t in times.items()}
out = {"machine": machine(), "threads": 2, "steps": n,
       "what": "loss + backward of the 2-layer drafter (29.8M trainable), batch 8 x 256, bf16 autocast",
       "median_seconds": median, "speedup_vs_full": {w: median["full"] / m for w, m in median.items()},
       # what a training run's total time follows: grouped batches of short rows are much faster
       "mean_seconds": mean, "mean_speedup_vs_full": {w: mean["full"] / m for w, m in mean.items()},
       "mean_positions_per_row": {w: statistics.mean(p) for w, p in positions.items()}, "seconds": times}
write_json(Path(__file__).with_name("compact_probe.json"), out)
print(out["median_seconds"], out["speedup_vs_full"], out["mean_speedup_vs_full"], out["mean_positions_per_row"])
