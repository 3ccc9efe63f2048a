"""Batches: the gate now (``d3d.decode.row_price``) against the gate before (``before.py``, from git) and ar, in
batches of 4 and 16 validation chat requests (16 code, 16 explain), 128 tokens, greedy, the real model's GGUF
blocks; the three runs of each batch size take turns (the order reversed every other size). tok/s = tokens
generated over wall time. Every output must equal ar's. Run from the repository root:

    python docs/results/cut-batch1/batches.py MODEL OUT.json
"""
import sys
import time

import torch

sys.path.insert(0, "docs/results/cut-batch1")
from before import row_price_before  # noqa: E402

import d3d  # noqa: E402
from bench.common import machine, write_json  # noqa: E402
from d3d.data.corpus import training_corpus  # noqa: E402
from d3d.decode import speculative  # noqa: E402
from d3d.draft.pick import pick_drafter  # noqa: E402
from d3d.fetch import resolve_model  # noqa: E402
from d3d.train.chat_data import chat_prompts  # noqa: E402

torch.set_grad_enabled(False)
name, out_path = sys.argv[1], sys.argv[2]
path = resolve_model(name)
target = d3d.load_model(path, weights="auto")
tok = d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
corpus = training_corpus(path)
sets = {s: chat_prompts(tok, corpus, 0.05, 16, "validation", seed=1234, templates=1, explain=s == "explain")
        for s in ("code", "explain")}
price_now = speculative.RowPrice


def run(engine, prompts, n):
    speculative.RowPrice = row_price_before().RowPrice if engine == "gate before" else price_now
    try:
        tokens, outs, t0 = 0, [], time.perf_counter()
        for i in range(0, len(prompts), n):
            o = d3d.generate(target, prompts[i:i + n], max_new_tokens=128, spec="ar" if engine == "ar" else "sync",
                             drafter=drafter, stop_ids=tok.stop_token_ids())
            tokens += o.stats.total_generated
            outs += o.tokens
        return tokens / (time.perf_counter() - t0), outs
    finally:
        speculative.RowPrice = price_now


rows, k = [], 0
for s, prompts in sets.items():
    for n in (4, 16):
        engines = ["ar", "gate now", "gate before"][::1 if k % 2 == 0 else -1]
        k += 1
        res = {e: run(e, prompts, n) for e in engines}
        for e in engines:
            if res[e][1] != res["ar"][1]:
                raise SystemExit(f"{s}, batch {n}, {e}: an output differs from ar's")
            rows.append({"set": s, "batch": n, "engine": e, "tok_s": round(res[e][0], 2),
                         "vs_ar": round(res[e][0] / res["ar"][0], 3)})
            print(rows[-1], flush=True)
write_json(out_path, {"bench": "gate in batches, before and now", "machine": machine(), "model": name,
                      "new_tokens": 128, "rows": rows})
