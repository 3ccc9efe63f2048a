"""Where a sync generation's time goes: prefill, verification, drafting, the rest (2 validation chat
requests x 128 tokens, fp32), then a cProfile of a third request by internal time.

    python docs/results/copy-length/overhead.py TARGET_DIR > docs/results/copy-length/overhead.txt
"""
import sys, time, cProfile, pstats, d3d
from d3d.data.corpus import training_corpus
from d3d.train.chat_data import chat_prompts
from d3d.model.tokenizer import load_tokenizer
T = sys.argv[1]
target = d3d.load_model(T, dtype="float32")
drafter = d3d.load_drafter("models/d3d-drafter-qwen2.5-coder-0.5b", target=target)
tok = load_tokenizer(T)
prompts = chat_prompts(tok, training_corpus(T), 0.05, 3, "validation", seed=1234, templates=1)
d3d.generate(target, [1, 2, 3], max_new_tokens=8, spec="sync", drafter=drafter, stop_ids=[])
stops = tok.stop_token_ids()
for p in prompts[:2]:
    t = time.perf_counter()
    out = d3d.generate(target, p, max_new_tokens=128, spec="sync", drafter=drafter, stop_ids=stops)
    dt = time.perf_counter() - t
    s = out.stats
    print(f"prompt {len(p)} tok: total {dt:.2f} s, prefill {s.prefill_seconds:.2f}, verify {s.verify_seconds:.2f}, draft {s.draft_seconds:.2f}, rounds {s.rounds}, other {dt - s.prefill_seconds - s.verify_seconds - s.draft_seconds:.2f}")
pr = cProfile.Profile()
pr.enable()
d3d.generate(target, prompts[2], max_new_tokens=128, spec="sync", drafter=drafter, stop_ids=stops)
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
