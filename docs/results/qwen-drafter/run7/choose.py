"""The choice (validation requests only): τ of the shipped drafter and of a new one, drafter alone
(``measure_tau``: no leaves, no copied drafts), fp32, 64 new tokens, on 16 validation code requests
and 16 validation explain requests (prose about held-out functions).

    PYTHONPATH=. python docs/results/qwen-drafter/run7/choose.py TARGET NEW_DRAFTER OUT_JSON
"""
import sys

import d3d
from d3d.files import write_json
from d3d.train.chat_data import chat_prompts
from d3d.train.drafter import measure_tau

target_dir, new, out = sys.argv[1:]
t = d3d.load_model(target_dir, dtype="float32")
tok = d3d.load_tokenizer(target_dir)
sets = {"code": chat_prompts(tok, None, 0.05, 16, "validation", seed=1234, templates=1),
        "explain": chat_prompts(tok, None, 0.05, 16, "validation", seed=1234, explain=True)}
result = {"prompts": "16 validation code requests + 16 validation explain requests, 64 new tokens, fp32, drafter alone"}
for name, path in (("shipped", "models/d3d-drafter-qwen2.5-coder-0.5b"), ("new", new)):
    drafter = d3d.load_drafter(path, target=t)
    result[name] = {k: measure_tau(t, drafter, p, 64, 16, stop_ids=tok.stop_token_ids()) for k, p in sets.items()}
    print(name, {k: round(v["tau"], 3) for k, v in result[name].items()}, flush=True)
write_json(out, result)
