"""Hindsight probes and copies calibrated per sequence, for one sequence: sync with and without them, over ar
(needs ``hindsight.patch`` applied). Decoded tokens per second (prefill excluded) over ar's, medians of per-request
ratios, τ, and per sync run the probes of drafting that a forecast skipped; every output must equal ar's. The runs
of a request take turns, the order reversed every other request. Run from the repository root:

    python docs/results/hindsight/validate.py MODEL SETS OUT.json [--runs RUN ...] [--reps N]

SETS, comma-separated. Validation, what the choice was made on: ``code``, ``explain`` (8 validation requests each,
as cut-batch1/validate.py), ``mtbench`` (its 8 validation questions), ``mtbench-wide`` (questions 20-35, where the
copies' losses were seen), ``long`` (draft-window's 4 validation long prompts). Evaluation, reported only:
``humaneval`` (8 chat requests), ``mtbench-eval`` (8 questions outside validation's), ``library`` (8 requests about
held-out library functions). RUN: ``ar``; ``on`` (the defaults); ``off`` (no hindsight: every probe of drafting
runs); ``static-copies`` (every copy's first token estimated at the offline 59%); ``before`` (both); ``blocks=N``
(hindsight passes of N blocks).
"""
import sys

import torch

import d3d
from bench.common import machine, print_runs_over_ar, runs_over_ar, write_json
from d3d.data.corpus import training_corpus
from d3d.data.prompts import load_prompt_set, mtbench_prompts, summary_request
from d3d.decode import lookup, speculative
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.train.chat_data import chat_prompts

MTBENCH_VALIDATION = [6, 7, 8, 9, 61, 65, 71, 75]
MTBENCH_EVALUATION = [0, 1, 2, 3, 4, 5, 10, 11]  # bench llamacpp's first 4 among them
torch.set_grad_enabled(False)
name, wanted, out_path = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
args = sys.argv[4:]
reps = int(args[args.index("--reps") + 1]) if "--reps" in args else 1
runs = args[args.index("--runs") + 1:] if "--runs" in args else ["ar", "off", "on"]
runs = [r for r in runs if r != "--reps" and not r.isdigit()]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
sets = {}
for s in wanted:
    if s in ("code", "explain"):
        sets[s] = chat_prompts(tok, training_corpus(path), 0.05, 8, "validation", seed=1234, templates=1,
                               explain=s == "explain")
    elif s in ("mtbench", "mtbench-wide"):
        sets[s] = [tok.encode_chat([{"role": "user", "content": mtbench_prompts()[i]}])
                   for i in (MTBENCH_VALIDATION if s == "mtbench" else range(20, 36))]
    elif s == "long":
        sets[s] = [summary_request(tok, m) for m in ("argparse", "textwrap", "difflib", "shlex")]
    elif s == "humaneval":
        sets[s] = load_prompt_set(s, tok, 8, chat=True)
    elif s == "mtbench-eval":
        sets[s] = [tok.encode_chat([{"role": "user", "content": mtbench_prompts()[i]}]) for i in MTBENCH_EVALUATION]
    elif s == "library":
        sets[s] = chat_prompts(tok, training_corpus(path), 0.05, 8, "evaluation", seed=1234, templates=1)
    else:
        raise SystemExit(f"SETS: unknown set {s!r} (code, explain, mtbench, long, humaneval, mtbench-eval, library)")
blocks_now, price_now, prior_now = speculative.HINDSIGHT_BLOCKS, speculative.RowPrice, lookup.FIRST_PRIOR
prices = []


class Kept(price_now):  # each run's row price, to read its skipped probes
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        prices.append(self)


def run(engine: str, prompt):
    speculative.HINDSIGHT_BLOCKS = 0 if engine in ("off", "before") else int(engine[7:]) \
        if engine.startswith("blocks=") else blocks_now
    lookup.FIRST_PRIOR = 1e12 if engine in ("static-copies", "before") else prior_now
    speculative.RowPrice = Kept
    prices.clear()
    try:
        out = d3d.generate(target, prompt, max_new_tokens=128, spec="ar" if engine == "ar" else "sync", drafter=drafter,
                           stop_ids=tok.stop_token_ids())
        skipped = prices[0].skipped if prices else 0
        return out.tokens[0], out.stats.total_generated / out.stats.decode_seconds, out.stats.tau, skipped
    finally:
        speculative.HINDSIGHT_BLOCKS, speculative.RowPrice, lookup.FIRST_PRIOR = blocks_now, price_now, prior_now


tok_s = {s: {r: [] for r in runs} for s in sets}
tau = {s: {r: [] for r in runs} for s in sets}
skipped = {s: {r: [] for r in runs if r != "ar"} for s in sets}
for rep in range(reps):
    for s, prompts in sets.items():
        for i, p in enumerate(prompts):
            outs = {}
            for r in (runs if (i + rep) % 2 == 0 else runs[::-1]):
                outs[r], speed, t, k = run(r, p)
                tok_s[s][r].append(speed)
                tau[s][r].append(t)
                if r != "ar":
                    skipped[s][r].append(k)
            if any(o != outs["ar"] for o in outs.values()):
                raise SystemExit(f"{s} request {i}: an output differs from ar's")
            print(f"rep {rep + 1} {s} {i + 1}/{len(prompts)}", {r: round(v[-1], 1) for r, v in tok_s[s].items()},
                  {r: v[-1] for r, v in skipped[s].items()}, file=sys.stderr, flush=True)
summary = {s: runs_over_ar(tok_s[s], tau[s]) for s in sets}
for s in sets:
    print_runs_over_ar(s, summary[s])
    print(f"{s:9} probes skipped a request:", {r: v for r, v in skipped[s].items()})
write_json(out_path, {"bench": "hindsight probes, one sequence", "machine": machine(), "model": name,
                      "sets": {s: len(p) for s, p in sets.items()}, "reps": reps, "new_tokens": 128,
                      "decode_only": True, "summary": summary, "tok_s": tok_s, "tau": tau, "skipped": skipped})
