"""Pass-cost curve: one forward pass over T new tokens, T = 1, 2, 4, ..., for target and drafter.

Speculative decoding pays when a T-token verification pass costs about what a 1-token step does
(``vs_T1`` near 1). Each model is timed in the dtype the policy picks (``d3d.cpu.precision``) and in
float32, on a cache already holding ``--context`` tokens; every (model, dtype, T) is run once per
repeat, repeats interleaved so that machine drift hits all alike; medians are reported.

    python -m bench passes [--target DIR] [--drafter DIR] [--T 1 2 4 8 16 32] [--out FILE]
    python -m bench passes --preset qwen3-1.7b --device cuda --T 1 2 4 8 16 32 64   (a GPU)
    python -m bench passes --target DIR --dtypes float32 --cpu-matmul panels onednn   (the fp32 CPU matmuls)

``host_ms`` is the time until the forward call returns; on CUDA, a ``host_ms`` close to ``ms``
means the pass is bound by launching kernels rather than by running them. ``gb_s``: the bytes of the
matrices a pass multiplies over its median time, beside the machine's read bandwidth (``read_gb_s``,
``d3d.doctor.read_bandwidth_gbs``): how close a step comes to streaming its weights at memory speed.
``floor_ms`` (quantized weights on a CPU with AVX-512 VNNI): the least the pass's matmuls can take, reading
the weights at that bandwidth or doing T rows' int8 multiply-adds at the machine's rate (``int8_macs_per_s``,
``d3d.kernels.quant.int8_macs_per_second``), the slower; attention and the rest come on top.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import d3d
from d3d.draft.pick import pick_drafter
from d3d.cpu.precision import auto_dtype, resolve_dtype
from d3d.doctor import read_bandwidth_gbs
from d3d.kernels import quant as quant_kernel
from d3d.model.transformer import QuantLinear

from .common import target_dir as bench_target, interleaved, machine, markdown_table, random_model, write_json


def pass_runner(model, T: int, context: int):
    """A function running one T-token pass after ``context`` cached tokens (the cache is rolled
    back after each run, so every run sees the same state). On CUDA it returns the host time
    to enqueue the pass; the caller's timer (after a synchronize) gives the whole pass."""
    cache = model.new_cache(1, context + T)
    gen = torch.Generator().manual_seed(T)
    prompt = torch.randint(0, model.cfg.vocab_size, (context,), generator=gen).to(model.device)
    new = torch.randint(0, model.cfg.vocab_size, (T,), generator=gen).to(model.device)
    cuda = model.device.type == "cuda"
    with torch.inference_mode():
        model(prompt, cache.layout([context]), cache)

    def run():
        t = time.perf_counter()
        with torch.inference_mode():
            model(new, cache.layout([T]), cache)
        host = time.perf_counter() - t
        if cuda:
            torch.cuda.synchronize()
        cache.crop(0, context)
        return host

    return run


def matrices(model) -> list:
    """The matrices one pass multiplies, each once: every linear layer's weight (quantized or dense), the
    LM head included; not the embedding, whose lookup reads only the rows of the pass's tokens."""
    seen, out = set(), []
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, QuantLinear)) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            out.append(m)
    return out


def streamed_bytes(model) -> int:
    """Bytes of the matrices one pass multiplies (``matrices``)."""
    return sum(m.weight.nbytes for m in matrices(model))


def macs_per_row(model) -> int:
    """Multiply-adds of the matrices one pass multiplies, per row."""
    return sum(m.in_features * m.out_features for m in matrices(model))


def floor_ms(bytes_: int, macs: int, T: int, read_gb_s: float, macs_per_s: float) -> float:
    """The least a T-row pass of quantized matrices can take: reading their bytes at the read bandwidth or
    their T x ``macs`` int8 multiply-adds at the machine's rate (``quant.int8_macs_per_second``), the slower."""
    return max(bytes_ / read_gb_s / 1e6, T * macs / macs_per_s * 1e3)


