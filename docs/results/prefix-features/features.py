"""The quantized 0.5B's hidden states after its first layers, at every position of every row of the 1.5B's
answer store (prompt + answer, the last 256 tokens, right-padded): what a drafter reading a frozen prefix of
the 0.5B would see for its clean context. Run from the repository root (~16 min on 2 cores, ~1,400 tok/s):

    python docs/results/prefix-features/features.py 4,8 ~/.cache/d3d-runs/prefix-drafter/feats_4_8.pt

Writes ``{"ids", "mask", "feats": {K: [rows, 256, 896] bf16}}`` (6 GB for two K).
"""
import sys
import time

import torch

import d3d
from d3d.data.answers import sealed_answers
from d3d.fetch import resolve_model
from d3d.train.chat_data import to_windows

STORE, WINDOW = "data/qwen2.5-coder-1.5b-answers", 256
torch.set_grad_enabled(False)
ks, out = [int(k) for k in sys.argv[1].split(",")], sys.argv[2]
path = resolve_model("qwen2.5-coder-0.5b")
tok = d3d.load_tokenizer(path)
have = sealed_answers(STORE)
ids, mask = to_windows([a.prompt for a in have], [a.answer for a in have], WINDOW, tok.token_id("<|endoftext|>") or 0)
lengths = (mask * torch.arange(1, WINDOW + 1)).amax(1).long()
print(f"{len(have)} rows, mean length {lengths.float().mean():.1f}", flush=True)
m = d3d.load_model(path, weights="auto")
m.layers = m.layers[:max(ks)]  # the prefix only; one row's logits (logits_index) keeps the head's cost away
feats = {k: torch.zeros(ids.shape[0], WINDOW, m.cfg.hidden_size, dtype=torch.bfloat16) for k in ks}
order, t0, done = torch.argsort(lengths), time.time(), 0
for i in range(0, ids.shape[0], 8):  # rows of similar length together: less padding
    rows = order[i:i + 8]
    S = int(lengths[rows].max())
    _, hs = m(ids[rows, :S], logits_index=torch.tensor([0]), hidden_layers=tuple(ks))
    for k, h in zip(ks, hs):
        feats[k][rows, :S] = h.to(torch.bfloat16)
    done += int(lengths[rows].sum())
    if i % 512 == 0:
        print(f"{i}/{ids.shape[0]} rows, {done / (time.time() - t0):.0f} tok/s", flush=True)
torch.save({"ids": ids, "mask": mask, "feats": feats}, out)
print(f"done in {time.time() - t0:.0f} s", flush=True)
