"""The choice (validation requests only), fixed before the run: τ of the drafter alone (``measure_tau``:
no leaves, no copied drafts, every draft verified), 64 new tokens, on 16 validation code requests and
16 validation explain requests, against both targets as they run (weights auto: the GGUF's blocks).
The new drafter replaces the shipped one when its mean τ on the 1.5B is higher and its mean τ on the
0.5B is not lower by more than 0.03 (one drafter for both targets).

    PYTHONPATH=. python docs/results/standalone-drafter/choose.py NEW_DRAFTER OUT_JSON
"""
import sys

import d3d
from d3d.fetch import fetch
from d3d.files import write_json
from d3d.train.chat_data import chat_prompts
from d3d.train.drafter import measure_tau

SHIPPED = "models/d3d-drafter-qwen2.5-coder-0.5b"
new, out = sys.argv[1:]
result = {"prompts": "16 validation code + 16 validation explain requests, 64 new tokens, weights auto, drafter alone",
          "rule": "new if mean τ on the 1.5B is higher and on the 0.5B not lower by more than 0.03"}
for target_name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):
    path = fetch(target_name)
    t, tok = d3d.load_model(path), d3d.load_tokenizer(path)
    sets = {"code": chat_prompts(tok, None, 0.05, 16, "validation", seed=1234, templates=1),
            "explain": chat_prompts(tok, None, 0.05, 16, "validation", seed=1234, explain=True)}
    for name, drafter_dir in (("shipped", SHIPPED), ("new", new)):
        drafter = d3d.load_drafter(drafter_dir, target=t)
        r = {k: measure_tau(t, drafter, p, 64, 16, stop_ids=tok.stop_token_ids()) for k, p in sets.items()}
        r["mean"] = (r["code"]["tau"] + r["explain"]["tau"]) / 2
        result.setdefault(target_name, {})[name] = r
        print(target_name, name, {k: round(v["tau"], 3) for k, v in r.items() if k != "mean"}, flush=True)
big, small = result["qwen2.5-coder-1.5b"], result["qwen2.5-coder-0.5b"]
result["chosen"] = "new" if big["new"]["mean"] > big["shipped"]["mean"] and \
    small["new"]["mean"] >= small["shipped"]["mean"] - 0.03 else "shipped"
print("chosen:", result["chosen"])
write_json(out, result)
