"""The choice (validation requests only), fixed before the run: τ of the drafter alone (``measure_tau``: no leaves,
no copied drafts, every draft verified), 64 new tokens, on 16 validation code requests, 16 validation explain
requests and MT-Bench's 8 validation questions, against both targets as they run (weights auto: the GGUF's blocks).
The new drafter replaces the shipped one when its τ on the MT-Bench questions is higher by at least 0.05 on both
targets and its mean τ over code and explain is not lower by more than 0.03 on either (one drafter for both).

    PYTHONPATH=. python docs/results/chat-drafter/choose.py NEW_DRAFTER OUT_JSON
"""
import sys

import d3d
from bench.common import machine, request_sets
from d3d.fetch import fetch
from d3d.files import write_json
from d3d.train.chat_data import chat_prompts
from d3d.train.drafter import measure_tau

SHIPPED = "models/d3d-drafter-qwen2.5-coder-0.5b"
new, out = sys.argv[1:]
result = {"machine": machine(), "rule": "new if τ on MT-Bench validation is higher by >= 0.05 on both targets and "
          "the mean τ over code and explain is not lower by more than 0.03 on either",
          "prompts": "16 validation code + 16 validation explain requests + 8 MT-Bench validation questions, 64 new "
                     "tokens, weights auto, drafter alone"}
for target_name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
    path = fetch(target_name)
    t, tok = d3d.load_model(path), d3d.load_tokenizer(path)
    sets = {"code": chat_prompts(tok, None, 0.05, 16, "validation", seed=1234, templates=1),
            "explain": chat_prompts(tok, None, 0.05, 16, "validation", seed=1234, explain=True),
            "mtbench": request_sets(tok, path, ["mtbench"])["mtbench"]}
    for name, drafter_dir in (("shipped", SHIPPED), ("new", new)):
        drafter = d3d.load_drafter(drafter_dir, target=t)
        r = {k: measure_tau(t, drafter, p, 64, 16, stop_ids=tok.stop_token_ids()) for k, p in sets.items()}
        r["code_explain"] = (r["code"]["tau"] + r["explain"]["tau"]) / 2
        result.setdefault(target_name, {})[name] = r
        print(target_name, name, {k: round(v["tau"], 3) for k, v in r.items() if k in sets}, flush=True)
ok = all(result[m]["new"]["mtbench"]["tau"] >= result[m]["shipped"]["mtbench"]["tau"] + 0.05
         and result[m]["new"]["code_explain"] >= result[m]["shipped"]["code_explain"] - 0.03
         for m in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"))
result["chosen"] = "new" if ok else "shipped"
print("chosen:", result["chosen"])
write_json(out, result)
