"""Autoregressive decode: d3d vs transformers ``generate`` on the same checkpoint, batch 1.

Two model sizes, chosen for what bounds them on a CPU:
  qwen3-100m  memory-bound: every token streams all weights once; we report achieved GB/s
              (weight bytes read per token x tok/s) against the measured copy bandwidth.
  qwen3-15m   overhead-bound: per-token Python and kernel-launch cost dominates.

Both engines run greedy, in the same dtype (d3d's policy unless --dtype), the same prompt and
token count, side by side in one process, repeats interleaved; tok/s counts generated tokens over
the whole call (prefill included, for both). ``bundled`` times the bundled target's weights.

    python -m bench decode [--sizes qwen3-15m qwen3-100m] [--new-tokens 128] [--repeats 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

import d3d
from d3d.assets import BUNDLED_TARGET, bundled
from d3d.model.transformer import Transformer

from .common import (compare_table, copy_bandwidth_gbs, interleaved, load_json, machine, markdown_table,
                     random_model, write_json)


def weight_bytes_per_token(model: Transformer) -> int:
    """Bytes of weights read to decode one token: everything but the embedding table, plus the
    output matrix (which is the embedding table when tied); the embedding lookup reads one row."""
    cfg = model.cfg
    total = cfg.num_parameters(include_embeddings=False) + cfg.vocab_size * cfg.hidden_size
    return total * model.dtype.itemsize


def bench_size(name: str, new_tokens: int, repeats: int, prompt_len: int, with_hf: bool, dtype: str) -> dict:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        if name == "bundled":  # the bundled target's own weights
            src = bundled(BUNDLED_TARGET)
        else:  # a random model of a preset shape, written once so both engines load the same file
            d3d.save_model(random_model(name), tmp)
            src = tmp
        model = d3d.load_model(src, dtype=dtype)
        hf = None
        if with_hf:
            import transformers

            hf = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=model.dtype).eval()
    cfg = model.cfg
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,))
    runners = {"d3d": lambda: d3d.generate(model, prompt.tolist(), max_new_tokens=new_tokens, stop_ids=[])}
    same_output = None
    if hf is not None:

        def run_hf():
            with torch.inference_mode():
                out = hf.generate(prompt[None], max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  do_sample=False, pad_token_id=0)
            return out

        ours = runners["d3d"]().tokens[0]
        theirs = run_hf()[0, prompt_len:].tolist()
        same_output = ours == theirs
        if not same_output and model.dtype == torch.float32:
            raise SystemExit(f"{name}: d3d and transformers disagree on the greedy output — not timing")
        runners["transformers"] = run_hf
    times = interleaved(runners, repeats)
    res = {"model": name, "parameters": cfg.num_parameters(), "weight_bytes_per_token": weight_bytes_per_token(model),
           "dtype": str(model.dtype).removeprefix("torch."), "same_greedy_output_as_transformers": same_output}
    for k, ts in times.items():
        res[k] = {"tok_s_median": new_tokens / statistics.median(ts), "seconds": ts}
    res["d3d_gb_s"] = res["d3d"]["tok_s_median"] * res["weight_bytes_per_token"] / 1e9
    if "transformers" in res:
        res["speedup_vs_transformers"] = res["d3d"]["tok_s_median"] / res["transformers"]["tok_s_median"]
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["bundled", "qwen3-15m", "qwen3-100m"],
                    help="'bundled' (the bundled target's weights) or presets from d3d.model.config.PRESETS")
    ap.add_argument("--dtype", default="auto", help="dtype of both engines (default: d3d's dtype policy)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--no-transformers", action="store_true", help="time d3d only")
    ap.add_argument("--bandwidth-bytes", type=int, default=256 << 20, help="buffer size for the copy-bandwidth probe")
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--compare", default=None, help="a previous decode JSON to compare against")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bw = copy_bandwidth_gbs(args.bandwidth_bytes)
    print(f"measured copy bandwidth: {bw:.1f} GB/s; {machine()['cpu']}, {torch.get_num_threads()} threads")
    results = []
    for name in args.sizes:
        print(f"benchmarking {name} ...", flush=True)
        results.append(bench_size(name, args.new_tokens, args.repeats, args.prompt_len, not args.no_transformers,
                                  args.dtype))
    rows = []
    for r in results:
        hf = r.get("transformers", {}).get("tok_s_median")
        rows.append([r["model"], f"{r['parameters'] / 1e6:.1f}M", r["d3d"]["tok_s_median"],
                     hf if hf else "-", r.get("speedup_vs_transformers", "-"),
                     r["d3d_gb_s"], f"{100 * r['d3d_gb_s'] / bw:.0f}%"])
    print(markdown_table(["model", "params", "d3d tok/s", "transformers tok/s", "ratio", "d3d GB/s", "of copy BW"], rows))
    payload = {"bench": "decode", "machine": machine(), "copy_bandwidth_gb_s": bw, "config": vars(args),
               "results": results}
    if args.compare:
        print(compare_table(payload, load_json(args.compare)))
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
