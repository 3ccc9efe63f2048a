"""attend_cpu at long contexts, this checkout against another revision's kernel (built side by side from git):
one sequence's T query rows (T = 1: a decoding step; 8: a verification pass) over L cached keys, every layer its
own fp32 cache so that a pass reads them from memory as decoding does; the 0.5B's heads (14 x 64, 2 kv heads,
24 layers) and the 1.5B's (12 x 128, 2 kv, 28 layers); 2 threads; the kernels take turns, medians. The outputs of
both are checked equal first. ``--blocks``: this checkout at other block sizes too (bytes of K a block).

    python docs/results/attend-blocks/compare.py [--against REV] [--blocks 16384 65536 ...] > OUT.txt
"""
import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from d3d.doctor import read_bandwidth_gbs
from d3d.hardware import cpu_flags
from d3d.kernels.attention_cpu import _load
from d3d.kernels.cpp import AVX2_FLAGS

ROOT = Path(__file__).resolve().parents[3]
HEADS = (("0.5B", 14, 2, 64, 24), ("1.5B", 12, 2, 128, 28))


def build_at(rev: str):
    where = Path(tempfile.mkdtemp(prefix="attend-"))
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:d3d/kernels/attend_cpu.cpp"], check=True,
                            capture_output=True).stdout
    (where / "attend_cpu.cpp").write_bytes(source)
    from torch.utils.cpp_extension import load
    print(f"building attend_cpu.cpp at {rev} ...", flush=True)
    return load(name=f"attend_at_{rev}", sources=[str(where / "attend_cpu.cpp")], extra_cflags=AVX2_FLAGS,
                build_directory=str(where), verbose=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="HEAD", help="git revision of the kernel to compare with (default HEAD)")
    ap.add_argument("--blocks", type=int, nargs="*", default=[], help="this checkout at these block sizes too")
    ap.add_argument("--L", type=int, nargs="+", default=[256, 1024, 2048, 4096], help="cached keys")
    ap.add_argument("--T", type=int, nargs="+", default=[1, 8], help="query rows of the sequence")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(2)
    ours, old = _load()[0], build_at(args.against)
    kernels = {"this checkout": lambda *a: ours.attend(*a, 0, 0), args.against: lambda *a: old.attend(*a, 0)}
    for b in args.blocks:
        kernels[f"block {b // 1024} KB"] = lambda *a, b=b: ours.attend(*a, 0, b)
    print("cpu flags:", " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "avx_vnni", "amx")))),
          f"; read bandwidth {read_bandwidth_gbs():.1f} GB/s", flush=True)
    for name, H, Hkv, D, layers in HEADS:
        for L in args.L:
            g = torch.Generator().manual_seed(L)
            caches = [(torch.randn(1, Hkv, L + 16, D, generator=g), torch.randn(1, Hkv, L + 16, D, generator=g))
                      for _ in range(layers)]
            for T in args.T:
                q = torch.randn(T, H, D, generator=g)
                rows, nkeys = torch.zeros(T, dtype=torch.long), torch.arange(L - T + 1, L + 1)
                first, mask = nkeys - 1, torch.ones(T, 1, dtype=torch.bool)
                a = (q, None, None, rows, nkeys, first, mask, D ** -0.5)
                outs = {k: f(q, *caches[0], *a[3:]) for k, f in kernels.items()}
                assert all(torch.equal(o, outs[args.against]) for o in outs.values()), (name, L, T)
                ts = {k: [] for k in kernels}
                for _ in range(args.repeats):
                    for k, f in kernels.items():
                        t = time.perf_counter()
                        for kc, vc in caches:
                            f(q, kc, vc, *a[3:])
                        ts[k].append(time.perf_counter() - t)
                base = statistics.median(ts[args.against])
                cells = "  ".join(f"{k}: {statistics.median(v) * 1e3:6.2f} ms ({base / statistics.median(v):.2f}x)"
                                  for k, v in ts.items())
                print(f"{name} L={L:5d} T={T:2d}  {cells}", flush=True)


if __name__ == "__main__":
    main()
