"""How often the 0.5B's greedy token is the 1.5B's along the 1.5B's own greedy answers (teacher-forced: one 0.5B pass
over request + answer), with every id, or its argmax taken over some ids only: the block drafter's drafting
vocabulary (16,384), the 32,768 ids most frequent in the answer stores of data/, the lowest 16K-48K ids with the
special ones (Qwen2.5's BPE ids run in merge order). Validation requests. Run from the repository root:

    python docs/results/draft-model/agreement.py SETS        (SETS comma-separated, as bench.common.request_sets)
"""
import sys

import torch

import d3d
from bench.common import request_sets
from d3d.data.answers import sealed_answers
from d3d.decode.draft_model import chain_vocabulary
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model
torch.set_grad_enabled(False)
p15, p05 = resolve_model("qwen2.5-coder-1.5b"), resolve_model("qwen2.5-coder-0.5b")
big, small = d3d.load_model(p15, weights="auto"), d3d.load_model(p05, weights="auto")
tok = d3d.load_tokenizer(p15)
_, drafter, _ = pick_drafter(big, "sync", None)
V = big.cfg.vocab_size
counts = torch.zeros(V, dtype=torch.long)
for store in ("data/qwen2.5-coder-answers", "data/qwen2.5-coder-chat-answers", "data/qwen2.5-coder-1.5b-answers"):
    for a in sealed_answers(store):
        counts += torch.bincount(torch.tensor(a.answer, dtype=torch.long), minlength=V)
print("distinct ids in the stores", int((counts > 0).sum()))
vocabs = {"full": None, "drafter16k": drafter.vocab_map,
          "chain": chain_vocabulary(V, drafter.vocab_map, min(big.cfg.eos_token_ids))}  # what ModelChain reads
vocabs["stores32k"] = counts.topk(32768).indices.sort().values
special = torch.arange(151643, V)
for k in (16384, 24576, 32768, 49152):
    vocabs[f"low{k // 1024}k"] = torch.cat([torch.arange(k), special])
print("store tokens covered by low ids:", {k: round(float(counts[:k].sum() + counts[151643:].sum()) / float(counts.sum()), 4) for k in (16384, 24576, 32768, 49152)})
for s, prompts in request_sets(tok, p15, sys.argv[1].split(",")).items():
    tot = {v: [0, 0] for v in vocabs}
    for p in prompts:
        ans = d3d.generate(big, p, max_new_tokens=128, spec="ar", stop_ids=tok.stop_token_ids()).tokens[0]
        lg = small(torch.tensor([p + ans]))[0, len(p) - 1: len(p) + len(ans) - 1].float()
        want = torch.tensor(ans)
        for v, vm in vocabs.items():
            pred = lg.argmax(-1) if vm is None else vm[lg[:, vm].argmax(-1)]
            tot[v][0] += int((pred == want).sum()); tot[v][1] += len(ans)
    print(s, {v: round(a / n, 3) for v, (a, n) in tot.items()}, flush=True)
