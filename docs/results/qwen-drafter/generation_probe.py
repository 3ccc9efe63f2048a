"""Why labels are the bottleneck here: the target's greedy chat answers per second at batches of
16, 64 and 128 requests (32 new tokens, prefill included, bf16 by the dtype policy), and how
many training-split standard-library functions there are to ask about.

    PYTHONPATH=. python docs/results/qwen-drafter/generation_probe.py TARGET_DIR  -> generation_probe.json
"""
import sys
import time
from pathlib import Path

import torch

import d3d
from d3d.data.corpus import find_corpus, read_texts
from d3d.files import write_json
from d3d.train.chat_data import chat_prompts, function_snippets

torch.set_num_threads(2)
target_dir = sys.argv[1]
target, tok = d3d.load_model(target_dir), d3d.load_tokenizer(target_dir)
snippets = function_snippets(read_texts(find_corpus(None, 0.05).train))
prompts = chat_prompts(tok, None, 0.05, 128, "train", seed=0)
rows = []
for batch in (16, 64, 128):
    t0 = time.perf_counter()
    out = d3d.generate(target, prompts[:batch], max_new_tokens=32, stop_ids=tok.stop_token_ids())
    seconds = time.perf_counter() - t0
    made = sum(map(len, out.tokens))
    rows.append({"batch": batch, "answer_tokens": made, "seconds": seconds, "tok_s": made / seconds,
                 "prefill_seconds": out.stats.prefill_seconds})
    print(rows[-1], flush=True)
write_json(Path(__file__).with_name("generation_probe.json"), {
    "target": target_dir, "dtype": str(target.dtype), "threads": torch.get_num_threads(),
    "train_functions": len(snippets), "distinct_train_functions": len(set(snippets)),
    "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts), "new_tokens": 32, "runs": rows})
