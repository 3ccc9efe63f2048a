"""Reported only (never chosen on): τ of the drafter alone (``measure_tau``: no leaves, no copied drafts, every
draft verified), 64 new tokens, shipped against new, on the evaluation sets (8 HumanEval chat requests, 8 about
held-out library functions, MT-Bench questions 0-5, 10, 11), against both targets (weights auto).

    PYTHONPATH=. python docs/results/chat-drafter/tau_eval.py SHIPPED_DRAFTER NEW_DRAFTER OUT_JSON
"""
import sys

import d3d
from bench.common import machine, request_sets
from d3d.fetch import fetch
from d3d.files import write_json
from d3d.train.drafter import measure_tau

shipped, new, out = sys.argv[1:]
result = {"machine": machine(), "prompts": "evaluation: humaneval, library, mtbench-eval; 64 new tokens, alone"}
for target_name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
    path = fetch(target_name)
    t, tok = d3d.load_model(path), d3d.load_tokenizer(path)
    sets = request_sets(tok, path, ["humaneval", "library", "mtbench-eval"])
    for name, drafter_dir in (("shipped", shipped), ("new", new)):
        drafter = d3d.load_drafter(drafter_dir, target=t)
        r = {k: measure_tau(t, drafter, p, 64, 16, stop_ids=tok.stop_token_ids()) for k, p in sets.items()}
        result.setdefault(target_name, {})[name] = r
        print(target_name, name, {k: round(v["tau"], 3) for k, v in r.items()}, flush=True)
write_json(out, result)
