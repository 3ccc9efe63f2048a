"""How far back a drafter pass catches up (``DRAFT_WINDOW``) and whether R leaves the catch-up round out, for one
sequence: decoded tokens per second of decoding (prefill excluded: the same for every run, ~6 s for a 2,000-token
prompt) over ar's, medians of per-request ratios, τ; every output must equal ar's. The runs of a request take
turns, the order reversed every other request. Run from the repository root:

    python docs/results/draft-window/validate.py MODEL SETS OUT.json [--runs RUN ...] [--reps N]

SETS, comma-separated: ``long`` (4 standard-library modules, their first ~2,000 tokens shown, a summary asked:
argparse, textwrap, difflib, shlex), ``long-eval`` (the same for json.decoder, csv, heapq, fractions; reported,
never chosen on), and the sets of ``bench.common.request_sets``: ``code``, ``explain`` (8 validation requests each,
as cut-batch1/validate.py), ``mtbench`` (its 8 validation questions), ``mtbench-free`` (8 role-play questions).
RUN: ``ar``; ``now`` (the defaults); ``window=N`` (the defaults with DRAFT_WINDOW = N, 0: none); ``before`` (no
window and the row price of commit c809e9c, whose R counted the catch-up round); ``r-before`` (the window, with
c809e9c's row price); ``price@REV`` (the defaults with the row price of git revision REV).
"""
import sys

import torch

sys.path.insert(0, "docs/results/cut-batch1")
from before import row_price_before  # noqa: E402

import d3d  # noqa: E402
from bench.common import machine, print_runs_over_ar, request_sets, runs_over_ar, write_json  # noqa: E402
from d3d.data.prompts import summary_request  # noqa: E402
from d3d.decode import speculative  # noqa: E402
from d3d.draft.pick import pick_drafter  # noqa: E402
from d3d.fetch import resolve_model  # noqa: E402

BEFORE = "c809e9c"
LONG = {"long": ["argparse", "textwrap", "difflib", "shlex"], "long-eval": ["json.decoder", "csv", "heapq", "fractions"]}
torch.set_grad_enabled(False)
name, wanted, out_path = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
args = sys.argv[4:]
reps = int(args[args.index("--reps") + 1]) if "--reps" in args else 1
runs = args[args.index("--runs") + 1:] if "--runs" in args else ["ar", "now", "before"]
runs = [r for r in runs if r != "--reps" and not r.isdigit()]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)


# the long prompts here; the rest as bench.common.request_sets names them (it refuses an unknown name)
sets = {s: [summary_request(tok, m) for m in LONG[s]] if s in LONG else request_sets(tok, path, [s])[s] for s in wanted}
window_now, price_now = speculative.DRAFT_WINDOW, speculative.RowPrice


def run(engine: str, prompt):
    if engine.startswith("window="):
        speculative.DRAFT_WINDOW = int(engine.split("=")[1]) or 1 << 30
    if engine == "before":
        speculative.DRAFT_WINDOW, speculative.RowPrice = 1 << 30, row_price_before(BEFORE).RowPrice
    if engine == "r-before":
        speculative.RowPrice = row_price_before(BEFORE).RowPrice
    if engine.startswith("price@"):
        speculative.RowPrice = row_price_before(engine.split("@")[1]).RowPrice
    try:
        out = d3d.generate(target, prompt, max_new_tokens=128, spec="ar" if engine == "ar" else "sync", drafter=drafter,
                           stop_ids=tok.stop_token_ids())
        return out.tokens[0], out.stats.total_generated / out.stats.decode_seconds, out.stats.tau
    finally:
        speculative.DRAFT_WINDOW, speculative.RowPrice = window_now, price_now


tok_s = {s: {r: [] for r in runs} for s in sets}
tau = {s: {r: [] for r in runs} for s in sets}
for rep in range(reps):
    for s, prompts in sets.items():
        for i, p in enumerate(prompts):
            outs = {}
            for r in (runs if (i + rep) % 2 == 0 else runs[::-1]):
                outs[r], speed, t = run(r, p)
                tok_s[s][r].append(speed)
                tau[s][r].append(t)
            if any(o != outs["ar"] for o in outs.values()):
                raise SystemExit(f"{s} request {i}: an output differs from ar's")
            print(f"rep {rep + 1} {s} {i + 1}/{len(prompts)}", {r: round(v[-1], 1) for r, v in tok_s[s].items()},
                  file=sys.stderr, flush=True)
summary = {s: runs_over_ar(tok_s[s], tau[s]) for s in sets}
for s in sets:
    print_runs_over_ar(s, summary[s])
write_json(out_path, {"bench": "drafter window and R without the catch-up, one sequence", "machine": machine(),
                      "model": name, "sets": {s: LONG.get(s, len(p)) for s, p in sets.items()}, "reps": reps,
                      "new_tokens": 128, "decode_only": True, "summary": summary, "tok_s": tok_s, "tau": tau})
