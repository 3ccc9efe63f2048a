"""The matmuls of one decoding pass, alone: every quantized matrix of a real model multiplied once (the
embedding table, a lookup, left out unless it is the LM head too), at 1, 2, 4, 8 and 16 rows, by the VNNI
kernel of this checkout and by the same file at another git revision, built side by side. Sweeps
interleaved, medians; ms and the GB/s at which the matrices' bytes were read, beside the machine's read
bandwidth. Both kernels must give the same bits (checked first, at 5 and 16 rows). ``--kernel maddubs``
times the AVX2 kernel (quant_maddubs.cpp) instead.

    python docs/results/vnni-streams/sweep.py qwen2.5-coder-1.5b --against 789d062 --repeats 9
"""
import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from d3d.cpu.quant import QuantWeight, Stacked
from d3d.doctor import read_bandwidth_gbs
from d3d.fetch import model_dir
from d3d.hardware import cpu_flags
from d3d.kernels import quant as K
from d3d.kernels.cpp import AVX2_FLAGS

ROOT = Path(__file__).resolve().parents[3]
ROWS = (1, 2, 4, 8, 16)


def matrices(model) -> list[QuantWeight]:
    """Every matrix a pass multiplies: the embedding table only where it is the LM head too (tied)."""
    out = []
    for name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if name != "embed_tokens" or w is model.output_weight():
            out += [p for p in (w.parts if isinstance(w, Stacked) else [w]) if isinstance(p, QuantWeight)]
    return out


def kernel_args(w: QuantWeight) -> tuple:
    e = K._EMPTY
    return (w.q, e if w.high is None else w.high, w.scale, e if w.min is None else w.min, w.out_features,
            w.in_features // w.scale.shape[1], 6 if w.six else w.bits, e if w.scale_d is None else w.scale_d,
            e if w.min_d is None else w.min_d)


SOURCES = {"vnni": "quant_vnni.cpp", "maddubs": "quant_maddubs.cpp"}


def build_at(rev: str, kernel: str = "vnni"):
    """quant_vnni.cpp or quant_maddubs.cpp (and the headers beside it) as of ``rev``, built as its own extension."""
    source = SOURCES[kernel]
    from torch.utils.cpp_extension import load

    where = Path(tempfile.mkdtemp(prefix="vnni-"))
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, "d3d/kernels/"], check=True,
                            capture_output=True, text=True).stdout.split()
    for f in [source] + [Path(p).name for p in listed if p.endswith(".h")]:
        (where / f).write_bytes(subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:d3d/kernels/{f}"],
                                               check=True, capture_output=True).stdout)
    print(f"building {source} at {rev} ...", flush=True)
    return load(name=f"{kernel}_at_{rev}", sources=[str(where / source)], extra_cflags=AVX2_FLAGS,
                extra_ldflags=["-fopenmp"], build_directory=str(where), verbose=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a fetched model's name (python -m d3d fetch NAME) or a checkpoint directory")
    ap.add_argument("--against", default="HEAD", help="git revision of the kernel to compare with (default HEAD)")
    ap.add_argument("--repeats", type=int, default=9, help="sweeps per (kernel, rows) (default 9)")
    ap.add_argument("--kernel", choices=sorted(SOURCES), default="vnni", help="which int8 kernel (default vnni)")
    args = ap.parse_args()
    from d3d.model.checkpoint import load_model

    torch.set_grad_enabled(False)
    path = Path(args.model) if Path(args.model).is_dir() else model_dir(args.model)
    ws = matrices(load_model(path, weights="auto"))
    calls = [kernel_args(w) for w in ws]
    nbytes = sum(t.numel() * t.element_size() for a in calls for t in a if isinstance(t, torch.Tensor))
    ours = K._load_vnni() if args.kernel == "vnni" else K._load_maddubs()
    if ours[0] is None:
        raise SystemExit(f"--kernel {args.kernel}: this checkout's kernel is unavailable: {ours[1]}")
    kernels = {"this checkout": ours[0], args.against: build_at(args.against, args.kernel)}
    xs = {r: {k: torch.randn(r, k) for k in {w.in_features for w in ws}} for r in ROWS}
    for w, a in zip(ws, calls):  # the same bits
        for x in (xs[16][w.in_features][:5], xs[16][w.in_features]):
            assert len({kernel.matmul(x, *a).numpy().tobytes() for kernel in kernels.values()}) == 1, w
    flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi",
                                  "avx512_bitalg", "amx_int8"})
    print(f"{path.name}: {len(ws)} matrices, {nbytes / 1e6:.0f} MB a pass; read bandwidth "
          f"{read_bandwidth_gbs():.1f} GB/s; cpu flags {' '.join(flags)}", flush=True)
    times = {(name, r): [] for name in kernels for r in ROWS}
    for _ in range(args.repeats):
        for name, kernel in kernels.items():
            for r in ROWS:
                start = time.perf_counter()
                for w, a in zip(ws, calls):
                    kernel.matmul(xs[r][w.in_features], *a)
                times[name, r].append(time.perf_counter() - start)
    for name in kernels:
        cells = [f"{r}: {statistics.median(times[name, r]) * 1e3:6.2f} ms "
                 f"({nbytes / statistics.median(times[name, r]) / 1e9:4.1f} GB/s)" for r in ROWS]
        print(f"{name:14} " + "  ".join(cells))
    print("rows r / 1 row: " + "  ".join(
        f"{name}: " + " ".join(f"{statistics.median(times[name, r]) / statistics.median(times[name, 1]):.2f}"
                               for r in ROWS[1:]) for name in kernels))


if __name__ == "__main__":
    main()
