"""Offline probe behind ``d3d.decode.lookup``: in the rounds the shipped Qwen drafter actually ran (sync,
P = 0.02, 2 leaves, 8 validation chat requests, 128 tokens), how many tokens would a chain copied
from the context have had accepted instead? An upper-bound estimate: with copied chains the rounds
would fall differently (a long copy consumes in one round what several drafter rounds did).

    PYTHONPATH=. python docs/results/lookup/offline_probe.py TARGET_DIR > docs/results/lookup/offline_probe.txt
"""

import collections
import sys

import d3d
from d3d.decode.lookup import lookup_chain
from d3d.train.chat_data import chat_prompts

target_dir = sys.argv[1]
target, tok = d3d.load_model(target_dir), d3d.load_tokenizer(target_dir)
drafter = d3d.load_drafter("models/d3d-drafter-qwen2.5-coder-0.5b", target=target)
prompts = chat_prompts(tok, None, 0.05, 8, "validation", seed=0)
rules = [(n, cap) for n in (1, 2, 3, 4) for cap in (6, 10, 15)]
total, rounds = collections.Counter(), 0
for p in prompts:
    info = []
    out = d3d.generate(target, p, max_new_tokens=128, stop_ids=tok.stop_token_ids(), spec="sync verify_min_prob=0.02 leaves=2 lookup=0",
                       drafter=drafter, on_round=info.append)
    final = p + out.tokens[0]
    ctx = list(p) + [out.tokens[0][0]]
    for r in info:
        truth = final[len(ctx):]
        rounds += 1
        total["drafter"] += r.accepted + 1
        for n, cap in rules:
            chain = lookup_chain(ctx, n, cap, max_ngram=n)  # exactly n, as first probed
            if chain:
                a = next((k for k, (x, y) in enumerate(zip(chain, truth)) if x != y), min(len(chain), len(truth)))
                total[n, cap] += a + 1
                total["used", n, cap] += 1
            else:
                total[n, cap] += r.accepted + 1
        ctx += r.committed
print(f"{rounds} rounds; drafter's τ {total['drafter'] / rounds:.2f}")
for n, cap in rules:
    print(f"match of {n} tokens, chain <= {cap}: τ {total[n, cap] / rounds:.2f} "
          f"(copied in {total['used', n, cap] / rounds:.0%} of rounds)")
