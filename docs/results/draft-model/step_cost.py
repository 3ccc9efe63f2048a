"""What a chain's step costs beside the 1.5B's: one decoding step of the 0.5B with its whole head, with its greedy head,
and with the chain's head (``chain_vocabulary``: the rows a ``ModelChain`` reads), and the 1.5B's step; medians of
40 steps after a 200-token context, three rounds (the machine's speed drifts between them). From the repository root:

    python docs/results/draft-model/step_cost.py
"""
import statistics
import time

import torch

import d3d
from d3d.decode.draft_model import chain_vocabulary
from d3d.draft.drafter import draft_head
from d3d.draft.pick import pick_drafter
from d3d.fetch import resolve_model

torch.set_grad_enabled(False)
small = d3d.load_model(resolve_model("qwen2.5-coder-0.5b"), weights="auto")
big = d3d.load_model(resolve_model("qwen2.5-coder-1.5b"), weights="auto")
_, drafter, _ = pick_drafter(big, "sync", None)
vocab = chain_vocabulary(big.cfg.vocab_size, drafter.vocab_map, min(big.cfg.eos_token_ids))
head = draft_head(small, vocab)
print(f"the chain's head: {vocab.numel()} of {big.cfg.vocab_size} rows")


def step_ms(model, greedy=False, head=None, n=40, context=200):
    cache = model.new_cache(1, context + n + 1)
    layout = cache.layout([context], [0])
    model(torch.randint(0, 1000, (context,)), layout, cache, logits_index=layout.last_token_index())
    times = []
    for i in range(n):
        t = time.perf_counter()
        layout = cache.layout([1], [0])
        logits = model(torch.tensor([i + 5]), layout, cache, logits_index=layout.last_token_index(), greedy=greedy,
                       head=head)[0].float()
        float(1.0 / torch.exp(logits - logits.max()).sum()), int(logits.argmax())  # what a chain's step reads
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


for r in range(3):
    full, greedy, chain, step = step_ms(small), step_ms(small, greedy=True), step_ms(small, head=head), step_ms(big)
    print(f"round {r}: 0.5B whole head {full:.2f} ms, greedy head {greedy:.2f} ms, the chain's head {chain:.2f} ms "
          f"({chain / step:.2f} of the 1.5B's step); the 1.5B's step {step:.2f} ms", flush=True)
