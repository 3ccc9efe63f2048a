"""τ of the drafter alone (every draft verified, no copies) and its seconds a pass, int8 (asked for) against the
default int4 beside a quantized target, on 8 validation code and 8 validation explain requests, 96 tokens; each
request's runs in turn. Run from the repository root:

    python docs/results/drafter-int4/tau_alone.py MODEL OUT.json
"""
import statistics
import sys

import torch

import d3d
from bench.common import machine, request_sets, write_json
from d3d.assets import models_dir
from d3d.draft.drafter import load_drafter
from d3d.fetch import resolve_model

torch.set_grad_enabled(False)
name, out_path = sys.argv[1:3]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
dpath = models_dir() / "d3d-drafter-qwen2.5-coder-0.5b"
drafters = {"int8": load_drafter(dpath, target=target, weights="int8"), "int4": load_drafter(dpath, target=target)}
result = {}
for s, prompts in request_sets(tok, path, ["code", "explain"]).items():
    runs = {w: [] for w in drafters}
    for p in prompts:
        for w, d in drafters.items():
            st = d3d.generate(target, p, max_new_tokens=96, spec="sync,lookup=0,verify_min_prob=0", drafter=d,
                              stop_ids=tok.stop_token_ids()).stats
            runs[w].append((st.tau, 1e3 * st.draft_seconds / max(1, st.drafter_forwards)))
    result[s] = {w: {"mean_tau": round(statistics.mean(t for t, _ in v), 3),
                     "median_pass_ms": round(statistics.median(m for _, m in v), 3)} for w, v in runs.items()}
    print(s, result[s], flush=True)
write_json(out_path, {"bench": "drafter alone, int8 vs int4", "machine": machine(), "model": name, "requests": 8,
                      "new_tokens": 96, "result": result})
