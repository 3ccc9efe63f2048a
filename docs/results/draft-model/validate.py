"""The 1.5B's defaults with and without the 0.5B's greedy chains as a draft source (``SpecConfig(draft_model=...)``),
beside ar, on validation requests: tokens per second over ar's, decoding alone (``median_over_ar``) and end to end
(``median_e2e_over_ar``: the target's prefill counted), medians of per-request ratios, τ; every output must equal
ar's. The runs of a request take turns, the order reversed every other request. Run from the repository root:

    python docs/results/draft-model/validate.py SETS OUT.json [RUN ...]

SETS, comma-separated, as ``bench.common.request_sets`` names them (``code``, ``explain``, ``mtbench``,
``mtbench-free``). RUN: ``ar``, ``now`` (the defaults without chains), ``chain`` (with the 0.5B's chains as the
module's constants say), ``start@R/T`` (with chains that start after R rounds under T tokens a round,
``START_ROUNDS`` / ``START_TAU``; ``start@0/99``: from the first round), ``t=P`` (chains cut at a fixed joint
probability P instead of the row price's R * (c + b)), ``leaves=N`` (chains and the spec's ``leaves=N``: the
chains' runners-up, and the drafter's, verified as leaves); default ar now chain. (``validation.json`` is of stop 77's
chains, fed the prompt at admission; ``start/validation_*.json`` of the late start.)
"""
import statistics
import sys
import time

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
rule, START = draft_model.ModelChain.min_prob, (draft_model.START_ROUNDS, draft_model.START_TAU)


def run(engine: str, prompt):
    draft_model.ModelChain.min_prob = (lambda self: float(engine[2:])) if engine.startswith("t=") else rule
    draft_model.START_ROUNDS, draft_model.START_TAU = START
    if engine.startswith("start@"):
        r, t = engine[6:].split("/")
        draft_model.START_ROUNDS, draft_model.START_TAU = int(r), float(t)
    leaves = int(engine[7:]) if engine.startswith("leaves=") else None
    spec = {"ar": d3d.SpecConfig("ar"), "now": d3d.SpecConfig("sync")}.get(
        engine, d3d.SpecConfig("sync", draft_model=small, leaves=leaves))
    t0 = time.perf_counter()
    out = d3d.generate(target, prompt, max_new_tokens=128, spec=spec, drafter=drafter, stop_ids=tok.stop_token_ids())
    wall, s = time.perf_counter() - t0, out.stats
    return {"ids": out.tokens[0], "tok_s": s.total_generated / s.decode_seconds, "e2e": s.total_generated / wall,
            "tau": s.tau, "model_drafts": s.model_drafts, "rounds": s.rounds, "n": s.total_generated,
            "leaf_hits": s.leaf_hits}


d3d.generate(target, sets[wanted[0]][0][:16], max_new_tokens=4, stop_ids=[])  # warm-up
results = {}
for name, prompts in sets.items():
    rows = []
    for i, prompt in enumerate(prompts):
        got = {e: run(e, prompt) for e in (runs if i % 2 == 0 else runs[::-1])}
        if any(g["ids"] != got["ar"]["ids"] for g in got.values()):
            raise SystemExit(f"{name} {i}: a speculative output differs from ar's")
        rows.append({e: {k: v for k, v in g.items() if k != "ids"} for e, g in got.items()})
        print(name, i, got["ar"]["n"], {e: (round(g["e2e"], 1), round(g["tau"], 2)) for e, g in got.items()},
              flush=True)
    over, e2e = ({e: statistics.median(r[e][k] / r["ar"][k] for r in rows) for e in runs} for k in ("tok_s", "e2e"))
    tau = {e: statistics.mean(r[e]["tau"] for r in rows) for e in runs if e != "ar"}
    results[name] = {"requests": rows, "median_over_ar": over, "median_e2e_over_ar": e2e, "mean_tau": tau}
    print(name, "decode over ar:", {e: round(v, 3) for e, v in over.items()}, "e2e:",
          {e: round(v, 3) for e, v in e2e.items()}, "τ:", {e: round(v, 2) for e, v in tau.items()}, flush=True)
write_json(out_path, {"bench": "draft-model-validation", "machine": machine(), "runs": runs, "results": results})
