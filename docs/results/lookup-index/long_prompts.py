"""Decoding (prefill excluded: ~6 s a prompt here) with sync's defaults (``lookup=3``) on requests with long prompts,
the context lookup by scan (as before ``NgramIndex``) against the index, taking turns; batch 1 and 4; 256 tokens;
every output equal; decoded tokens per second of decoding. Each prompt shows a
standard-library module (~2,000 tokens) and asks for a summary of it.

    PYTHONPATH=. python docs/results/lookup-index/long_prompts.py MODEL REPS OUT.json
"""
import statistics
import sys

import torch

import d3d
from bench.common import machine, write_json
from d3d.decode import sources
from d3d.decode.lookup import lookup_copy
from d3d.data.prompts import summary_request
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model

torch.set_grad_enabled(False)
NEW = 256
name, reps, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
path = resolve_model(name)
target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
_, drafter, _ = pick_drafter(target, "sync", None)
prompts = [summary_request(tok, m) for m in ("argparse", "textwrap", "difflib", "shlex")]
indexed = sources.ContextLookup.propose


def scanned(self, seq, max_len):
    found = lookup_copy(seq.tokens, self.min_ngram, max_len)
    return None if found is None else sources.Draft(found.tokens, found.confidence, [], [])


results = {}
for batch in (1, 4):
    groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    for rep in range(reps):
        for g, group in enumerate(groups):
            order = ("scan", "index") if (rep + g) % 2 == 0 else ("index", "scan")
            outs = {}
            for way in order:
                sources.ContextLookup.propose = scanned if way == "scan" else indexed
                out = d3d.generate(target, group, max_new_tokens=NEW, spec="sync", drafter=drafter,
                                   stop_ids=tok.stop_token_ids())
                results.setdefault(f"batch {batch}", {}).setdefault(way, []).append(
                    out.stats.total_generated / out.stats.decode_seconds)
                outs[way] = out.tokens
            assert outs["scan"] == outs["index"], "outputs differ"
        print(batch, rep, {k: round(statistics.median(v), 1) for k, v in results[f"batch {batch}"].items()},
              file=sys.stderr, flush=True)
sources.ContextLookup.propose = indexed
summary = {b: {"tok_s": {k: round(statistics.median(v), 2) for k, v in r.items()},
               "index_over_scan": round(statistics.median(i / s for i, s in zip(r["index"], r["scan"])), 3)}
           for b, r in results.items()}
print(summary)
write_json(out_path, {"bench": "long prompts, lookup by scan and by index", "machine": machine(), "model": name,
                      "prompt_tokens": [len(p) for p in prompts], "max_new_tokens": NEW, "summary": summary,
                      "runs": results})
