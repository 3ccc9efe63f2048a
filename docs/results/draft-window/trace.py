"""One long-prompt request (a standard-library module's first 2,000 tokens, a summary asked), round by round under
sync: rows verified, verification and round milliseconds, tokens, whether the drafter ran, the cut R * b after
the round; ar's and sync's decoding seconds. ``before``: no window and commit c809e9c's row price. Run from the
repository root:

    python docs/results/draft-window/trace.py MODEL MODULE OUT.json [before]
"""
import sys

import torch

sys.path.insert(0, "docs/results/cut-batch1")
from before import row_price_before  # noqa: E402

import d3d  # noqa: E402
from bench.common import machine, write_json  # noqa: E402
from d3d.decode import speculative  # noqa: E402
from d3d.data.prompts import summary_request  # noqa: E402
from d3d.draft.pick import pick_drafter  # noqa: E402
from d3d.fetch import resolve_model  # noqa: E402

torch.set_grad_enabled(False)
name, module, out_path, before = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:] == ["before"]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
prompt = summary_request(tok, module)
if before:
    speculative.DRAFT_WINDOW = 1 << 30
Base, rounds = row_price_before("c809e9c").RowPrice if before else speculative.RowPrice, []


class Traced(Base):
    def observe(self, rows, verify_seconds, tokens, round_seconds, drafted=True):
        super().observe(rows, verify_seconds, tokens, round_seconds, drafted)
        rounds.append({"rows": rows, "verify_ms": round(verify_seconds * 1e3, 1), "tokens": tokens,
                       "round_ms": round(round_seconds * 1e3, 1), "drafted": drafted, "cut": round(self.min_prob(), 3)})


speculative.RowPrice, decode = Traced, {}
for engine in ("ar", "sync"):
    out = d3d.generate(target, prompt, max_new_tokens=128, spec=engine, drafter=drafter, stop_ids=tok.stop_token_ids())
    decode[engine] = {"seconds": round(out.stats.decode_seconds, 3), "tokens": out.stats.total_generated,
                      "drafter_seconds": round(out.stats.draft_seconds, 3)}
    if engine == "ar":
        ref = out.tokens
    elif out.tokens != ref:
        raise SystemExit("sync's output differs from ar's")
print(decode, rounds[:3])
write_json(out_path, {"bench": "one long prompt, traced", "machine": machine(), "model": name, "module": module,
                      "prompt_tokens": len(prompt), "row_price": "c809e9c, no window" if before else "now",
                      "decode": decode, "rounds": rounds})
