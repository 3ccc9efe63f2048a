"""The passes that want some rows' logits only, with the last layer carrying every row past attention (before) and
those rows alone (now, ``Transformer._last_layer_rows``): the target's prefill of T prompt tokens, the drafter's
catch-up over T committed tokens (then a block of 5), and sync's drafting pass (2 new tokens and a block of 5 after
a 198-token context). Median ms of REPS passes of each, the two taking turns. Run from the repository root:

    python docs/results/last-layer-rows/passes.py MODEL OUT.json [REPS]
"""
import statistics
import sys
import time

import torch

import d3d
from bench.common import machine, write_json
from d3d.draft.drafter import Block
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.model.transformer import Transformer

torch.set_grad_enabled(False)
name, out_path = sys.argv[1], sys.argv[2]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 7
target = d3d.load_model(resolve_model(name), weights="auto")
_, drafter, _ = pick_drafter(target, "sync", None)
now = Transformer._last_layer_rows
ways = {"before": lambda self, x, index, wanted: None, "now": now}
ids = [(7 * i + 11) % 30000 for i in range(600)]


def prefill(T):
    cache = target.new_cache(1, T + 8)
    layout = cache.layout([T])
    return lambda: target(torch.tensor(ids[:T]), layout, cache, logits_index=layout.last_token_index())


def catch_up(T, context=0):
    cache = drafter.new_cache(1, 700)
    if context:
        drafter.draft_blocks(cache, [0], [ids[:context]], [[Block(context, ids[context])]], 5)
    return lambda: drafter.draft_blocks(cache, [0], [ids[context:context + T]], [[Block(T, ids[context + T])]], 5)


cases = {f"target prefill {T}": (prefill, T) for T in (64, 128, 256, 512)}
cases |= {f"drafter catch-up {T}": (catch_up, T) for T in (16, 32, 64, 128, 256)}
cases["drafter sync pass (2 new after 198)"] = (lambda T: catch_up(T, 198), 2)
ms = {case: {way: [] for way in ways} for case in cases}
for case, (make, T) in cases.items():
    for i in range(reps + 1):
        for way in (ways if i % 2 == 0 else reversed(list(ways))):
            Transformer._last_layer_rows = ways[way]
            run = make(T)  # a fresh cache each pass
            t = time.perf_counter()
            run()
            if i:
                ms[case][way].append(1e3 * (time.perf_counter() - t))
    med = {way: statistics.median(v) for way, v in ms[case].items()}
    print(f"{name}: {case}: before {med['before']:.2f} ms, now {med['now']:.2f} ms ({med['now'] / med['before']:.3f}x)",
          flush=True)
Transformer._last_layer_rows = now
summary = {case: {way: round(statistics.median(v), 3) for way, v in m.items()} for case, m in ms.items()}
write_json(out_path, {"bench": "last layer: every row vs the wanted rows past attention", "machine": machine(),
                      "model": name, "reps": reps, "median_ms": summary, "ms": ms})
