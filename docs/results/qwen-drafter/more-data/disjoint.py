"""Are the evaluation prompts disjoint by content from every function more-data/ could ask about?

For each HumanEval prompt: its function names (``def NAME(``) and its docstring sentences of >= 30
characters; for each MT-Bench first turn: its sentences of >= 30 characters. A hit is a training
snippet (the standard library's training functions + the other packages' functions: a superset of
the 11,200 and the 16,800 requests) that defines a function of the same name or contains such a sentence.

    PYTHONPATH=. python docs/results/qwen-drafter/more-data/disjoint.py OUT_JSON
"""
import re
import sys

from d3d.data.corpus import find_corpus, read_texts
from d3d.files import write_json
from d3d.data.prompts import humaneval_prompts, mtbench_prompts
from d3d.train.chat_data import extra_train_snippets, function_snippets


def sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"[.\n!?]", text) if len(s.strip()) >= 30]


corpus = find_corpus(None, 0.05)
own = function_snippets(read_texts(corpus.train))
snippets = own + extra_train_snippets(corpus, 0.05, set(own), 0)
defined = {m for s in snippets for m in re.findall(r"def\s+(\w+)\s*\(", s)}
humaneval, mtbench = humaneval_prompts(), mtbench_prompts()
hits = {"humaneval_names": [], "humaneval_sentences": [], "mtbench_sentences": []}
for p in humaneval:
    hits["humaneval_names"] += [n for n in re.findall(r"def\s+(\w+)\s*\(", p) if n in defined]
    hits["humaneval_sentences"] += [s for s in sentences(p) if any(s in t for t in snippets)]
for q in mtbench:
    hits["mtbench_sentences"] += [s for s in sentences(q) if any(s in t for t in snippets)]
summary = {"training_snippets": len(snippets), "humaneval_prompts": len(humaneval),
           "mtbench_prompts": len(mtbench), "hits": hits}
write_json(sys.argv[1], summary)
print(summary)
