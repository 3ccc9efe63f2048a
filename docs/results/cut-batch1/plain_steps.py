"""What a plain step of the speculative decoder costs against ar's: sync with the gate forced to plain steps and no
copies (``sync,lookup=0``) against ar, on validation requests to explain code, 128 tokens, greedy, the runs of a
request taking turns; medians. Every output must equal ar's.

    python docs/results/cut-batch1/plain_steps.py MODEL N OUT.json
"""
import statistics
import sys
import time

import torch

import d3d
from bench.common import machine, write_json
from d3d.data.corpus import training_corpus
from d3d.decode import row_price
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.train.chat_data import chat_prompts

torch.set_grad_enabled(False)
name, n, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
prompts = chat_prompts(tok, training_corpus(path), 0.05, n, "validation", seed=1234, templates=1, explain=True)
gate, tok_s = row_price.RowPrice.draft, {"ar": [], "plain steps": []}
for i, p in enumerate(prompts):
    outs = {}
    for mode in (["ar", "plain steps"] if i % 2 == 0 else ["plain steps", "ar"]):
        if mode == "plain steps":
            row_price.RowPrice.draft = lambda self, rows: False
        try:
            t = time.perf_counter()
            out = d3d.generate(target, p, max_new_tokens=128, spec="ar" if mode == "ar" else "sync,lookup=0",
                               drafter=drafter, stop_ids=tok.stop_token_ids())
            tok_s[mode].append(len(out.tokens[0]) / (time.perf_counter() - t))
            outs[mode] = out.tokens[0]
        finally:
            row_price.RowPrice.draft = gate
    if outs["ar"] != outs["plain steps"]:
        raise SystemExit(f"request {i}: plain steps differ from ar")
    print(f"{i + 1}/{len(prompts)}", file=sys.stderr, flush=True)
summary = {m: round(statistics.median(v), 2) for m, v in tok_s.items()}
summary["plain steps / ar"] = round(summary["plain steps"] / summary["ar"], 3)
print(summary)
write_json(out_path, {"bench": "plain steps against ar", "machine": machine(), "model": name, "n": n,
                      "new_tokens": 128, "median_tok_s": summary, "tok_s": tok_s})
