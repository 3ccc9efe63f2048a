"""Drop from the store the answers to requests about a function whose text is also in a held-out
file (2026-12-02: 8 answers, 4 functions, that tests/test_committed_answers.py caught; the standard
library has 4 such duplicates among its 5,601 training functions, and the request list now leaves
them out, d3d/train/chat_data.py: training_functions).

    PYTHONPATH=. python docs/results/answer-store/drop_heldout.py data/qwen2.5-coder-answers
"""
import re
import sys

from d3d.assets import qwen3_tokenizer_dir
from d3d.data.corpus import find_corpus, read_texts
from d3d.model.tokenizer import load_tokenizer
from d3d.data.answers import AnswerStore, read_manifest
from d3d.train.chat_data import function_snippets

root = sys.argv[1]
manifest = read_manifest(root)
store = AnswerStore(root, manifest["target"], manifest["gen_len"])
tok = load_tokenizer(qwen3_tokenizer_dir())  # Qwen2.5's ids below 151,665 decode alike
held = {s.strip() for s in function_snippets(read_texts(find_corpus(None, 0.05).heldout))}


def asks_about_held_out(answer) -> bool:
    code = re.search(r"```python\n(.*?)```<\|im_end\|>", tok.decode(answer.prompt), re.S).group(1)
    return code.strip() in held


print("dropped", store.drop(asks_about_held_out, "asks about a function whose text is also in a held-out file"))
