"""The VNNI kernel's rate on one matrix that stays in L2, this checkout against another revision's kernel, the two
taking turns (the bits checked equal first; --kernel maddubs: the AVX2 kernel): how far a tile of rows is from the machine's vpdpbusd rate with no
memory stalls. Random GGUF blocks of each kind, 512 x 1536; 1 and 2 threads; medians.

    python docs/results/kquant-rows/tiles.py --against 48e653f > docs/results/kquant-rows/tiles.txt
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[3] / "tests"))
sys.path.insert(0, str(HERE.parents[1] / "vnni-streams"))
from sweep import build_at, kernel_args  # noqa: E402  (another revision's kernel; a matrix's kernel arguments)
from test_quant import random_blocks  # noqa: E402  (the tests' random GGUF blocks)

from d3d.cpu.quant import QuantWeight  # noqa: E402
from d3d.hardware import cpu_flags  # noqa: E402
from d3d.kernels import quant as K  # noqa: E402
from d3d.model.gguf import block_parts  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="HEAD", help="git revision of the kernel to compare with (default HEAD)")
    ap.add_argument("--reps", type=int, default=15, help="timed turns per kernel (default 15)")
    ap.add_argument("--rows", default="1,4,8,16", help="row counts (default 1,4,8,16)")
    ap.add_argument("--kinds", default="Q4_K,Q6_K,Q8_0,Q5_0", help="GGUF block kinds (default Q4_K,Q6_K,Q8_0,Q5_0)")
    ap.add_argument("--kernel", choices=("vnni", "maddubs"), default="vnni",
                    help="the AVX-512 VNNI kernel or the AVX2 one, quant_maddubs.cpp (default vnni)")
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    ours = K._load_vnni() if args.kernel == "vnni" else K._load_maddubs()
    if ours[0] is None:
        raise SystemExit(f"--kernel {args.kernel}: this checkout's kernel is unavailable: {ours[1]}")
    kernels = {"now": ours[0], args.against: build_at(args.against, args.kernel)}
    print("cpu flags:", " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))))
    rng = np.random.default_rng(0)
    n, k = 512, 1536
    for threads in (1, 2):
        torch.set_num_threads(threads)
        chains = K.int8_macs_per_second() / 64 / 1e9
        for kind in args.kinds.split(","):
            w = QuantWeight(*block_parts(random_blocks(kind, n, k, rng), kind, (n, k)))
            a = kernel_args(w)
            for rows in rows_list:
                x = torch.randn(rows, k)
                assert len({kk.matmul(x, *a).numpy().tobytes() for kk in kernels.values()}) == 1, (kind, rows)
                ts = {name: [] for name in kernels}
                for _ in range(args.reps):
                    for name, kk in kernels.items():
                        t = time.perf_counter()
                        for _ in range(50):
                            kk.matmul(x, *a)
                        ts[name].append((time.perf_counter() - t) / 50)
                med = {name: statistics.median(v) for name, v in ts.items()}
                cells = [f"{name}: {s * 1e6:6.1f} us {rows * n * k / 64 / s / 1e9:5.2f} G/s" for name, s in med.items()]
                print(f"{threads}t {kind} M={rows:2d}  " + " | ".join(cells)
                      + f"  now {med[args.against] / med['now']:.3f}x  (chains {chains:.1f} G/s)", flush=True)


if __name__ == "__main__":
    main()
