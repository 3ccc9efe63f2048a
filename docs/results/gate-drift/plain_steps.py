"""Whether sync's plain steps cost what ar's steps do: sync with the gate held at plain steps (no drafter rounds)
and no copies (lookup=0), against ar, on the same requests, the two taking turns. A difference would be the
speculative engine's own cost per round. ORDER: ``fixed`` (ar first on every request, the default) or
``alternating`` (the first engine alternates from request to request).

    python docs/results/gate-drift/plain_steps.py MODEL [REPS] [ORDER] > OUT.txt
"""
import statistics
import sys

import torch

import d3d
from d3d.data.prompts import mtbench_prompts
from d3d.decode import speculative
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.hardware import cpu_flags

torch.set_grad_enabled(False)
name = sys.argv[1]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
order = sys.argv[3] if len(sys.argv) > 3 else "fixed"
if order not in ("fixed", "alternating"):
    raise SystemExit(f"ORDER: {order!r} is not fixed or alternating")
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
speculative.RowPrice.draft = lambda self, rows: False  # every round a plain step
prompts = [tok.encode_chat([{"role": "user", "content": mtbench_prompts()[i]}]) for i in (6, 7, 8, 9)]
ms = {"ar": [], "sync,lookup=0": []}
print(f"{name}, {order} order; cpu flags", " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))))
for rep in range(reps):
    for i, p in enumerate(prompts):
        for eng in list(ms) if order == "fixed" or (rep * len(prompts) + i) % 2 == 0 else list(ms)[::-1]:
            out = d3d.generate(target, p, max_new_tokens=64, spec=eng, drafter=drafter, stop_ids=tok.stop_token_ids())
            ms[eng].append(out.stats.decode_seconds / out.stats.total_generated * 1e3)
for eng, v in ms.items():
    print(f"{eng}: median {statistics.median(v):.2f} ms a token; " + " ".join(f"{x:.1f}" for x in v))
print("sync over ar per request:", " ".join(f"{b / a:.3f}" for a, b in zip(ms["ar"], ms["sync,lookup=0"])))
