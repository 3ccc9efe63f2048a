"""When a sequence's chain starts (``d3d.decode.draft_model.START_ROUNDS`` / ``START_TAU``), on validation requests
of the 1.5B beside the 0.5B: tok/s over ar's, decoding alone and end to end (the target's prefill counted), medians of
per-request ratios; every output must equal ar's. The runs of a request take turns, the order reversed every other
request. Run from the repository root:

    python docs/results/draft-model/start/validate.py SETS OUT.json RUN ...

SETS, comma-separated, as ``bench.common.request_sets`` names them. RUN: ``ar`` (needed), ``now`` (the defaults,
no chain), ``start@R/T`` (the defaults with the 0.5B's chains, a sequence's starting after R rounds under T tokens a
round; ``start@0/99``: from the first round, as chains fed at admission had).
"""
import statistics, sys, json, time
import torch
import d3d
from bench.common import machine, request_sets, write_json
from d3d.decode import draft_model
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
torch.set_grad_enabled(False)
wanted, out_path, runs = sys.argv[1].split(","), sys.argv[2], sys.argv[3:]
big, small_path = resolve_model("qwen2.5-coder-1.5b"), resolve_model("qwen2.5-coder-0.5b")
target, small = d3d.load_model(big, weights="auto"), d3d.load_model(small_path, weights="auto")
tok = d3d.load_tokenizer(big)
_, drafter, _ = pick_drafter(target, "sync", None)
sets = request_sets(tok, big, wanted)
def run(engine, prompt):
    if engine.startswith("start@"):
        r, t = engine[6:].split("/")
        draft_model.START_ROUNDS, draft_model.START_TAU = int(r), float(t)
    spec = {"ar": d3d.SpecConfig("ar"), "now": d3d.SpecConfig("sync")}.get(engine, d3d.SpecConfig("sync", draft_model=small))
    t0 = time.perf_counter()
    out = d3d.generate(target, prompt, max_new_tokens=128, spec=spec, drafter=drafter, stop_ids=tok.stop_token_ids())
    wall = time.perf_counter() - t0
    s = out.stats
    return {"ids": out.tokens[0], "tok_s": s.total_generated / s.decode_seconds, "e2e": s.total_generated / wall,
            "tau": s.tau, "model_drafts": s.model_drafts, "rounds": s.rounds, "n": s.total_generated}
d3d.generate(target, sets[wanted[0]][0][:16], max_new_tokens=4, stop_ids=[])
results = {}
for name, prompts in sets.items():
    rows = []
    for i, prompt in enumerate(prompts):
        got = {e: run(e, prompt) for e in (runs if i % 2 == 0 else runs[::-1])}
        if any(g["ids"] != got["ar"]["ids"] for g in got.values()):
            raise SystemExit(f"{name} {i}: a speculative output differs from ar's")
        rows.append({e: {k: v for k, v in g.items() if k != "ids"} for e, g in got.items()})
        print(name, i, got["ar"]["n"], {e: (round(g["e2e"], 1), round(g["tau"], 2)) for e, g in got.items()}, flush=True)
    over = {e: statistics.median(r[e]["tok_s"] / r["ar"]["tok_s"] for r in rows) for e in runs}
    e2e = {e: statistics.median(r[e]["e2e"] / r["ar"]["e2e"] for r in rows) for e in runs}
    results[name] = {"requests": rows, "median_over_ar": over, "median_e2e_over_ar": e2e}
    print(name, "decode over ar:", {e: round(v, 3) for e, v in over.items()}, "e2e:", {e: round(v, 3) for e, v in e2e.items()}, flush=True)
write_json(out_path, {"machine": machine(), "runs": runs, "results": results})
