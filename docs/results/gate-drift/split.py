"""Where sync's decoding time goes for one sequence, by round kind: the drafter's catch-up round (K), counted
drafting rounds (D), plain steps (.), rounds of copies only (c): rounds, tokens, ms a round, ms a token; beside
ar's ms a token on the same request (ar and sync take turns, REPS each; the faster run of each is shown). Run from
the repository root:

    python docs/results/gate-drift/split.py MODEL SET [REPS] > OUT.txt

SET: ``mtbench`` (its 8 validation questions), ``code`` (8 validation code requests, as cut-batch1/validate.py) or
``long`` (draft-window's validation long prompts).
"""
import sys

import torch

import d3d
from d3d.data.corpus import training_corpus
from d3d.data.prompts import mtbench_prompts, summary_request
from d3d.decode import speculative
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.hardware import cpu_flags
from d3d.train.chat_data import chat_prompts

torch.set_grad_enabled(False)
name, which = sys.argv[1], sys.argv[2]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
if which == "mtbench":
    prompts = [tok.encode_chat([{"role": "user", "content": mtbench_prompts()[i]}])
               for i in (6, 7, 8, 9, 61, 65, 71, 75)]
elif which == "code":
    prompts = chat_prompts(tok, training_corpus(path), 0.05, 8, "validation", seed=1234, templates=1, explain=False)
elif which == "long":
    prompts = [summary_request(tok, m) for m in ("argparse", "textwrap", "difflib", "shlex")]
else:
    raise SystemExit(f"SET: {which!r} is not mtbench, code or long")
rounds = []


class Traced(speculative.RowPrice):
    def observe(self, rows, verify_seconds, tokens, round_seconds, drafted=True):
        caught_up = drafted is True and self.stale and self.batch == 1
        kind = "K" if caught_up else {True: "D", False: ".", None: "c"}[drafted]
        rounds.append((kind, rows, tokens, round_seconds))
        super().observe(rows, verify_seconds, tokens, round_seconds, drafted)


speculative.RowPrice = Traced
print(f"{name}, {which}; cpu flags", " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))))
for i, p in enumerate(prompts):
    runs = {"ar": [], "sync": []}
    for rep in range(reps):
        # the order alternates, so that neither engine always runs second (plain_steps.py measures both orders)
        for eng in ("ar", "sync") if rep % 2 == 0 else ("sync", "ar"):
            rounds.clear()
            out = d3d.generate(target, p, max_new_tokens=128, spec=eng, drafter=drafter, stop_ids=tok.stop_token_ids())
            runs[eng].append((out.stats.decode_seconds / out.stats.total_generated, list(rounds)))
    ar = min(t for t, _ in runs["ar"])
    sec, best = min(runs["sync"], key=lambda r: r[0])
    print(f"request {i + 1}: ar {1e3 * ar:.2f} ms a token, sync {1e3 * sec:.2f} ({ar / sec:.3f}x ar)")
    print("   ", "".join(k for k, *_ in best))
    for kind in "KD.c":
        rs = [r for r in best if r[0] == kind]
        if rs:
            n, rows, toks, secs = len(rs), sum(r[1] for r in rs), sum(r[2] for r in rs), sum(r[3] for r in rs)
            print(f"    {kind}: {n:3d} rounds, {toks:3d} tokens, {rows / n:5.2f} rows, "
                  f"{1e3 * secs / n:6.2f} ms a round, "
                  f"{1e3 * secs / toks:6.2f} ms a token")
    sys.stdout.flush()
