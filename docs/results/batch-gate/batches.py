"""Batches: the row price now (a batch asks no drafter while R * b >= ``BATCH_DRAFT_LIMIT``; the prior scaled to
the batch; no ceiling) against the gate before (``d3d/decode/row_price.py`` at commit ad9175a, read from git),
plain steps with copies (the drafter never asked) and ar; batches of 4 and 16 validation chat requests (16 code,
16 explain), 128 tokens, greedy, the real model's GGUF blocks. Every batch runs each engine in turn, the order
rotated from batch to batch and repetition to repetition (in a fixed order the same engine measured up to ~15%
apart by its place: per_sequence_0.5b.json), ``REPS`` times; a cell is the median over batches and repetitions of tok/s over ar's
on the same batch. Every output must equal ar's. Run from the repository root:

    python docs/results/batch-gate/batches.py MODEL REPS OUT.json [ENGINES=ar,now,...] [SIZES=4,16] [LIMIT=0.15]
"""
import statistics
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


BEFORE = "ad9175a"


class StepsAndCopies(speculative.RowPrice):
    """The drafter never asked: copied drafts where the context has them, else plain steps."""

    def draft(self, rows):
        self.batch = rows
        return False


class Limit(speculative.RowPrice):
    """Another ``batch_limit`` (``LIMIT=x`` on the command line)."""

    def __init__(self, **kw):
        super().__init__(batch_limit=LIMIT, **kw)


ENGINES = {"ar": None, "now": speculative.RowPrice, "gate before": row_price_before(BEFORE).RowPrice,
           "steps + copies": StepsAndCopies}

torch.set_grad_enabled(False)
name, reps, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
opts = dict(a.split("=", 1) for a in sys.argv[4:])  # ENGINES=a,b,... SIZES=4,16 LIMIT=x
LIMIT = float(opts.get("LIMIT", 0.15))
ENGINES[f"limit {LIMIT}"] = Limit
ENGINES = {e: ENGINES[e] for e in opts.get("ENGINES", "ar,now,gate before,steps + copies").split(",")}
SIZES = [int(n) for n in opts.get("SIZES", "4,16").split(",")]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
corpus = training_corpus(path)
sets = {s: chat_prompts(tok, corpus, 0.05, 16, "validation", seed=1234, templates=1, explain=s == "explain")
        for s in ("code", "explain")}
now = speculative.RowPrice


def run(engine, prompts):
    speculative.RowPrice = ENGINES[engine] or now
    try:
        t0 = time.perf_counter()
        o = d3d.generate(target, prompts, max_new_tokens=128, spec="ar" if engine == "ar" else "sync",
                         drafter=drafter, stop_ids=tok.stop_token_ids())
        return o.stats.total_generated / (time.perf_counter() - t0), o.tokens
    finally:
        speculative.RowPrice = now


ratios = {}
for rep in range(reps):
    for s, prompts in sets.items():
        for n in SIZES:
            for j, i in enumerate(range(0, len(prompts), n)):
                shift = (rep + j) % len(ENGINES)
                order = list(ENGINES)[shift:] + list(ENGINES)[:shift]
                got = {e: run(e, prompts[i:i + n]) for e in order}
                for e in order:
                    if got[e][1] != got["ar"][1]:
                        raise SystemExit(f"{s}, batch {n}, {e}: an output differs from ar's")
                    ratios.setdefault(f"{s}, batch {n}", {}).setdefault(e, []).append(round(got[e][0] / got["ar"][0], 4))
            cell = ratios[f"{s}, batch {n}"]
            print(f"rep {rep + 1}/{reps} {s}, batch {n}:", {e: round(statistics.median(v), 3) for e, v in cell.items()},
                  file=sys.stderr, flush=True)
summary = {c: {e: round(statistics.median(v), 3) for e, v in d.items()} for c, d in ratios.items()}
print(summary)
write_json(out_path, {"bench": "per-sequence drafting gate in batches", "machine": machine(), "model": name,
                      "new_tokens": 128, "reps": reps, "before": BEFORE, "sizes": SIZES, "engines": list(ENGINES), "median_vs_ar": summary, "ratios": ratios})
