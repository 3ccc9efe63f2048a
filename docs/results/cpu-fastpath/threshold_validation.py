"""Validation sweep of async's successor_threshold (CPU default), bundled pair, validation prompts."""
import json, statistics, sys, time
import torch
import d3d
from d3d.assets import bundled, BUNDLED_TARGET, BUNDLED_DRAFTER
from d3d.data.prompts import heldout_prompts
sys.path.insert(0, ".")
from bench.common import machine
torch.set_grad_enabled(False)
t = d3d.load_model(bundled(BUNDLED_TARGET)); dr = d3d.load_drafter(bundled(BUNDLED_DRAFTER), target=t)
tok = d3d.load_tokenizer(bundled(BUNDLED_TARGET))
prompts = heldout_prompts(tok, None, 0.05, 12, 64, part="validation")
modes = {"ar": {}, "sync": dict(spec="sync", drafter=dr)}
for th in (0.0, 0.1, 0.2, 0.3, 0.5, 0.7):
    modes[f"async@{th}"] = dict(spec=d3d.SpecConfig(mode="async", successor_threshold=th), drafter=dr)
d3d.generate(t, [1, 2, 3], max_new_tokens=8, spec="async", drafter=dr, stop_ids=[])
tot = {m: [0, 0.0] for m in modes}
for p in prompts:
    for m, kw in modes.items():
        s = time.perf_counter(); out = d3d.generate(t, p, max_new_tokens=128, stop_ids=[], **kw)
        tot[m][0] += out.stats.total_generated; tot[m][1] += time.perf_counter() - s
ar = tot["ar"][0] / tot["ar"][1]
res = {m: {"tok_s": a / b, "vs_ar": a / b / ar} for m, (a, b) in tot.items()}
for m, r in res.items(): print(f"{m:10s} {r['tok_s']:6.0f} tok/s {r['vs_ar']:.2f}x")
json.dump({"what": "successor_threshold sweep on validation prompts (12 x 128 tokens, bundled pair, default dtype)",
           "machine": machine(), "results": res}, open("docs/results/cpu-fastpath/threshold_validation.json", "w"), indent=2)
