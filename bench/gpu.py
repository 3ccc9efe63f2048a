"""Everything the GPU path needs measured, in one call: ``python -m bench gpu --out DIR``.

A GPU machine is lent rarely and briefly (about one task in ten, 15 minutes of device time in
all), so this script is the whole plan for it. Stages, most important first, each a subprocess
with its own time limit, so a failing or slow stage still leaves the others' results:

  device         torch / Triton / CUDA versions, the device and its memory
  kernel-tests   the kernel tests compiled by the real Triton compiler on CUDA tensors
  kernels-4k     attention (Qwen3-8B layout: 32 query / 8 KV heads, head dim 128; prefill,
                 verify, packed D3D, decode over 4k cached tokens; Triton vs torch path vs SDPA)
                 and the accept / denoise kernels at V = 151,936, batch 1 / 8 / 64
  passes         pass cost T = 1..64 of a random Qwen3-1.7B-shaped target in bf16 (host time
                 beside device time shows launch overhead; the engines have no CUDA graphs yet)
  speculative    the bundled pair, every mode, async with the CUDA-stream overlap
  hypotheses     async's K (outcome hypotheses) / F (fan-out) on validation prompts: what
                 ``d3d.decode.config.defaults`` should pick on a GPU (unmeasured so far), and sync
                 with bonus leaves (``leaves``: rows are nearly free on a GPU, so more should pay)
                 and copied drafts (``lookup``: sync's default 3, async's 0 unmeasured)
  quant          the Triton weight-only int8/int5/int4 matmul vs bf16 F.linear (``bench quantmm``)
  kernels-1k     attention over 1k and 8k cached tokens
  kernels-8k

Writes DIR/gpu.json (schema: bench/schema.py), DIR/summary.md, and per stage its JSON and log.
``--dry-run`` runs the same stages on the CPU at toy sizes (Triton interpreter) in about a
minute: what CI runs to prove the script works before a GPU ever sees it.

    python -m bench gpu --out docs/results/gpu/            (on the GPU machine: PYTHONPATH=. works)
    python -m bench gpu --dry-run --out /tmp/gpu-dry
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .common import machine, markdown_table, write_json


ROOT = Path(__file__).resolve().parent.parent
def K(k: int, f: int) -> str:
    """The bench mode of async drafting ahead for k outcomes, f bonus candidates each, every round."""
    return f"async,successor_threshold=0,hypotheses={k},fanout={f}"


KERNEL_TESTS = ["tests/test_attention.py", "tests/test_denoise.py", "tests/test_accept.py", "tests/test_quant.py"]


def stages(out: Path, dry: bool) -> list[tuple[str, list[str], int]]:
    """(name, command after ``python -m``, time limit in seconds), most important first."""
    o = lambda name: str(out / name)  # noqa: E731
    if dry:
        return [
            ("kernel-tests", ["pytest", "-q", "-p", "no:cacheprovider", "tests/test_attention.py", "-k", "mixed_batch"], 90),
            ("kernels-4k", ["bench", "kernels", "--quick", "--out", o("kernels_4k.json")], 60),
            ("passes", ["bench", "passes", "--preset", "qwen3-tiny", "--T", "1", "2", "--repeats", "2",
                        "--dtypes", "float32", "--out", o("passes.json")], 60),
            ("speculative", ["bench", "speculative", "--n", "1", "--new-tokens", "6", "--sets", "code",
                             "--modes", "ar", "sync", "async", "--out", o("speculative.json")], 90),
            ("hypotheses", ["bench", "speculative", "--validation", "--n", "1", "--new-tokens", "6", "--sets", "code",
                            "--modes", "ar", "sync", K(1, 1), K(4, 2), "sync,leaves=2", "sync,lookup=0",
                            "--out", o("hypotheses.json")], 90),
            ("quant", ["bench", "quantmm", "--quick", "--out", o("quantmm.json")], 60),
            ("kernels-1k", ["bench", "kernels", "--quick", "--attention-only", "--cache-len", "16",
                            "--out", o("kernels_1k.json")], 60),
            ("kernels-8k", ["bench", "kernels", "--quick", "--attention-only", "--cache-len", "64",
                            "--out", o("kernels_8k.json")], 60),
        ]
    return [
        ("kernel-tests", ["pytest", "-q", "-p", "no:cacheprovider", *KERNEL_TESTS], 150),
        ("kernels-4k", ["bench", "kernels", "--cache-len", "4096", "--out", o("kernels_4k.json")], 90),
        ("passes", ["bench", "passes", "--preset", "qwen3-1.7b", "--device", "cuda", "--dtypes", "bfloat16",
                    "--T", "1", "2", "4", "8", "16", "32", "64", "--repeats", "20", "--out", o("passes.json")], 90),
        ("speculative", ["bench", "speculative", "--device", "cuda", "--n", "4", "--sets", "code", "humaneval",
                         "--modes", "ar", "sync", "async", "async,overlap=none", "async,successor_threshold=0", "dflash",
                         "--out", o("speculative.json")], 150),
        ("hypotheses", ["bench", "speculative", "--device", "cuda", "--validation", "--n", "4", "--sets", "code",
                        "--modes", "ar", "sync", K(1, 1), K(4, 1), K(8, 3), K(16, 3), K(32, 3), "sync,leaves=0",
                        "sync,leaves=4", "sync,leaves=16", "sync,lookup=0", "async,lookup=3",
                        "--out", o("hypotheses.json")], 90),
        ("quant", ["bench", "quantmm", "--out", o("quantmm.json")], 60),
        ("kernels-1k", ["bench", "kernels", "--attention-only", "--cache-len", "1024", "--cases", "verify", "d3d",
                        "decode", "--out", o("kernels_1k.json")], 50),
        ("kernels-8k", ["bench", "kernels", "--attention-only", "--cache-len", "8192", "--cases", "verify", "d3d",
                        "decode", "--out", o("kernels_8k.json")], 50),
    ]


def device_info() -> dict:
    import torch

    info = {"cuda": torch.cuda.is_available(), "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if info["cuda"]:
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1),
                    multiprocessors=p.multi_processor_count)
    return info


def run_stage(name: str, cmd: list[str], limit: float, out: Path, env: dict) -> dict:
    """Run ``python -m CMD`` with a time limit; log to DIR/NAME.log; never raises."""
    log = out / f"{name}.log"
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT, env=env, timeout=limit,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        text, rc = proc.stdout, proc.returncode
        status = "ok" if rc == 0 else "failed"
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc, status = None, "timeout"
    log.write_text(text)
    row = {"status": status, "returncode": rc, "seconds": round(time.perf_counter() - t, 1),
           "command": "python -m " + " ".join(cmd), "log": log.name,
           "tables": [line for line in text.splitlines() if line.startswith("|")][:80]}
    tail = [line for line in text.splitlines() if line.strip()][-3:]
    row["last_lines"] = tail
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for gpu.json, summary.md and per-stage files")
    ap.add_argument("--dry-run", action="store_true", help="CPU, toy sizes, Triton interpreter (about a minute)")
    ap.add_argument("--budget", type=float, default=450, help="seconds for all stages together (default 450)")
    ap.add_argument("--stages", nargs="+", default=None, help="run only these stages (default: all)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = device_info()
    if not args.dry_run and not info["cuda"]:
        raise SystemExit("python -m bench gpu: no CUDA device here; use --dry-run to check the script on a CPU")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    if args.dry_run:
        env["TRITON_INTERPRET"] = "1"
    print(f"device: {json.dumps(info)}", file=sys.stderr)
    plan = stages(out, args.dry_run)
    if args.stages:
        unknown = set(args.stages) - {name for name, _, _ in plan}
        if unknown:
            ap.error(f"unknown stage(s) {sorted(unknown)}; stages: {', '.join(name for name, _, _ in plan)}")
        plan = [s for s in plan if s[0] in args.stages]
    deadline = time.perf_counter() + args.budget
    results = {}
    for name, cmd, limit in plan:
        left = deadline - time.perf_counter()
        if left < 10:
            results[name] = {"status": "skipped", "returncode": None, "seconds": 0.0,
                             "command": "python -m " + " ".join(cmd), "reason": "the --budget was spent"}
            continue
        print(f"[{name}] python -m {' '.join(cmd)}  (limit {min(limit, left):.0f} s)", file=sys.stderr, flush=True)
        results[name] = run_stage(name, cmd, min(limit, left), out, env)
        print(f"[{name}] {results[name]['status']} in {results[name]['seconds']} s", file=sys.stderr, flush=True)

    payload = {"bench": "gpu", "machine": machine(), "config": {**vars(args), "out": str(out)}, "device": info,
               "stages": results}
    summary = [f"# GPU run{' (dry run on CPU)' if args.dry_run else ''}", "",
               f"device: {info.get('name', 'CPU')}; torch {info['torch']}, CUDA {info['torch_cuda']}, "
               f"Triton {info['triton']}", "",
               markdown_table(["stage", "status", "seconds", "command"],
                              [[n, r["status"], r["seconds"], f"`{r['command']}`"] for n, r in results.items()])]
    for n, r in results.items():
        if r.get("tables"):
            summary += ["", f"## {n}", "", *r["tables"]]
    (out / "summary.md").write_text("\n".join(summary) + "\n")
    write_json(str(out / "gpu.json"), payload)
    print("\n".join(summary[:6 + len(results)]))
    return payload


if __name__ == "__main__":
    main()
