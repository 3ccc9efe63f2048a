"""The matmuls of one pass of a real model (every quantized matrix once, weights from memory as in decoding)
through quant_vnni.cpp's engines, VNNI tiles against AMX tiles, taking turns in alternating order, the bits
checked equal first. Medians, 2 threads; per row count the pass's time and its ratio to one VNNI row.
The AMX engine was not landed: apply it first (against 3319ff6; README.md here says why).

    git apply docs/results/amx/amx.patch
    python docs/results/amx/engines.py qwen2.5-coder-1.5b --rows 1,2,4,8,16 --reps 15
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vnni-streams"))
from sweep import kernel_args, matrices  # noqa: E402

from d3d.doctor import read_bandwidth_gbs  # noqa: E402
from d3d.fetch import resolve_model  # noqa: E402
from d3d.hardware import cpu_flags  # noqa: E402
from d3d.kernels import quant as K  # noqa: E402
from d3d.model.checkpoint import load_model  # noqa: E402

ENGINES = {"vnni": 0, "amx": 1, "amx-emulated": 2}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a fetched model's name or a checkpoint directory")
    ap.add_argument("--engines", default="vnni,amx", help="of " + ", ".join(ENGINES) + " (default vnni,amx)")
    ap.add_argument("--rows", default="1,2,4,8,16", help="row counts (default 1,2,4,8,16)")
    ap.add_argument("--reps", type=int, default=15, help="turns per engine and row count (default 15)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    module = K._load_vnni()[0]
    names = args.engines.split(",")
    unknown = [n for n in names if n not in ENGINES]
    if module is not None and not hasattr(module, "set_engine"):
        sys.exit("this checkout's quant_vnni.cpp has no engines: git apply docs/results/amx/amx.patch first")
    if module is None or unknown:
        sys.exit(f"--engines: unknown {unknown}" if unknown else f"no VNNI kernel: {K.why_vnni_unavailable()}")
    before = module.set_engine()
    ws = matrices(load_model(resolve_model(args.model), weights="auto"))
    calls = [kernel_args(w) for w in ws]
    rows_list = [int(r) for r in args.rows.split(",")]
    xs = {r: {k: torch.randn(r, k) for k in {w.in_features for w in ws}} for r in rows_list}

    def run(name, r):
        module.set_engine(ENGINES[name], 1)
        return [module.matmul(xs[r][w.in_features], *a) for w, a in zip(ws, calls)]

    for r in rows_list:
        outs = [run(name, r) for name in names]
        assert all(torch.equal(a, b) for o in outs[1:] for a, b in zip(outs[0], o)), f"rows {r}: engines differ"
    print(f"{args.model}: {len(ws)} matrices; read bandwidth {read_bandwidth_gbs():.1f} GB/s; cpu flags "
          + " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))), flush=True)
    times = {(name, r): [] for name in names for r in rows_list}
    for rep in range(args.reps):
        for r in rows_list:
            for name in names if rep % 2 == 0 else names[::-1]:
                module.set_engine(ENGINES[name], 1)
                t = time.perf_counter()
                for w, a in zip(ws, calls):
                    module.matmul(xs[r][w.in_features], *a)
                times[name, r].append(time.perf_counter() - t)
    module.set_engine(*before)
    one = statistics.median(times[names[0], rows_list[0]])
    for r in rows_list:
        print(f"rows {r:2d}: " + "  ".join(f"{name} {statistics.median(times[name, r]) * 1e3:7.2f} ms "
                                          f"({statistics.median(times[name, r]) / one:.2f}x)" for name in names))


if __name__ == "__main__":
    main()
