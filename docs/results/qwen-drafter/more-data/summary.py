"""What the answers cache of more-data/make_data.sh holds so far: rows, answer tokens, answers at the cap.

    PYTHONPATH=. python docs/results/qwen-drafter/more-data/summary.py OUT/data/chat-answers-KEY[.partial].pt OUT_JSON
"""
import sys

import torch

from d3d.files import write_json

STDLIB_ROWS, FIRST_RUN_ROWS, CAP = 5805, 5600, 160  # the standard library's training functions; make_data.sh's --gen-len

path, out = sys.argv[1:]
loaded = torch.load(path)
answers = [a for chunk in loaded for a in chunk] if path.endswith(".partial.pt") else loaded
parts = {"earlier runs' (rows 0-5,599)": answers[:FIRST_RUN_ROWS],
         "rest of the standard library (rows 5,600-5,804)": answers[FIRST_RUN_ROWS:STDLIB_ROWS],
         "other installed packages (rows 5,805-)": answers[STDLIB_ROWS:]}
summary = {"file": path.rsplit("/", 1)[-1], "rows": len(answers), "of": 11200,
           "answer_tokens": sum(map(len, answers)),
           "parts": {k: {"rows": len(v), "answer_tokens": sum(map(len, v)),
                         "mean_tokens": sum(map(len, v)) / max(1, len(v)),
                         "at_cap": sum(len(a) >= CAP for a in v)} for k, v in parts.items()}}
write_json(out, summary)
print(summary)
