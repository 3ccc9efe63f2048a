"""glue_cpu.rope_write and attend_cpu over T rows of a verification pass, with the 0.5B's and the 1.5B's heads.
rope_write rotates q and k and writes k and v to the cache. attend_cpu runs T query rows of one sequence after
200 cached tokens, each seeing the cache and the block's rows up to its own (a drafted block's causal mask),
over an fp32 cache. Medians of 2000 calls after 200 (µs).

    python docs/results/pass-rest/time_kernels.py
"""
import statistics
import time

import torch

from d3d.kernels import glue_cpu
from d3d.kernels.attention_cpu import _load

CONTEXT = 200
HEADS = (("0.5B heads", 14, 2, 64), ("1.5B heads", 12, 2, 128))
attend = _load()[0].attend


def median_us(call, n=2000):
    for _ in range(200):
        call()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def rope(T, H, Hkv, D):
    qkv, cos, sin = torch.randn(T, (H + 2 * Hkv) * D), torch.randn(T, D), torch.randn(T, D)
    kc = torch.zeros(1, Hkv, 512, D)
    vc = torch.zeros_like(kc)
    rows, slots = torch.zeros(T, dtype=torch.long), torch.arange(T) + CONTEXT
    return lambda: glue_cpu.rope_write(qkv, cos, sin, kc, vc, rows, slots, H, Hkv)


def attention(T, H, Hkv, D):
    g = torch.Generator().manual_seed(T)
    q, kc, vc = torch.randn(T, H, D, generator=g), torch.randn(1, Hkv, 512, D, generator=g), torch.randn(1, Hkv, 512, D)
    rows, nkeys = torch.zeros(T, dtype=torch.long), CONTEXT + 1 + torch.arange(T)
    first, mask = torch.full((T,), CONTEXT, dtype=torch.long), torch.ones(T, T, dtype=torch.bool).tril()
    return lambda: attend(q, kc, vc, rows, nkeys, first, mask, D ** -0.5, 0)


for kernel in (rope, attention):
    for name, H, Hkv, D in HEADS:
        cells = [f"T={T:2d} {median_us(kernel(T, H, Hkv, D)):6.1f} us" for T in (1, 8, 16)]
        print(f"{kernel.__name__} {name} ({H} x {D}, {Hkv} kv heads): " + " | ".join(cells))
