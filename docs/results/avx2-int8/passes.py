"""verify(T)/step of a real model on this CPU standing in for an AVX2-only one (stand_in.py), three ways loaded side
by side in one process and timed interleaved: ``avx2-fp32`` (quant_gemm.cpp's AVX2 code, fp32 activations, int5
widened: d3d on AVX2 before quant_maddubs.cpp), ``avx2-int8-widened`` (quant_maddubs.cpp, int5 widened to int8),
``avx2-int8`` (quant_maddubs.cpp, int5 kept: the default now), and ``vnni`` (this CPU's own default). One T-row
pass after 200 cached tokens (bench passes' runner), medians of REPEATS rounds.

    python docs/results/avx2-int8/passes.py MODEL [REPEATS] [--out FILE]
"""
import argparse, contextlib, json, statistics, sys, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import d3d
import d3d.cpu.quant as cq
import d3d.kernels.quant as kq
from bench.common import machine, write_json
from bench.passes import pass_runner
from d3d.fetch import resolve_model
from stand_in import avx2_only

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("model")
ap.add_argument("repeats", type=int, nargs="?", default=15)
ap.add_argument("--out")
args = ap.parse_args()
torch.set_num_threads(2)
saved = (kq._load_vnni, kq.bound, cq.int5_kept, cq.int8_activations)


@contextlib.contextmanager
def configuration(name):
    if name != "vnni":
        kq._load_vnni = lambda: (None, "stand-in: AVX2 only")
        cq.int5_kept = lambda: name == "avx2-int8"
    if name == "avx2-fp32":
        kq.bound = lambda q, h, s, m, n, group, bits, int8_activations=False, sd=None, md=None: (
            lambda x, a=(q, kq._EMPTY if h is None else h, s, kq._EMPTY if m is None else m, n, group, bits,
                         kq.ISAS["avx2"]): kq._load()[0].matmul(x, *a))
        cq.int8_activations = lambda k, group: False
    try:
        yield
    finally:
        kq._load_vnni, kq.bound, cq.int5_kept, cq.int8_activations = saved


names = ["avx2-fp32", "avx2-int8-widened", "avx2-int8", "vnni"]
Ts = [1, 2, 4, 8, 16]
runs = {}
for name in names:
    with configuration(name):
        model = d3d.load_model(str(resolve_model(args.model)), weights="auto")
        for T in Ts:
            runs[name, T] = pass_runner(model, T, 200)
            runs[name, T]()  # binds every matrix's kernel in this configuration
    print(f"{name}: loaded ({model.weights})", file=sys.stderr, flush=True)
times = {k: [] for k in runs}
for _ in range(args.repeats):
    for k, fn in runs.items():
        t = time.perf_counter()
        fn()
        times[k].append(time.perf_counter() - t)
result = {}
for name in names:
    ms = {T: statistics.median(times[name, T][1:]) * 1e3 for T in Ts}
    result[name] = {"ms": ms, "verify_over_step": {T: ms[T] / ms[1] for T in Ts[1:]}}
    print(f"{name:18} step {ms[1]:5.1f} ms; verify(T)/step " + " ".join(f"{T}: {ms[T] / ms[1]:.2f}" for T in Ts[1:])
          + "; ms " + " ".join(f"{T}: {ms[T]:.1f}" for T in Ts), flush=True)
write_json(args.out, {"bench": "avx2-int8 passes", "machine": machine(), "model": args.model, "context": 200,
                      "repeats": args.repeats, "configurations": result})
