"""d3d vs transformers on a real checkpoint directory: logits and greedy chat, side by side.

The oracle is transformers' ``AutoModelForCausalLM`` (``Qwen2ForCausalLM`` for the converted
Qwen2.5-Coder) loaded from the *same* directory in fp32. For each chat prompt we compare the
logits of the whole prompt (max absolute difference, and whether the argmax agrees everywhere)
and the greedy continuations token for token.

    python -m bench parity --model runs/qwen2.5-coder --out docs/results/parity_qwen25_coder.json
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import d3d

from .common import machine, markdown_table, write_json

PROMPTS = (
    "Write a Python function that reverses a string.",
    "Explain what a Python generator is, with a short example.",
    "Fix the bug: def mean(xs): return sum(xs) / len(xs) - 1",
)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench parity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory (e.g. from bench/get_qwen25_coder.sh)")
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
    ours = d3d.load_model(args.model, dtype="float32")
    tok = d3d.load_tokenizer(args.model)
    ref = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    rows, results = [], []
    for text in PROMPTS:
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
    payload = {"bench": "parity", "machine": machine(), "config": vars(args), "model": str(args.model),
               "parameters": ours.cfg.num_parameters(), "results": results}
    write_json(args.out, payload)
    if not all(r["greedy_identical"] and r["argmax_agree"] for r in results):
        raise SystemExit("parity: d3d and transformers disagree (see the table)")
    return payload
