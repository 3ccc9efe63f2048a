"""How far a copy holds, by request class: the target's greedy answers to N validation code and N validation explain
requests; at every position where the context repeats after a short match (lookup 3, a match under LONG tokens), the
chance that copied token k is right given the ones before were, against ``d3d.decode.lookup.SHORT_MATCH`` (measured
on rounds of the answer store's answers). Every position, not only round starts.

    python docs/results/copy-length/by_class.py qwen2.5-coder-0.5b 16
"""
import sys, torch
import d3d
from d3d.data.corpus import training_corpus
from d3d.train.chat_data import chat_prompts
from d3d.decode.lookup import lookup_copy, LONG, SHORT_MATCH
from d3d.fetch import resolve_model
torch.set_num_threads(2)
path = resolve_model(sys.argv[1]); n = int(sys.argv[2])
tok = d3d.load_tokenizer(str(path)); target = d3d.load_model(str(path), weights="auto")
stops = sorted(set(tok.stop_token_ids()) | set(target.cfg.eos_token_ids))
for setname in ("code", "explain"):
    prompts = chat_prompts(tok, training_corpus(path), 0.05, n, "validation", seed=1234, templates=1, explain=setname == "explain")
    outs = d3d.generate(target, prompts, max_new_tokens=128, stop_ids=stops).tokens
    reach = [0] * 15; ok = [0] * 15
    for p, o in zip(prompts, outs):
        ctx = list(p) + o
        for i in range(len(p), len(ctx) - 1):
            c = lookup_copy(ctx[:i + 1], 3, 15)
            if c is None or c.match >= LONG: continue
            for k, t in enumerate(c.tokens):
                if i + 1 + k >= len(ctx): break
                reach[k] += 1
                if t != ctx[i + 1 + k]: break
                ok[k] += 1
    print(setname, " ".join(f"{ok[k] / reach[k]:.2f}({reach[k]})" for k in range(6) if reach[k]), "| table", SHORT_MATCH[:6], flush=True)
