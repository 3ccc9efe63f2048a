"""The greedy head (``d3d.cpu.greedy_head``) against the full LM head, end to end: greedy ``ar`` and ``sync`` (the
defaults) on chat requests, 128 new tokens, each request decoded four ways in turns (the order reversed every other
request), the head built once before; decoded tokens per second (prefill excluded), every output checked equal to
the full head's ar. Run from the repository root:

    python docs/results/greedy-head/ab.py MODEL SETS OUT.json

SETS: ``validation`` (MT-Bench's 8 validation questions, 8 validation code requests: what the choice was made on) or
``evaluation`` (8 HumanEval chat requests, 4 MT-Bench evaluation questions, 8 requests about held-out library functions).
"""
import statistics
import sys

import torch

import d3d
from bench.common import machine, write_json
from d3d.data.corpus import training_corpus
from d3d.data.prompts import load_prompt_set, mtbench_prompts
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.train.chat_data import chat_prompts

MTBENCH_VALIDATION = [6, 7, 8, 9, 61, 65, 71, 75]
torch.set_grad_enabled(False)
name, which, out_path = sys.argv[1:4]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
corpus = training_corpus(path)
if which == "validation":
    sets = {"mtbench": [tok.encode_chat([{"role": "user", "content": mtbench_prompts()[i]}]) for i in MTBENCH_VALIDATION],
            "code": chat_prompts(tok, corpus, 0.05, 8, "validation", seed=1234, templates=1)}
elif which == "evaluation":
    sets = {"humaneval": load_prompt_set("humaneval", tok, 8, chat=True),
            "mtbench": load_prompt_set("mtbench", tok, 4, chat=True),
            "library": chat_prompts(tok, corpus, 0.05, 8, "evaluation", seed=1234, templates=1)}
else:
    raise SystemExit(f"SETS: {which!r}: expected validation or evaluation")
if target.greedy_head() is None:
    raise SystemExit(f"{name}: its LM head is not one the greedy head takes (int8, groups of 32, int8 activations)")
runs = [(mode, on) for mode in ("ar", "sync") for on in (False, True)]
tok_s = {s: {f"{m}/{'greedy' if on else 'full'}": [] for m, on in runs} for s in sets}
for s, prompts in sets.items():
    for i, p in enumerate(prompts):
        outs = []
        for mode, on in (runs if i % 2 == 0 else runs[::-1]):
            target.greedy_heads = on
            o = d3d.generate(target, p, max_new_tokens=128, spec=mode, drafter=drafter, stop_ids=tok.stop_token_ids())
            outs.append(o.tokens[0])
            tok_s[s][f"{mode}/{'greedy' if on else 'full'}"].append(o.stats.total_generated / o.stats.decode_seconds)
        if any(o != outs[0] for o in outs):
            raise SystemExit(f"{s} request {i}: an output differs")
        print(s, i + 1, {k: round(v[-1], 1) for k, v in tok_s[s].items()}, file=sys.stderr, flush=True)
summary = {}
for s in sets:
    summary[s] = {}
    for mode in ("ar", "sync"):
        r = [a / b for a, b in zip(tok_s[s][f"{mode}/greedy"], tok_s[s][f"{mode}/full"])]
        summary[s][mode] = {"median_ratio": statistics.median(r), "min_ratio": min(r), "max_ratio": max(r),
                            "full_tok_s": statistics.median(tok_s[s][f"{mode}/full"]),
                            "greedy_tok_s": statistics.median(tok_s[s][f"{mode}/greedy"])}
        print(f"{s:10s} {mode:5s} full {summary[s][mode]['full_tok_s']:6.1f} tok/s, greedy head "
              f"{summary[s][mode]['greedy_tok_s']:6.1f}: {summary[s][mode]['median_ratio']:.3f}x "
              f"({min(r):.3f}-{max(r):.3f})")
write_json(out_path, {"bench": "greedy head against the full LM head, end to end", "machine": machine(),
                      "model": name, "sets": {s: len(p) for s, p in sets.items()}, "new_tokens": 128,
                      "outputs_equal": True, "summary": summary, "tok_s": tok_s})
