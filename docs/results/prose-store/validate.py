"""Sync's defaults with a datastore of the target's own answers (``d3d.decode.datastore``) on validation requests,
one sequence: decoded tokens per second over ar's, medians of per-request ratios, τ; every output must equal ar's.
The runs of a request take turns, the order reversed every other request. Run from the repository root:

    python docs/results/prose-store/validate.py MODEL SETS OUT.json [--reps N] [--runs chat,all]

SETS, comma-separated: ``mtbench`` (its 8 validation questions), ``explain``, ``code`` (8 validation requests each,
as cut-batch1/validate.py). Runs: ``ar``, ``sync`` (the defaults), ``sync+chat`` (a store of the answers to general
chat requests, ``data/qwen2.5-coder-chat-answers``), ``sync+all`` (those and the answers about functions,
``data/qwen2.5-coder-answers``); ``--runs`` names which of the last two run (default both).
"""
import sys
import time

import torch

import d3d
from bench.common import machine, print_runs_over_ar, runs_over_ar, write_json
from d3d.data.corpus import training_corpus
from d3d.data.prompts import mtbench_prompts
from d3d.decode.datastore import Datastore
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
from d3d.train.chat_data import chat_prompts

MTBENCH_VALIDATION = [6, 7, 8, 9, 61, 65, 71, 75]
STORES = {"chat": ["data/qwen2.5-coder-chat-answers"],
          "all": ["data/qwen2.5-coder-chat-answers", "data/qwen2.5-coder-answers"]}
torch.set_grad_enabled(False)
name, wanted, out_path = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 1
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)


def store(dirs: list[str]) -> Datastore:
    t = time.perf_counter()
    ds = d3d.load_datastore(dirs, target)  # the target's own answers (its real model's, another checkpoint too)
    print(f"store {'+'.join(dirs)}: {len(ds)} tokens in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return ds


runs = sys.argv[sys.argv.index("--runs") + 1].split(",") if "--runs" in sys.argv else ["chat", "all"]
specs = {"ar": "ar", "sync": "sync"} | {f"sync+{k}": d3d.SpecConfig(mode="sync", datastore=store(STORES[k]))
                                         for k in runs}
sets = {}
for s in wanted:
    if s in ("code", "explain"):
        sets[s] = chat_prompts(tok, training_corpus(path), 0.05, 8, "validation", seed=1234, templates=1,
                               explain=s == "explain")
    elif s == "mtbench":
        sets[s] = [tok.encode_chat([{"role": "user", "content": mtbench_prompts()[i]}]) for i in MTBENCH_VALIDATION]
    else:
        raise SystemExit(f"SETS: unknown set {s!r} (code, explain, mtbench)")
tok_s = {s: {r: [] for r in specs} for s in sets}
tau = {s: {r: [] for r in specs} for s in sets}
for rep in range(reps):
    for s, prompts in sets.items():
        for i, p in enumerate(prompts):
            outs = {}
            for r in (list(specs) if (i + rep) % 2 == 0 else list(specs)[::-1]):
                out = d3d.generate(target, p, max_new_tokens=128, spec=specs[r], drafter=drafter,
                                   stop_ids=tok.stop_token_ids())
                outs[r] = out.tokens[0]
                tok_s[s][r].append(out.stats.total_generated / out.stats.decode_seconds)
                tau[s][r].append(out.stats.tau)
            if any(o != outs["ar"] for o in outs.values()):
                raise SystemExit(f"{s} request {i}: an output differs from ar's")
            print(f"rep {rep + 1} {s} {i + 1}/{len(prompts)}", {r: round(v[-1], 1) for r, v in tok_s[s].items()},
                  file=sys.stderr, flush=True)
summary = {s: runs_over_ar(tok_s[s], tau[s]) for s in sets}
for s in sets:
    print_runs_over_ar(s, summary[s])
write_json(out_path, {"bench": "sync with a datastore of the target's answers, one sequence", "machine": machine(),
                      "model": name, "stores": STORES, "sets": {s: len(p) for s, p in sets.items()}, "reps": reps,
                      "new_tokens": 128, "decode_only": True, "summary": summary, "tok_s": tok_s, "tau": tau})
