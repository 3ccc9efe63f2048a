"""Chat-format drafter training data: snippets, windows, prompts, mask-token choice."""

from __future__ import annotations

import pytest

from d3d.assets import qwen3_tokenizer_dir
from d3d.prompts import CHAT_TEMPLATES, code_request, load_prompt_set
from d3d.train.chat_data import function_snippets, to_windows
from d3d.tokenizer import load_tokenizer
from d3d.train.drafter import pick_mask_id


@pytest.fixture(scope="module")
def qwen3_tok():
    return load_tokenizer(qwen3_tokenizer_dir())

SOURCE = '''
import os

def plain(a):
    return a

@decorator
def documented(x, y=1):
    """Add x and y.

    A second paragraph long enough to pass the length filter.
    """
    return x + y

class K:
    async def method(self):
        """Wait for something to happen, then return it."""
        return 1
'''


def test_function_snippets_cut_header_and_docstring():
    snippets = function_snippets([SOURCE, "def broken(:\n"])
    assert len(snippets) == 2  # no docstring -> skipped; syntax errors -> skipped
    assert snippets[0].startswith("@decorator\ndef documented(x, y=1):\n") and snippets[0].rstrip().endswith('"""')
    assert "return x + y" not in snippets[0]
    assert snippets[1].startswith("async def method(self):")  # dedented out of the class


def test_to_windows_keeps_the_tail_and_masks_the_answer():
    ids, mask = to_windows([[1, 2, 3], [4] * 10], [[7, 8], [9, 9, 9]], window=8, pad_id=0)
    assert ids[0].tolist() == [1, 2, 3, 7, 8, 0, 0, 0] and mask[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    assert ids[1].tolist() == [4] * 5 + [9] * 3 and mask[1].tolist() == [0] * 5 + [1] * 3


def test_code_request_and_chat_prompt_sets(qwen3_tok):
    msg = code_request("def f():\n    pass")
    assert msg == [{"role": "user", "content": CHAT_TEMPLATES[0].format(code="def f():\n    pass\n")}]
    chat = load_prompt_set("humaneval", qwen3_tok, 2, chat=True)
    raw = load_prompt_set("humaneval", qwen3_tok, 2)
    text = qwen3_tok.decode(chat[0])
    assert text.startswith("<|im_start|>user\nComplete the following Python function:") and text.endswith(
        "<|im_start|>assistant\n")
    assert qwen3_tok.decode(raw[0]) in text
    with pytest.raises(ValueError, match="raw text"):
        load_prompt_set("code", qwen3_tok, 2, chat=True)


def test_pick_mask_id(qwen3_tok):
    assert pick_mask_id(qwen3_tok, 151936) == 151669  # first row past the tokenizer's ids
    assert pick_mask_id(qwen3_tok, 151936, asked=5) == 5
    with pytest.raises(ValueError, match="--mask-token-id=200000"):
        pick_mask_id(qwen3_tok, 151936, asked=200000)
    with pytest.raises(ValueError, match="no spare embedding row"):
        pick_mask_id(qwen3_tok, 151669)
