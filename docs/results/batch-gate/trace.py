"""One batch of 16 validation requests to explain code, round by round under sync: the batch's rows, the rows
verified, tokens committed, milliseconds, whether the drafter ran, and the cut R * b after the round; ar's tok/s
before and after. ``before``: the row price at commit ad9175a (read from git, as ``batches.py`` does). Run from
the repository root:

    python docs/results/batch-gate/trace.py MODEL OUT.json [before]
"""
import sys
import time

import torch

sys.path.insert(0, "docs/results/cut-batch1")
from before import row_price_before  # noqa: E402  (read from git)

import d3d  # noqa: E402
from bench.common import machine, write_json  # noqa: E402
from d3d.data.corpus import training_corpus  # noqa: E402
from d3d.decode import speculative  # noqa: E402
from d3d.draft.pick import pick_drafter  # noqa: E402
from d3d.fetch import resolve_model  # noqa: E402
from d3d.train.chat_data import chat_prompts  # noqa: E402

torch.set_grad_enabled(False)
name, out_path, before = sys.argv[1], sys.argv[2], sys.argv[3:] == ["before"]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
prompts = chat_prompts(tok, training_corpus(path), 0.05, 16, "validation", seed=1234, templates=1, explain=True)
Base = row_price_before("ad9175a").RowPrice if before else speculative.RowPrice
rounds = []


class Traced(Base):
    def observe(self, rows, verify_seconds, tokens, round_seconds, drafted=True):
        super().observe(rows, verify_seconds, tokens, round_seconds, drafted)
        rounds.append({"batch": self.batch, "rows": rows, "tokens": tokens, "ms": round(round_seconds * 1e3, 1),
                       "drafted": drafted, "cut": round(self.min_prob(), 3)})


speculative.RowPrice, tok_s = Traced, {}
for engine in ("ar", "sync", "ar again"):
    t = time.perf_counter()
    out = d3d.generate(target, prompts, max_new_tokens=128, spec=engine.split()[0], drafter=drafter,
                       stop_ids=tok.stop_token_ids())
    tok_s[engine] = round(out.stats.total_generated / (time.perf_counter() - t), 1)
    if engine == "ar":
        ref = out.tokens
    elif out.tokens != ref:
        raise SystemExit(f"{engine}: an output differs from ar's")
    print(engine, tok_s[engine], "tok/s", file=sys.stderr, flush=True)
kinds = {k: [r for r in rounds if r["drafted"] is v] for k, v in (("drafting", True), ("steps", False), ("copies", None))}
summary = {k: {"rounds": len(v), "tokens": sum(r["tokens"] for r in v), "ms": round(sum(r["ms"] for r in v))}
           for k, v in kinds.items()}
print(tok_s, summary)
write_json(out_path, {"bench": "one batch of 16, traced", "machine": machine(), "model": name,
                      "row_price": "ad9175a" if before else "now", "tok_s": tok_s, "by_kind": summary,
                      "rounds": rounds})