def vnni_rate(int8: set) -> float | None:
    """The machine's int8 multiply-add rate where some timed model multiplies int8 activations (the VNNI
    kernel, a CPU with AVX-512 VNNI: ``int8``, the (model, dtype) pairs that do), else None (no probe for the
    AVX2 kernel)."""
    return quant_kernel.int8_macs_per_second() if int8 and quant_kernel.vnni_available() else None


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench passes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="target directory or a real model's name, fetched once (default: the bundled target)")
    ap.add_argument("--preset", help="time a random-weight model of this d3d.model.config preset instead of --target "
                                     "(e.g. qwen3-1.7b on a GPU; implies --drafter none)")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    ap.add_argument("--drafter", help="D3D drafter directory (default: the bundled drafter that fits the target; "
                                      "'none' to skip)")
    ap.add_argument("--T", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32], help="new tokens per pass")
    ap.add_argument("--context", type=int, default=64, help="tokens already cached (default 64)")
    ap.add_argument("--repeats", type=int, default=30, help="timed runs per (model, dtype, T) (default 30)")
    ap.add_argument("--dtypes", nargs="+", default=None,
                    help="dtypes to time (default: the policy's choice and float32)")
    ap.add_argument("--cpu-matmul", nargs="+", default=None, choices=["auto", "panels", "onednn"],
                    help="fp32 CPU matmuls to time side by side (D3D_CPU_MATMUL: the row-invariant panels of "
                         "d3d.kernels.skinny or oneDNN; default: the current choice)")
    ap.add_argument("--weights", nargs="+", default=["dense"],
                    choices=["dense", "auto", "int8", "int4"],
                    help="how the matrices are held (load_model's weights; dense: in each of --dtypes; the others "
                         "compute in fp32 and are labelled by their weights in the dtype column; default dense)")
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    if any(t < 1 for t in args.T) or args.context < 1 or args.repeats < 1:
        ap.error("--T values, --context and --repeats must be >= 1")
    policy = auto_dtype(args.device)
    dtypes = args.dtypes or list(dict.fromkeys([policy.dtype, "float32"]))
    print(f"dtype policy: {policy.dtype} ({policy.reason})", file=sys.stderr)
    target_dir = bench_target(args.target, "passes")
    drafter_dir = Path(args.drafter) if args.drafter not in (None, "none") and not args.preset else None

    runners, models, int8, sizes = {}, {}, set(), {}
    before = os.environ.get("D3D_CPU_MATMUL")
    matmuls = args.cpu_matmul or [before or "auto"]
    try:
        configs = [(dt, m, "dense") for dt, m in itertools.product(dtypes, matmuls) if "dense" in args.weights]
        configs += [("float32", m, w) for m, w in itertools.product(matmuls, args.weights) if w != "dense"]
        for dt, matmul, weights in configs:
            os.environ["D3D_CPU_MATMUL"] = matmul
            if args.preset:
                target = random_model(args.preset, args.device).to(resolve_dtype(dt, args.device)).pack_for_cpu()
            else:
                target = d3d.load_model(target_dir, dtype=dt, device=args.device, weights=weights)
            dt = dt if weights == "dense" else target.weights
            todo = {"target": target}
            models["target"] = {"dir": f"random {args.preset}" if args.preset else str(target_dir),
                                "parameters": target.cfg.num_parameters()}
            drafter = None
            if drafter_dir is not None:
                drafter = d3d.load_drafter(drafter_dir, target=target)
            elif args.drafter is None and not args.preset:  # the bundled D3D drafter that fits the target
                _, drafter, note = pick_drafter(target, None)
                if note:
                    print(f"bench passes: {note}" + ("" if drafter is not None else "; no drafter timed"), file=sys.stderr)
            if drafter is not None:
                todo["drafter"] = drafter.model
                models["drafter"] = {"dir": str(drafter_dir or drafter.model.source or "bundled"),
                                     "parameters": drafter.num_parameters(include_shared=True)}
            for name, model in todo.items():
                if model.int8_activations:  # its matmuls have a floor (floor_ms)
                    int8.add((name, dt))
                sizes[(name, dt, matmul)] = streamed_bytes(model)  # per configuration: dtypes and formats differ
                models[name]["macs_per_row"] = macs_per_row(model)
                for T in args.T:
                    runners[(name, dt, matmul, T)] = pass_runner(model, T, args.context)
    finally:  # the choice is read when the weights are packed, at load: put it back after
        if before is None:
            os.environ.pop("D3D_CPU_MATMUL", None)
        else:
            os.environ["D3D_CPU_MATMUL"] = before
    host = {k: [] for k in runners}
    timed = {k: (lambda fn=fn, k=k: host[k].append(fn())) for k, fn in runners.items()}
    times = interleaved(timed, args.repeats)  # warm-up first (on CUDA: Triton compiles there)
    host = {k: v[1:] for k, v in host.items()}  # the warm-up run's host time is not a measurement

    results = []
    for (name, dt, matmul, T), ts in times.items():
        ms = statistics.median(ts) * 1e3
        results.append({"model": name, "dtype": dt, "cpu_matmul": matmul, "T": T, "ms": ms, "ms_min": min(ts) * 1e3,
                        "ms_max": max(ts) * 1e3, "host_ms": statistics.median(host[(name, dt, matmul, T)]) * 1e3})
    base = {(r["model"], r["dtype"], r["cpu_matmul"]): r["ms"] for r in results if r["T"] == min(args.T)}
    for r in results:
        r["vs_T1"] = r["ms"] / base[(r["model"], r["dtype"], r["cpu_matmul"])]
        r["streamed_bytes"] = sizes[(r["model"], r["dtype"], r["cpu_matmul"])]
        r["gb_s"] = r["streamed_bytes"] / r["ms"] / 1e6
    read = read_bandwidth_gbs() if args.device == "cpu" else None
    rate = vnni_rate(int8)
    for r in results:  # quantized weights through the VNNI kernel: the floor of their matmuls (floor_ms)
        if (r["model"], r["dtype"]) in int8 and rate is not None:
            r["floor_ms"] = floor_ms(r["streamed_bytes"], models[r["model"]]["macs_per_row"], r["T"], read, rate)
    print(markdown_table(["model", "dtype", "fp32 matmul", "T", "ms (median)", "min..max", f"vs T={min(args.T)}",
                          "weights GB/s", "matmul floor ms"],
                         [[r["model"], r["dtype"], r["cpu_matmul"], r["T"], f"{r['ms']:.2f}",
                           f"{r['ms_min']:.2f}..{r['ms_max']:.2f}", f"{r['vs_T1']:.2f}x", f"{r['gb_s']:.1f}",
                           f"{r['floor_ms']:.2f}" if "floor_ms" in r else "-"]
                          for r in results]))
    if read is not None:
        print(f"machine read bandwidth: {read:.1f} GB/s ({torch.get_num_threads()} threads, d3d.doctor.read_bandwidth_gbs)")
    if rate is not None:
        print(f"machine int8 multiply-adds: {rate / 1e9:.0f} G/s (vpdpbusd, d3d.kernels.quant.int8_macs_per_second); "
              "matmul floor: the weights' bytes at the read bandwidth or T rows' multiply-adds at that rate, the slower")
    payload = {"bench": "passes", "machine": machine(), "config": vars(args), "models": models, "results": results,
               "read_gb_s": read, "int8_macs_per_s": rate,
               # on CUDA: host_ms close to ms means the pass is launch-bound (the GPU waits for the host)
               "cuda_graphs": "not supported by the engines yet" if args.device.startswith("cuda") else None}
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
