"""The gate before this change, round by round, on one validation request to explain code: each round's verified
rows, verification and round milliseconds, tokens, whether it drafted, and the gate's rates of drafting rounds and
plain steps after it (tok/s). Run from the repository root:

    python docs/results/cut-batch1/trace.py MODEL OUT.json
"""
import sys

import torch

sys.path.insert(0, "docs/results/cut-batch1")
from before import row_price_before  # noqa: E402

import d3d  # noqa: E402
from bench.common import machine, write_json  # noqa: E402
from d3d.data.corpus import training_corpus  # noqa: E402
from d3d.decode import speculative  # noqa: E402
from d3d.draft.pick import pick_drafter  # noqa: E402
from d3d.fetch import resolve_model  # noqa: E402
from d3d.train.chat_data import chat_prompts  # noqa: E402

torch.set_grad_enabled(False)
name, out_path = sys.argv[1], sys.argv[2]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
prompt = chat_prompts(tok, training_corpus(path), 0.05, 1, "validation", seed=1234, templates=1, explain=True)[0]
Before, rounds = row_price_before().RowPrice, []


class Traced(Before):
    def observe(self, rows, verify_seconds, tokens, round_seconds, drafted=True):
        super().observe(rows, verify_seconds, tokens, round_seconds, drafted)
        rate = {k: None if t is None else round(t / s, 1) for k, (t, s) in self.by_kind.items()}
        rounds.append({"rows": rows, "verify_ms": round(verify_seconds * 1e3, 1), "tokens": tokens,
                       "round_ms": round(round_seconds * 1e3, 1), "drafted": drafted,
                       "drafting_tok_s": rate[True], "steps_tok_s": rate[False]})


speculative.RowPrice = Traced
d3d.generate(target, prompt, max_new_tokens=96, spec="sync,lookup=0", drafter=drafter, stop_ids=tok.stop_token_ids())
print(rounds[:3], f"... {sum(r['drafted'] is True for r in rounds)} of {len(rounds)} rounds drafted")
write_json(out_path, {"bench": "gate before, traced", "machine": machine(), "model": name, "rounds": rounds})
