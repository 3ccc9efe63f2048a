"""Batch gate probe: sync with the draft-or-step choice vs without, vs ar; validation chat requests."""
import json, sys, time, d3d
import d3d.decode.row_price as rp
from d3d.draft.pick import pick_drafter
from d3d.train.chat_data import chat_prompts
md, out_path = sys.argv[1], sys.argv[2]
t = d3d.load_model(md); tok = d3d.load_tokenizer(md)
_, dr, _ = pick_drafter(t, "sync")
stops = sorted(set(tok.stop_token_ids()) | set(t.cfg.eos_token_ids))
sets = {"code": chat_prompts(tok, None, 0.05, 16, "validation", seed=1234, templates=1),
        "explain": chat_prompts(tok, None, 0.05, 16, "validation", seed=1234, templates=1, explain=True)}
orig = rp.RowPrice.__init__
def run(spec, prompts, n, gate):
    rp.RowPrice.__init__ = lambda self, *a, **k: orig(self, *a, **{**k, "min_rows": 2 if gate else 10**9})
    tokens, t0 = 0, time.perf_counter()
    outs = []
    for i in range(0, len(prompts), n):
        o = d3d.generate(t, prompts[i:i+n], max_new_tokens=128, spec=spec, drafter=dr, stop_ids=stops)
        tokens += o.stats.total_generated; outs += o.tokens
    return tokens / (time.perf_counter() - t0), outs
rows = []
for name, prompts in sets.items():
    for n in (1, 4, 16):
        ar, ref = run("ar", prompts, n, False)
        for gate in ((False,) if n == 1 else (False, True)):
            tps, outs = run("sync", prompts, n, gate)
            same = sum(a == b for a, b in zip(outs, ref))
            rows.append({"set": name, "batch": n, "gate": gate, "tok_s": tps, "ar_tok_s": ar, "vs_ar": tps / ar, "same": same})
            print(json.dumps(rows[-1]), flush=True)
json.dump({"model": md, "rows": rows}, open(out_path, "w"), indent=1)
