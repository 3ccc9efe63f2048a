"""Greedy agreement of speculative decoding with autoregressive decoding in low precision.

In fp32 the tests demand token equality. In bf16 a 16-token verification pass and 16 one-token
steps can round differently (attention over 16 query rows vs one), so at a near-tie of the
target's own logits the two may pick different tokens and continue differently from there. This
bench measures how often that happens and shows that each first divergence is such a near-tie:
for every prompt whose sync/async output differs from AR, it reports the first differing
position and the target's logit margin there (AR token minus speculative token, in the same
dtype, from one pass over the common prefix) next to the fp32 model's margin.

    python -m bench agreement [--sets code humaneval] [--n 30] [--new-tokens 96] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import d3d
from d3d.assets import BUNDLED_DRAFTER, bundled
from d3d.cpu.precision import auto_dtype
from d3d.data.corpus import training_corpus
from d3d.data.prompts import PROMPT_SETS, load_prompt_set

from .common import target_dir as bench_target, bench_spec, check_chat_sets, machine, markdown_table, write_json


@torch.inference_mode()
def margin(model, prefix: list[int], a: int, b: int) -> dict:
    """Logit of token a minus token b after ``prefix``, and a's gap to the runner-up."""
    logits = model(torch.tensor([prefix]))[0, -1].float()
    top2 = logits.topk(2).values
    return {"a_minus_b": float(logits[a] - logits[b]), "top2_gap": float(top2[0] - top2[1]),
            "a_is_argmax": bool(int(logits.argmax()) == a)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench agreement", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="target directory or a real model's name, fetched once (default: bundled)")
    ap.add_argument("--drafter", help="drafter directory (default: bundled)")
    ap.add_argument("--dtype", default="auto", help="dtype under test (default: the policy's choice)")
    ap.add_argument("--sets", nargs="+", default=["code", "humaneval"], choices=PROMPT_SETS)
    ap.add_argument("--n", type=int, default=30, help="prompts per set (default 30)")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--modes", nargs="+", default=["sync", "async", "sync,exact=true"],
                    help="speculative modes in d3d.SpecConfig's compact form, commas for spaces: exact=true verifies "
                         "with row-invariant attention (must always agree); leaves=L, lookup=N (d3d/decode/config.py)")
    ap.add_argument("--chat", action="store_true",
                    help="ask the prompts as user turns in the target's chat format (humaneval, mtbench) and stop at "
                         "its end-of-turn token, as an instruction-tuned model is used")
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    if args.chat:
        check_chat_sets(ap, args.sets)
    target_dir = bench_target(args.target, "agreement")
    drafter_dir = Path(args.drafter) if args.drafter else bundled(BUNDLED_DRAFTER)
    target = d3d.load_model(target_dir, dtype=args.dtype)
    reference = d3d.load_model(target_dir, dtype="float32")
    drafter = d3d.load_drafter(drafter_dir, target=target)
    tok = d3d.load_tokenizer(target_dir)
    dtype = str(target.dtype).removeprefix("torch.")
    print(f"{dtype} (policy: {auto_dtype('cpu').dtype}); sets {args.sets}, {args.n} prompts each", file=sys.stderr)

    stops = tok.stop_token_ids() if args.chat else []
    rows, divergences = [], []
    for name in args.sets:
        for i, prompt in enumerate(load_prompt_set(name, tok, args.n, args.prompt_len, chat=args.chat,
                                                   corpus=training_corpus(target_dir))):
            ar = d3d.generate(target, prompt, max_new_tokens=args.new_tokens, stop_ids=stops).tokens[0]
            for mode in args.modes:
                spec = d3d.generate(target, prompt, max_new_tokens=args.new_tokens, stop_ids=stops,
                                    drafter=drafter, spec=bench_spec(mode)).tokens[0]
                same = spec == ar
                rows.append({"set": name, "prompt": i, "mode": mode, "identical": same})
                if not same:
                    k = next((j for j, (x, y) in enumerate(zip(ar, spec)) if x != y), None)
                    if k is None:  # one output is a prefix of the other: a stop token at a length cap
                        raise SystemExit(f"{name} prompt {i}: {mode} and ar differ only in length "
                                         f"({len(spec)} vs {len(ar)} tokens) — not a near-tie; a bug")
                    prefix = prompt + ar[:k]
                    divergences.append({"set": name, "prompt": i, "mode": mode, "position": k,
                                        "ar_token": ar[k], "spec_token": spec[k],
                                        "margin": margin(target, prefix, ar[k], spec[k]),
                                        "margin_fp32": margin(reference, prefix, ar[k], spec[k])})
            print(f"  {name} {i + 1}/{args.n}", file=sys.stderr, flush=True)

    summary = {}
    for mode in args.modes:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {"prompts": len(mine), "identical": sum(r["identical"] for r in mine)}
        summary[mode]["agreement"] = summary[mode]["identical"] / max(1, len(mine))
    print(markdown_table(["mode", "prompts", "identical to AR", "agreement"],
                         [[m, s["prompts"], s["identical"], f"{s['agreement']:.0%}"] for m, s in summary.items()]))
    if divergences:
        print(markdown_table(["set", "prompt", "mode", "first diff at", f"margin ({dtype})", "top-2 gap", "margin (fp32)"],
                             [[d["set"], d["prompt"], d["mode"], d["position"], f"{d['margin']['a_minus_b']:.4f}",
                               f"{d['margin']['top2_gap']:.4f}", f"{d['margin_fp32']['a_minus_b']:.4f}"]
                              for d in divergences]))
        worst = max(abs(d["margin"]["a_minus_b"]) for d in divergences)
        print(f"largest |margin| at a first divergence: {worst:.4f} logits")
    payload = {"bench": "agreement", "machine": machine(), "config": vars(args), "dtype": dtype,
               "summary": summary, "divergences": divergences, "results": rows}
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
