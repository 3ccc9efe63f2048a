"""Which kind each round of one sequence took under sync, with this checkout's row price and with another
revision's: K the drafter's catch-up round, D a counted drafting round, . a plain step, c a round of copies
only; the count of drafter rounds (K + D) and decoding tok/s. The rules take turns on each request. Run from
the repository root:

    python docs/results/gate-drift/kinds.py MODEL SET REV OUT.json [--reps N]

SET: ``long`` (draft-window's validation long prompts: argparse, textwrap, difflib, shlex) or ``mtbench`` (its 8
validation questions).
"""
import sys

import torch

sys.path.insert(0, "docs/results/cut-batch1")
from before import row_price_before  # noqa: E402

import d3d  # noqa: E402
from bench.common import machine, write_json  # noqa: E402
from d3d.data.prompts import mtbench_prompts, summary_request  # noqa: E402
from d3d.decode import speculative  # noqa: E402
from d3d.draft.pick import pick_drafter  # noqa: E402
from d3d.fetch import resolve_model  # noqa: E402

torch.set_grad_enabled(False)
name, which, rev, out_path = sys.argv[1:5]
reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 1
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)


if which == "long":
    prompts = [summary_request(tok, m) for m in ("argparse", "textwrap", "difflib", "shlex")]
elif which == "mtbench":
    prompts = [tok.encode_chat([{"role": "user", "content": mtbench_prompts()[i]}])
               for i in (6, 7, 8, 9, 61, 65, 71, 75)]
else:
    raise SystemExit(f"SET: {which!r} is not long or mtbench")


def traced(base):
    class Traced(base):
        kinds = []

        def observe(self, rows, verify_seconds, tokens, round_seconds, drafted=True):
            caught_up = drafted is True and self.stale and self.batch == 1
            Traced.kinds.append("K" if caught_up else {True: "D", False: ".", None: "c"}[drafted])
            super().observe(rows, verify_seconds, tokens, round_seconds, drafted)
    return Traced


rules = {"now": traced(speculative.RowPrice), rev: traced(row_price_before(rev).RowPrice)}
runs = []
for rep in range(reps):
    for i, p in enumerate(prompts):
        outs = {}
        for r in (list(rules) if (i + rep) % 2 == 0 else list(rules)[::-1]):
            speculative.RowPrice, rules[r].kinds = rules[r], []
            try:
                out = d3d.generate(target, p, max_new_tokens=128, spec="sync", drafter=drafter,
                                   stop_ids=tok.stop_token_ids())
            finally:
                speculative.RowPrice = rules["now"].__mro__[1]
            outs[r] = out.tokens[0]
            seq = "".join(rules[r].kinds)
            runs.append({"rep": rep, "request": i, "rule": r, "kinds": seq,
                         "drafter_rounds": seq.count("K") + seq.count("D"), "rounds": len(seq),
                         "tok_s": round(out.stats.total_generated / out.stats.decode_seconds, 2)})
            print(f"rep {rep + 1} request {i + 1} {r:>8}: {runs[-1]['drafter_rounds']:3d} drafter rounds "
                  f"of {len(seq):3d}, "
                  f"{runs[-1]['tok_s']:6.1f} tok/s  {seq}", flush=True)
        if len({tuple(o) for o in outs.values()}) != 1:
            raise SystemExit(f"request {i}: the outputs differ")
total = {r: sum(x["drafter_rounds"] for x in runs if x["rule"] == r) for r in rules}
print("drafter rounds in all:", total)
write_json(out_path, {"bench": "one sequence's round kinds under two row prices", "machine": machine(), "model": name,
                      "set": which, "against": rev, "reps": reps, "new_tokens": 128, "drafter_rounds": total,
                      "runs": runs})
