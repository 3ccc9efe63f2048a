"""Whether sync's plain steps cost what ar's steps do, with the drafter never asked (every round a plain step, no
copies): ms a decoded token, 128 tokens of one MT-Bench validation question, the two engines run in a fixed order
(ar first in every pair, as split.py had) and then alternating. Run from the repository root:

    python docs/results/gate-drift/plain_order.py MODEL [REPS] > OUT.txt
"""
import statistics
import sys

import torch

import d3d
from d3d.data.prompts import mtbench_prompts
from d3d.decode import row_price
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model

torch.set_grad_enabled(False)
name = sys.argv[1]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
prompt = tok.encode_chat([{"role": "user", "content": mtbench_prompts()[7]}])
row_price.RowPrice.draft = lambda self, rows: False  # every round a plain step
engines = {"ar": "ar", "sync (plain steps)": "sync lookup=0"}
for order in ("fixed", "alternating"):
    ms = {e: [] for e in engines}
    for rep in range(reps):
        pair = list(engines) if order == "fixed" or rep % 2 == 0 else list(engines)[::-1]
        for e in pair:
            out = d3d.generate(target, prompt, max_new_tokens=128, spec=engines[e], drafter=drafter, stop_ids=[])
            ms[e].append(1e3 * out.stats.decode_seconds / out.stats.total_generated)
    print(f"{name}, {order} order: " + ", ".join(f"{e} {statistics.median(v):.2f} ms a token "
                                                 f"({' '.join(f'{x:.2f}' for x in v)})" for e, v in ms.items()),
          flush=True)
