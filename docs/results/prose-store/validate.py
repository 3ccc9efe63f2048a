"""Sync's defaults with a datastore of the target's own answers (``d3d.decode.datastore``) on validation requests,
one sequence: decoded tokens per second over ar's, medians of per-request ratios, τ; every output must equal ar's.
The runs of a request take turns, the order reversed every other request. Run from the repository root:

    python docs/results/prose-store/validate.py MODEL SETS OUT.json [--reps N] [--runs chat,all]

SETS, comma-separated, as ``bench.common.request_sets`` names them (validation: code, explain, mtbench). Runs:
``ar``, ``sync`` (the defaults), ``sync+chat`` (a store of the answers to general chat requests,
``data/qwen2.5-coder-chat-answers``), ``sync+all`` (those and the answers about functions,
``data/qwen2.5-coder-answers``); ``--runs`` names which of the last two run (default both).
"""
import sys
import time

import torch

import d3d
from bench.common import machine, print_runs_over_ar, request_done, request_sets, runs_over_ar, turns, write_json
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model

STORES = {"chat": ["data/qwen2.5-coder-chat-answers"],
          "all": ["data/qwen2.5-coder-chat-answers", "data/qwen2.5-coder-answers"]}
torch.set_grad_enabled(False)
name, wanted, out_path, *args = sys.argv[1:]
reps = int(args[args.index("--reps") + 1]) if "--reps" in args else 1
stores = args[args.index("--runs") + 1].split(",") if "--runs" in args else list(STORES)
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)


def store(dirs: list[str]):
    t = time.perf_counter()
    ds = d3d.load_datastore(dirs, target)  # the target's own answers (its real model's, another checkpoint's too)
    print(f"store {'+'.join(dirs)}: {len(ds)} tokens in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return ds


specs = {"ar": "ar", "sync": "sync"} | {f"sync+{k}": d3d.SpecConfig("sync", datastore=store(STORES[k])) for k in stores}
sets = request_sets(tok, path, wanted.split(","))
tok_s, tau = ({s: {r: [] for r in specs} for s in sets} for _ in range(2))
for rep, s, i, p, order in turns(sets, list(specs), reps):
    outs = {}
    for r in order:
        out = d3d.generate(target, p, max_new_tokens=128, spec=specs[r], drafter=drafter, stop_ids=tok.stop_token_ids())
        outs[r] = out.tokens[0]
        tok_s[s][r].append(out.stats.total_generated / out.stats.decode_seconds)
        tau[s][r].append(out.stats.tau)
    request_done(outs, tok_s[s], f"rep {rep + 1} {s} {i + 1}/{len(sets[s])}")
summary = {s: runs_over_ar(tok_s[s], tau[s]) for s in sets}
for s in sets:
    print_runs_over_ar(s, summary[s])
write_json(out_path, {"bench": "sync with a datastore of the target's answers, one sequence", "machine": machine(),
                      "model": name, "stores": STORES, "sets": {s: len(p) for s, p in sets.items()}, "reps": reps,
                      "new_tokens": 128, "decode_only": True, "summary": summary, "tok_s": tok_s, "tau": tau})
