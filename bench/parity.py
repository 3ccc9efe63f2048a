"""d3d vs transformers on a real checkpoint directory: logits and greedy chat, side by side.

The oracle is transformers' ``AutoModelForCausalLM`` (``Qwen2ForCausalLM`` for the converted
Qwen2.5-Coder) in fp32, loaded from the *same* directory, or with ``--gguf`` from the GGUF that
directory was converted from (transformers then dequantizes the blocks itself: an independent
check of ``convert-gguf`` too); d3d runs with ``--weights fp32`` (the blocks dequantized) by
default. For each chat prompt we compare the logits of the whole prompt (max absolute difference,
and whether the argmax agrees everywhere) and the greedy continuations token for token.

    python -m bench parity --model qwen2.5-coder-1.5b --gguf ~/.cache/d3d/qwen2.5-coder-1.5b.gguf \
        --out docs/results/parity_qwen25_coder_1.5b.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import d3d

from .common import machine, markdown_table, write_json

PROMPTS = (
    "Write a Python function that reverses a string.",
    "Explain what a Python generator is, with a short example.",
    "Fix the bug: def mean(xs): return sum(xs) / len(xs) - 1",
    "Write a SQL query that returns the ten most recent orders of each customer.",
)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench parity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True,
                    help="checkpoint directory, or a real model's name (python -m d3d fetch NAME)")
    ap.add_argument("--gguf", default=None,
                    help="load the oracle from this GGUF (the one --model was converted from) instead of --model")
    ap.add_argument("--weights", default="fp32", help="d3d's --weights (default fp32: the blocks dequantized)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many of the {len(PROMPTS)} prompts")
    ap.add_argument("--new-tokens", type=int, default=48, help="greedy tokens per prompt")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise SystemExit("bench parity needs transformers as the oracle: pip install transformers") from None
    from d3d.fetch import resolve_model

    model = resolve_model(args.model, log=lambda m: print(f"parity: {m}", file=sys.stderr, flush=True))
    ours = d3d.load_model(model, dtype="float32", weights=args.weights)
    tok = d3d.load_tokenizer(model)
    if args.gguf:
        gguf = Path(args.gguf).expanduser()
        ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    else:
        ref = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    rows, results = [], []
    for text in PROMPTS[:args.prompts]:
        ids = tok.encode_chat([{"role": "user", "content": text}])
        x = torch.tensor([ids])
        with torch.no_grad():
            a, b = ours(x)[0], ref(x).logits[0]
        t = time.perf_counter()
        g1 = d3d.generate(ours, ids, max_new_tokens=args.new_tokens, stop_ids=tok.stop_token_ids()).tokens[0]
        t1 = time.perf_counter() - t
        with torch.no_grad():
            out = ref.generate(x, max_new_tokens=len(g1), do_sample=False, eos_token_id=None, pad_token_id=0)
        g2 = out[0, len(ids):].tolist()
        r = {"prompt": text, "prompt_tokens": len(ids), "max_abs_logit_diff": float((a - b).abs().max()),
             "logit_scale": float(b.abs().max()), "argmax_agree": bool((a.argmax(-1) == b.argmax(-1)).all()),
             "greedy_tokens": len(g1), "greedy_identical": g1 == g2, "d3d_tok_s": len(g1) / t1,
             "d3d_text": tok.decode(g1)}
        results.append(r)
        rows.append([text[:40], len(ids), f"{r['max_abs_logit_diff']:.2e}", r["argmax_agree"], len(g1),
                     r["greedy_identical"]])
        print(f"  {text[:40]!r}: max |Δlogit| {r['max_abs_logit_diff']:.2e}, greedy identical {r['greedy_identical']}",
              file=sys.stderr, flush=True)
    print(markdown_table(["prompt", "tokens", "max abs logit diff", "argmax agrees", "greedy tokens",
                          "greedy identical"], rows))
    payload = {"bench": "parity", "machine": machine(), "config": vars(args), "model": str(model), "weights": ours.weights,
               "parameters": ours.cfg.num_parameters(), "results": results}
    write_json(args.out, payload)
    if not all(r["greedy_identical"] and r["argmax_agree"] for r in results):
        raise SystemExit("parity: d3d and transformers disagree (see the table)")
    return payload
