"""Does the 16-row oneDNN packing (d3d.cpu.linear.BATCH_HINT) slow the 1-row steps of ar in fp32?

One model per packing, loaded in turn (fp32, the dtype policy's choice on an AVX2 CPU): after a
176-token prefill, the median ms of a target pass of T = 1, 4, 8, 16 rows (cropped back each time),
and ar tok/s on 2 validation chat requests x 64 tokens, with the greedy tokens compared across packings.

    python docs/results/pack-hint/probe.py TARGET_DIR > docs/results/pack-hint/probe.txt
"""
import gc
import sys
import time

import torch

import d3d
import d3d.cpu.linear as cl
from d3d.data.corpus import training_corpus
from d3d.model.tokenizer import load_tokenizer
from d3d.train.chat_data import chat_prompts

T = sys.argv[1]
tok = load_tokenizer(T)
prompts = chat_prompts(tok, training_corpus(T), 0.05, 2, "validation", seed=1234, templates=1)
tokens = {}
for hint in (16, 1, 16, 1):
    cl.BATCH_HINT = hint
    model = d3d.load_model(T, dtype="float32")
    d3d.generate(model, prompts[0][:32], max_new_tokens=4, stop_ids=[])
    cache = model.new_cache(1, 1024)
    p = prompts[0]
    model(torch.tensor(p), cache.layout([len(p)]), cache)
    passes = {}
    for rows in (1, 4, 8, 16):
        ts = []
        for _ in range(7):
            t = time.perf_counter()
            model(torch.tensor(p[:rows]), cache.layout([rows]), cache)
            ts.append(time.perf_counter() - t)
            cache.crop(0, len(p))
        passes[rows] = round(sorted(ts)[3] * 1000, 1)
    t = time.perf_counter()
    out = [d3d.generate(model, q, max_new_tokens=64, stop_ids=[]).tokens[0] for q in prompts]
    rate = 128 / (time.perf_counter() - t)
    same = tokens.setdefault("ref", out) == out
    print(f"hint {hint:2d}: pass ms T=1,4,8,16 {list(passes.values())}; ar {rate:.2f} tok/s (prefill included); "
          f"tokens equal to the first run's: {same}", flush=True)
    del model, cache
    gc.collect()
