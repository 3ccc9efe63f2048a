"""τ of drafters that differ only in their drafting vocabulary, on validation requests only (the
choice): the drafter alone (``measure_tau``: no leaves, no copied drafts), fp32, 64 new tokens, 16
validation code requests and 16 validation explain requests, as ``run7/choose.py``.

    PYTHONPATH=. python docs/results/qwen-drafter/vocab/compare.py TARGET OUT_JSON NAME=DRAFTER_DIR ...
"""
import sys
import time

import d3d
from d3d.files import write_json
from d3d.train.chat_data import chat_prompts
from d3d.train.drafter import measure_tau

target_dir, out, *named = sys.argv[1:]
t = d3d.load_model(target_dir, dtype="float32")
tok = d3d.load_tokenizer(target_dir)
sets = {"code": chat_prompts(tok, None, 0.05, 16, "validation", seed=1234, templates=1),
        "explain": chat_prompts(tok, None, 0.05, 16, "validation", seed=1234, explain=True)}
result = {"prompts": "16 validation code requests + 16 validation explain requests, 64 new tokens, fp32, drafter alone"}
for name, path in (n.split("=", 1) for n in named):
    drafter = d3d.load_drafter(path, target=t)
    start = time.perf_counter()
    result[name] = {k: measure_tau(t, drafter, p, 64, 16, stop_ids=tok.stop_token_ids()) for k, p in sets.items()}
    result[name].update(drafter=path, draft_vocab=drafter.dcfg.draft_vocab_size, seconds=time.perf_counter() - start)
    print(name, {k: round(result[name][k]["tau"], 3) for k in sets}, flush=True)
    write_json(out, result)
