"""What verify_min_prob="auto" measured: per validation request (2 code, 2 explanation requests, fp32),
the threshold of every 8th round and the final estimates of b (seconds per verified row) and R (tok/s).

    python docs/results/copy-length/price_probe.py TARGET_DIR > docs/results/copy-length/price_probe.txt
"""
import sys, torch, d3d
import d3d.decode.speculative as sp
from d3d.data.corpus import training_corpus
from d3d.train.chat_data import chat_prompts
from d3d.model.tokenizer import load_tokenizer
T = sys.argv[1]
target = d3d.load_model(T, dtype="float32")
drafter = d3d.load_drafter("models/d3d-drafter-qwen2.5-coder-0.5b", target=target)
tok = load_tokenizer(T)
corpus = training_corpus(T)
inst = []
class Keep(sp.RowPrice):
    def __init__(s, *a, **k):
        super().__init__(*a, **k); inst.append(s)
sp.RowPrice = Keep
for explain in (False, True):
    prompts = chat_prompts(tok, corpus, 0.05, 2, "validation", seed=1234, templates=1, explain=explain)
    for p in prompts:
        rounds = []
        out = d3d.generate(target, p, max_new_tokens=128, spec="sync verify_min_prob=auto", drafter=drafter, on_round=rounds.append)
        pr = inst[-1]
        ps = [round(r.min_prob, 3) for r in rounds]
        print(f"explain={explain} rounds {len(rounds)} tau {out.stats.tau:.2f}; min_prob every 8th {ps[::8]}; b {pr.seconds_per_row()*1000:.2f} ms R {pr.rate():.1f} tok/s")
