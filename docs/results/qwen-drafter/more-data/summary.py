"""What the answers cache of more-data/make_data.sh holds so far: rows, answer tokens, answers at the cap,
and how many functions there are to ask about (the standard library's training split, the other packages').

    PYTHONPATH=. python docs/results/qwen-drafter/more-data/summary.py OUT/data/chat-answers-KEY[.partial].pt OUT_JSON [N_SEQUENCES]

N_SEQUENCES: make_data.sh's (default 11200), the number of requests the cache is for.
"""
import sys

import torch

from d3d.data.corpus import find_corpus, read_texts
from d3d.files import write_json
from d3d.train.chat_data import extra_train_snippets, function_snippets

FIRST_RUN_ROWS, CAP = 5600, 160  # make_data.sh: the earlier runs' --n-sequences, --gen-len

path, out = sys.argv[1:3]
requests = int(sys.argv[3]) if len(sys.argv) > 3 else 11200
loaded = torch.load(path)
answers = [a for chunk in loaded for a in chunk] if path.endswith(".partial.pt") else loaded
corpus = find_corpus(None, 0.05)
own = function_snippets(read_texts(corpus.train))
n_own, n_extra = len(own), len(extra_train_snippets(corpus, 0.05, set(own), 0))
parts = {"earlier runs'": answers[:FIRST_RUN_ROWS],
         "rest of the standard library": answers[FIRST_RUN_ROWS:n_own],
         "other installed packages": answers[n_own:]}
summary = {"file": path.rsplit("/", 1)[-1], "rows": len(answers), "of": requests,
           "answer_tokens": sum(map(len, answers)),
           "stdlib_training_functions": n_own, "other_packages_functions": n_extra,
           "parts": {k: {"rows": len(v), "answer_tokens": sum(map(len, v)),
                         "mean_tokens": sum(map(len, v)) / max(1, len(v)),
                         "at_cap": sum(len(a) >= CAP for a in v)} for k, v in parts.items()}}
write_json(out, summary)
print(summary)
