"""Answer generation throughput (the drafter's training data): fixed batches vs continuous batching.

The same chat requests (``d3d.train.chat_data.chat_requests``: training functions, code and explain
kinds in turn) answered greedily up to ``--gen-len`` tokens, stopping at end of turn, by
  batch:N       ``d3d.generate`` on N requests at a time (finished rows drop out, the batch runs
                until its longest answer ends: what the answer store used up to 2026-12-02);
  continuous:N  ``d3d.decode.continuous.generate_continuous`` with N sequences in flight (a finished row
                is refilled with the next request in the same pass; the requests' common prefix,
                the chat template's system turn, computed once);
  whole:N       the same, each row computing its whole prompt (no shared prefix).
Modes run in turn, ``--repeats`` times (``interleaved``); answer tok/s counts the generated tokens
over the whole call (prefills included). ``same_answers``: requests whose answer equals the first
mode's (bf16 rows can differ in the last bits with the batch around them).

    python -m bench answers --target runs/qwen2.5-coder-0.5b-instruct [--n 256] [--modes batch:64 continuous:64]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import d3d
from d3d.decode.continuous import generate_continuous
from d3d.train.chat_data import chat_requests

from .common import interleaved, machine, markdown_table, write_json


def parse_mode(text: str) -> tuple[str, int]:
    kind, _, n = text.partition(":")
    if kind not in ("batch", "continuous", "whole") or not n.isdigit() or int(n) <= 0:
        raise argparse.ArgumentTypeError(f"mode {text!r}: expected batch:N, continuous:N or whole:N with N > 0")
    return kind, int(n)


def answer(model, prompts: list[list[int]], gen_len: int, stops: list[int], kind: str, n: int) -> list[list[int]]:
    if kind in ("continuous", "whole"):
        return generate_continuous(model, prompts, gen_len, stop_ids=stops, slots=n, share_prefix=kind == "continuous")
    return [a for i in range(0, len(prompts), n)
            for a in d3d.generate(model, prompts[i: i + n], max_new_tokens=gen_len, stop_ids=stops).tokens]


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench answers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="target model directory (config, weights, tokenizer)")
    ap.add_argument("--n", type=int, default=256, help="requests answered per run (default 256)")
    ap.add_argument("--gen-len", type=int, default=160, help="answer cap in tokens (default 160, the store's)")
    ap.add_argument("--modes", nargs="+", type=parse_mode, default=[("batch", 64), ("continuous", 64)],
                    help="batch:N, continuous:N, whole:N (default: batch:64 continuous:64)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--dtype", default=None, help="target dtype (default: d3d's policy for this CPU)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.n <= 0 or args.gen_len <= 0:
        ap.error(f"--n {args.n} / --gen-len {args.gen_len}: both must be positive")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = d3d.load_model(args.target, dtype=args.dtype), d3d.load_tokenizer(args.target)
    prompts = [p for _, p in chat_requests(tok, None, 0.05, args.n, kinds=("code", "explain"))]
    stops = sorted(tok.stop_token_ids())
    answer(model, prompts[:4], 8, stops, "batch", 4)  # warm-up: first-call allocations
    outputs = {}

    def runner(kind: str, n: int):
        return lambda: outputs.__setitem__(f"{kind}:{n}", answer(model, prompts, args.gen_len, stops, kind, n))

    times = interleaved({f"{k}:{n}": runner(k, n) for k, n in args.modes}, args.repeats, warmup=0)
    first = next(iter(outputs.values()))
    results = []
    for name, secs in times.items():
        tokens = sum(map(len, outputs[name]))
        results.append({"mode": name, "seconds": statistics.median(secs), "answer_tokens": tokens,
                        "tok_s": tokens / statistics.median(secs),
                        "same_answers": sum(a == b for a, b in zip(outputs[name], first))})
    base = results[0]["tok_s"]
    print(markdown_table(["mode", "s (median)", "answer tokens", "answer tok/s", f"vs {results[0]['mode']}",
                          "same answers"],
                         [[r["mode"], f"{r['seconds']:.1f}", r["answer_tokens"], f"{r['tok_s']:.0f}",
                           f"{r['tok_s'] / base:.2f}x", f"{r['same_answers']}/{args.n}"] for r in results]))
    payload = {"bench": "answers", "machine": machine(), "config": vars(args) | {"modes": [f"{k}:{n}" for k, n in args.modes]},
               "target": args.target, "dtype": str(model.dtype).removeprefix("torch."), "results": results}
    write_json(args.out, payload)
    return payload
