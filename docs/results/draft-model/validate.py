"""The 1.5B's defaults with and without the 0.5B's greedy chains as a draft source (``SpecConfig(draft_model=...)``),
beside ar, on validation requests: decoded tokens per second (prefill excluded; the chain's own prompt pass, made
at admission, is counted in decoding) over ar's, medians of per-request ratios, τ; every output must equal ar's.
The runs of a request take turns, the order reversed every other request. Run from the repository root:

    python docs/results/draft-model/validate.py SETS OUT.json [RUN ...]

SETS, comma-separated, as ``bench.common.request_sets`` names them (``code``, ``explain``, ``mtbench``,
``mtbench-free``). RUN: ``ar``, ``now`` (the defaults), ``chain`` (the defaults with the 0.5B's chains), ``t=P``
(the chains cut at a fixed joint probability P instead of the row price's R * (c + b)); default ar now chain.
"""
import statistics
import sys

import torch

import d3d
from bench.common import machine, request_sets, write_json
from d3d.decode import draft_model
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model

torch.set_grad_enabled(False)
wanted, out_path, runs = sys.argv[1].split(","), sys.argv[2], sys.argv[3:] or ["ar", "now", "chain"]
big, small_path = resolve_model("qwen2.5-coder-1.5b"), resolve_model("qwen2.5-coder-0.5b")
target, small = d3d.load_model(big, weights="auto"), d3d.load_model(small_path, weights="auto")
tok = d3d.load_tokenizer(big)
_, drafter, _ = pick_drafter(target, "sync", None)
sets = request_sets(tok, big, wanted)
rule = draft_model.ModelChain.min_prob


def run(engine: str, prompt):
    draft_model.ModelChain.min_prob = (lambda self: float(engine[2:])) if engine.startswith("t=") else rule
    spec = {"ar": d3d.SpecConfig("ar"), "now": d3d.SpecConfig("sync")}.get(engine, d3d.SpecConfig("sync", draft_model=small))
    out = d3d.generate(target, prompt, max_new_tokens=128, spec=spec, drafter=drafter, stop_ids=tok.stop_token_ids())
    s = out.stats
    return {"ids": out.tokens[0], "tok_s": s.total_generated / s.decode_seconds, "tau": s.tau,
            "model_drafts": s.model_drafts, "rounds": s.rounds}


d3d.generate(target, sets[wanted[0]][0][:16], max_new_tokens=4, stop_ids=[])  # warm-up
results = {}
for name, prompts in sets.items():
    rows = []
    for i, prompt in enumerate(prompts):
        got = {e: run(e, prompt) for e in (runs if i % 2 == 0 else runs[::-1])}
        if any(g["ids"] != got["ar"]["ids"] for g in got.values()):
            raise SystemExit(f"{name} {i}: a speculative output differs from ar's")
        rows.append({e: {k: v for k, v in g.items() if k != "ids"} for e, g in got.items()})
        print(name, i, {e: (round(g["tok_s"], 1), round(g["tau"], 2)) for e, g in got.items()}, flush=True)
    over = {e: statistics.median(r[e]["tok_s"] / r["ar"]["tok_s"] for r in rows) for e in runs}
    tau = {e: statistics.mean(r[e]["tau"] for r in rows) for e in runs if e != "ar"}
    results[name] = {"requests": rows, "median_over_ar": over, "mean_tau": tau}
    print(name, "over ar (median):", {e: round(v, 3) for e, v in over.items()}, "τ:", {e: round(v, 2) for e, v in tau.items()},
          flush=True)
write_json(out_path, {"bench": "draft-model-validation", "machine": machine(), "runs": runs, "results": results})
