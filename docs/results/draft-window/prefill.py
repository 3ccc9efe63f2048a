"""Prefill of long prompts on the 0.5B (its GGUF blocks): the first 250-2,000 tokens of argparse.py, one token
generated (ar); prompt tokens per second; then where a 2,000-token prefill's time goes (cProfile, the top 6).

    python docs/results/draft-window/prefill.py > docs/results/draft-window/prefill.txt
"""
import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import torch

import d3d
from d3d.fetch import resolve_model

torch.set_grad_enabled(False)
path = resolve_model("qwen2.5-coder-0.5b")
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
text = tok.encode(Path(argparse.__file__).read_text())
d3d.generate(target, text[:64], max_new_tokens=1, spec="ar")  # warm
for n in (250, 500, 1000, 2000):
    t = time.perf_counter()
    d3d.generate(target, text[:n], max_new_tokens=1, spec="ar")
    dt = time.perf_counter() - t
    print(f"{n} prompt tokens: {dt:.2f} s, {n / dt:.0f} tokens/s", flush=True)
pr = cProfile.Profile()
pr.enable()
d3d.generate(target, text[:2000], max_new_tokens=1, spec="ar")
pr.disable()
out = io.StringIO()
pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(6)
print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[-1200:])
