"""Weight-only quantized matmul on a GPU: the Triton kernel (``d3d.kernels.quant_triton``) vs bf16 ``F.linear``.

For int8 / int5 / int4 weights of a 4096 x 4096 matrix (Qwen3-1.7B-like; ``--quick``: 128 x 256) and
M = 1, 4, 16 rows, the median time of the Triton kernel and of bf16 ``F.linear`` on the same shape,
the weight bytes each streams and the GB/s, and the largest difference from the torch reference.
On a CPU (Triton interpreter) only ``--quick`` is sensible: it proves the script runs.

    python -m bench quantmm [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from .common import machine, markdown_table, write_json


def timed(fn, repeats: int, cuda: bool) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> dict:
    from d3d.kernels.quant_triton import quant_linear_torch, quant_linear_triton

    ap = argparse.ArgumentParser(prog="python -m bench quantmm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="toy sizes (the CPU's interpreter)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from d3d.kernels import interpreting

    cuda = torch.cuda.is_available()
    if not cuda and not interpreting():
        raise SystemExit("bench quantmm: no GPU here; on a CPU run it in the Triton interpreter: "
                         "TRITON_INTERPRET=1 python -m bench quantmm --quick")
    dev = "cuda" if cuda else "cpu"
    N, K = (128, 256) if args.quick else (4096, 4096)
    repeats = 2 if args.quick else 50
    g = torch.Generator().manual_seed(0)
    rows = []
    for bits in (8, 5, 4):
        q = (torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g) if bits == 8 else
             torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)).to(dev)
        s = torch.rand(N, K // 32, generator=g).half().to(dev)
        m = torch.randn(N, K // 32, generator=g).half().to(dev) if bits == 4 else None
        h = torch.randint(0, 256, (N, K // 8), dtype=torch.uint8, generator=g).to(dev) if bits == 5 else None
        nbytes = sum(t.numel() * t.element_size() for t in (q, s, m, h) if t is not None)
        w16 = torch.randn(N, K, generator=g).to(dev, torch.bfloat16)
        for M in (1, 4, 16):
            x = torch.randn(M, K, generator=g).to(dev)
            err = (quant_linear_triton(x, q, s, m, bits, h) - quant_linear_torch(x, q, s, m, bits, h)).abs().max().item()
            ms = timed(lambda: quant_linear_triton(x, q, s, m, bits, h), repeats, cuda)
            ms16 = timed(lambda: F.linear(x.to(torch.bfloat16), w16), repeats, cuda)
            rows.append({"bits": bits, "M": M, "N": N, "K": K, "ms": ms, "bf16_ms": ms16, "weight_bytes": nbytes,
                         "gb_s": nbytes / ms / 1e6, "bf16_gb_s": N * K * 2 / ms16 / 1e6, "max_abs_diff": err})
    print(markdown_table(["bits", "M", "Triton ms", "GB/s", "bf16 F.linear ms", "GB/s", "max |diff| vs torch"],
                         [[r["bits"], r["M"], f"{r['ms']:.3f}", f"{r['gb_s']:.0f}", f"{r['bf16_ms']:.3f}",
                           f"{r['bf16_gb_s']:.0f}", f"{r['max_abs_diff']:.1e}"] for r in rows]))
    payload = {"bench": "quantmm", "machine": machine(), "config": vars(args), "device": dev, "results": rows}
    write_json(args.out, payload)
    return payload
