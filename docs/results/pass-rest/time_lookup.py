"""The token embedding lookup of a real model (its GGUF table, quantized): dequantizing the rows of T ids, as
every lookup did, against QuantEmbedding, which keeps the rows it read (the ids read once before). Medians of
2000 calls (us).

    python docs/results/pass-rest/time_lookup.py qwen2.5-coder-0.5b
"""
import statistics
import sys
import time

import torch

import d3d
from bench.common import target_dir

torch.set_grad_enabled(False)
model = d3d.load_model(target_dir(sys.argv[1], "passes"), dtype="float32", weights="auto")
emb = model.embed_tokens


def median_us(fn, n=2000):
    for _ in range(100):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


cells = []
for T in (1, 8, 16):
    ids = torch.randint(0, emb.num_embeddings, (T,), generator=torch.Generator().manual_seed(T))
    cells.append(f"T={T:2d}: dequantized {median_us(lambda: emb.weight.dequantize(ids)):5.1f}, "
                 f"kept {median_us(lambda: emb(ids)):4.1f}")
print(f"{sys.argv[1]} ({emb.weight.format}, {emb.embedding_dim} wide): " + " | ".join(cells))
