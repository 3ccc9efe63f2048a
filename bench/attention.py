"""Block-causal packed attention: the Triton kernel and the torch path against plain SDPA.

Four packed batches, the shapes inference produces (docs/design.md §4):
  prefill   N causal prompts, empty cache                          (target prefill)
  verify    N x 16 causal tokens over ragged caches                 (target verification)
  d3d       verification rows and drafter rows (4 clean tokens + a bidirectional block of 16)
            alternating in one launch, ragged caches                (packed D3D pass)
  decode    N x 1 token over ragged caches                          (autoregressive step)

Methods:
  triton      packed_attention_triton, one launch (CUDA only)
  torch-path  packed_attention_torch: one SDPA per sequence on cache views
  sdpa-mask   one SDPA over the batch padded to [N, H, Lq_max, D], keys k_cache[:, :, :S_max],
              an explicit boolean mask [N, 1, Lq_max, S_max]; inputs are built outside the
              timed region (favours the baseline)
  sdpa-causal one SDPA with is_causal=True (flash path on CUDA), prefill only (equal lengths)

FLOPs count only visible (query, key) pairs: 4 * H * D per pair (QK^T and PV, a multiply-add
each per element, 2 FLOPs), summed over the pairs the layout allows. Work a method spends on
masked pairs is not credited, so all methods are compared on the same useful work.

    python -m bench.attention [--heads 32 --kv-heads 8 --head-dim 128 --dtype bf16]
                              [--batch 8] [--cache-len 2048] [--prefill-len 1024] [--repeats 20]
                              [--threads N] [--out FILE]
Defaults are GPU-sized on CUDA and small on CPU. Triton timings need a GPU: on CPU the kernel
only runs in the (slow) interpreter, so it is left out.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from d3d.kernels.attention import (
    block_causal_groups,
    causal_groups,
    cu_seqlens_from_lengths,
    packed_attention_torch,
    packed_attention_triton,
)

from .common import machine, markdown_table, timeit, write_json

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def layouts(case: str, batch: int, cache_len: int, prefill_len: int):
    """Per sequence (group ids, cache length); caches are ragged so no two rows align."""
    ragged = [max(0, cache_len - 37 * n) for n in range(batch)]
    if case == "prefill":
        return [(causal_groups(prefill_len), 0) for _ in range(batch)]
    if case == "verify":
        return [(causal_groups(16), c) for c in ragged]
    if case == "d3d":
        return [(causal_groups(16) if n % 2 == 0 else block_causal_groups(4, 16, 1), c)
                for n, c in enumerate(ragged)]
    if case == "decode":
        return [(causal_groups(1), c) for c in ragged]
    raise ValueError(case)


def visible_pairs(seqs) -> int:
    """(query, key) pairs the layout allows: every cached key plus new keys of group <= own."""
    total = 0
    for g, c in seqs:
        total += len(g) * c + int(torch.searchsorted(g, g, right=True).sum())
    return total


def build(seqs, H, Hkv, D, dtype, device):
    """Packed inputs in production mode (new K/V already written into the cache)."""
    lens = [len(g) for g, _ in seqs]
    cache = [c for _, c in seqs]
    N, T, S = len(seqs), sum(lens), max(c + L for c, L in zip(cache, lens))
    q = torch.randn(T, H, D, dtype=dtype, device=device)
    k_cache = torch.randn(N, Hkv, S, D, dtype=dtype, device=device)
    v_cache = torch.randn(N, Hkv, S, D, dtype=dtype, device=device)
    args = dict(q=q, k=None, v=None, k_cache=k_cache, v_cache=v_cache,
                cu_seqlens=cu_seqlens_from_lengths(lens, device=device),
                cache_lens=torch.tensor(cache, dtype=torch.int32, device=device),
                group_ids=torch.cat([g for g, _ in seqs]).to(device), max_seqlen=max(lens))

    # the padded explicit-mask baseline
    Lq = max(lens)
    q_pad = torch.zeros(N, H, Lq, D, dtype=dtype, device=device)
    mask = torch.zeros(N, 1, Lq, S, dtype=torch.bool, device=device)
    mask[:, :, :, 0] = True  # padded query rows see one key: no empty softmax rows
    start = 0
    for n, ((g, c), L) in enumerate(zip(seqs, lens)):
        q_pad[n, :, :L] = q[start:start + L].transpose(0, 1)
        g = g.to(device)
        mask[n, 0, :L, :c] = True
        mask[n, 0, :L, c:c + L] = g[None, :] <= g[:, None]
        start += L
    padded = dict(q=q_pad, k=k_cache, v=v_cache, mask=mask)
    return args, padded


def median_seconds(fn, repeats: int, cuda: bool) -> tuple[float, list[float]]:
    """(median, all times) in seconds, after one warm-up call (the Triton compile)."""
    t = timeit(fn, repeats, sync=torch.cuda.synchronize if cuda else None)
    return t["median"], t["all"]


def main(argv=None) -> dict:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=["prefill", "verify", "d3d", "decode"])
    p.add_argument("--heads", type=int, default=32 if cuda else 8)
    p.add_argument("--kv-heads", type=int, default=8 if cuda else 2)
    p.add_argument("--head-dim", type=int, default=128 if cuda else 64)
    p.add_argument("--dtype", choices=DTYPES, default="bf16" if cuda else "fp32")
    p.add_argument("--batch", type=int, default=16 if cuda else 4)
    p.add_argument("--cache-len", type=int, default=4096 if cuda else 512)
    p.add_argument("--prefill-len", type=int, default=2048 if cuda else 256)
    p.add_argument("--repeats", type=int, default=20 if cuda else 10)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)

    device, dtype = ("cuda" if cuda else "cpu"), DTYPES[a.dtype]
    H, Hkv, D = a.heads, a.kv_heads, a.head_dim
    if not cuda:
        print("no CUDA device: timing the torch path and plain SDPA only; Triton timings need a GPU\n")
    torch.manual_seed(0)
    rows, results = [], []
    for case in a.cases:
        seqs = layouts(case, a.batch, a.cache_len, a.prefill_len)
        args, pad = build(seqs, H, Hkv, D, dtype, device)
        flops = 4 * H * D * visible_pairs(seqs)
        methods = {
            "torch-path": lambda: packed_attention_torch(**args),
            "sdpa-mask": lambda: F.scaled_dot_product_attention(
                pad["q"], pad["k"], pad["v"], attn_mask=pad["mask"], enable_gqa=H != Hkv),
        }
        if cuda:
            methods = {"triton": lambda: packed_attention_triton(**args), **methods}
        if case == "prefill":
            methods["sdpa-causal"] = lambda: F.scaled_dot_product_attention(
                pad["q"], pad["k"], pad["v"], is_causal=True, enable_gqa=H != Hkv)
        for name, fn in methods.items():
            with torch.inference_mode():
                sec, times = median_seconds(fn, a.repeats, cuda)
            tflops = flops / sec / 1e12
            rows.append([case, name, args["q"].shape[0], sec * 1e3, tflops])
            results.append(dict(case=case, method=name, tokens=args["q"].shape[0], ms=sec * 1e3,
                                ms_min=min(times) * 1e3, ms_max=max(times) * 1e3, tflops=tflops, flops=flops))

    print(f"H={H} Hkv={Hkv} D={D} {a.dtype} batch={a.batch} cache_len={a.cache_len} "
          f"prefill_len={a.prefill_len} on {'GPU' if cuda else 'CPU'}, median of {a.repeats}\n")
    print(markdown_table(["case", "method", "new tokens", "ms", "TFLOP/s"], rows))
    payload = dict(bench="attention", config=vars(a), machine=machine(), results=results)
    write_json(a.out, payload)
    return payload


if __name__ == "__main__":
    main()
