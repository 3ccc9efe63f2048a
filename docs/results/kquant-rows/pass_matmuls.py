"""The matmuls of one pass of a real model (every quantized matrix once, weights from memory as in decoding), this
checkout's VNNI kernel against other revisions', the kernels taking turns in alternating order (the first after a
switch pays for it); the bits checked equal first. Medians, 2 threads.

    python docs/results/kquant-rows/pass_matmuls.py qwen2.5-coder-1.5b --against 48e653f --rows 1,4,6,8,16
    python docs/results/kquant-rows/pass_matmuls.py qwen2.5-coder-0.5b --kernel maddubs   (the AVX2 kernel)
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vnni-streams"))
from sweep import build_at, kernel_args, matrices  # noqa: E402

from d3d.doctor import read_bandwidth_gbs  # noqa: E402
from d3d.fetch import resolve_model  # noqa: E402
from d3d.hardware import cpu_flags  # noqa: E402
from d3d.kernels import quant as K  # noqa: E402
from d3d.model.checkpoint import load_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a fetched model's name or a checkpoint directory")
    ap.add_argument("--against", default="HEAD", help="git revisions of the kernel, comma-separated (default HEAD)")
    ap.add_argument("--rows", default="1,4,8,16", help="row counts (default 1,4,8,16)")
    ap.add_argument("--reps", type=int, default=15, help="turns per kernel and row count (default 15)")
    ap.add_argument("--kernel", choices=("vnni", "maddubs"), default="vnni",
                    help="the AVX-512 VNNI kernel or the AVX2 one, quant_maddubs.cpp (default vnni)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    ws = matrices(load_model(resolve_model(args.model), weights="auto"))
    calls = [kernel_args(w) for w in ws]
    kernels = {"now": (K._load_vnni() if args.kernel == "vnni" else K._load_maddubs())[0]}
    for rev in args.against.split(","):
        kernels[rev] = build_at(rev, args.kernel)
    rows_list = [int(r) for r in args.rows.split(",")]
    xs = {r: {k: torch.randn(r, k) for k in {w.in_features for w in ws}} for r in rows_list}
    for w, a in zip(ws, calls):
        x = xs[rows_list[-1]][w.in_features]
        assert len({kk.matmul(x, *a).numpy().tobytes() for kk in kernels.values()}) == 1, w
    print(f"{args.model}: {len(ws)} matrices; read bandwidth {read_bandwidth_gbs():.1f} GB/s; cpu flags "
          + " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))), flush=True)
    names = list(kernels)
    times = {(name, r): [] for name in names for r in rows_list}
    for rep in range(args.reps):
        for r in rows_list:
            for name in names if rep % 2 == 0 else names[::-1]:
                t = time.perf_counter()
                for w, a in zip(ws, calls):
                    kernels[name].matmul(xs[r][w.in_features], *a)
                times[name, r].append(time.perf_counter() - t)
    base = names[-1]
    for r in rows_list:
        b = statistics.median(times[base, r])
        print(f"rows {r:2d}: " + "  ".join(f"{name} {statistics.median(times[name, r]) * 1e3:7.2f} ms "
                                          f"({b / statistics.median(times[name, r]):.3f}x)" for name in names))


if __name__ == "__main__":
    main()
