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


def test_answers_stop_after_minutes_and_go_on_where_they_stopped(tmp_path, monkeypatch):
    """``--data-minutes``: generation ends at the first batch boundary past the budget with the
    answers saved, and the next call makes only the rest; the whole equals one uninterrupted run."""
    import torch

    import d3d.train.common as common
    from d3d.engines import generate
    from test_engines import tiny_target

    target = tiny_target()
    prompts = [[1 + i, 2 + i, 3] for i in range(5)]

    def answers(partial, minutes):
        chunks = common.resumable_chunks(partial, 5, 2, lambda i, j: generate(target, prompts[i:j], 6, stop_ids=[]).tokens,
                                         "answers", "tok", lambda rows: sum(map(len, rows)), minutes, lambda *_: None)
        return [a for rows in chunks for a in rows]

    whole = answers(tmp_path / "whole.pt", None)
    assert [len(a) for a in whole] == [6] * 5

    clock = iter(range(0, 10_000, 40))  # every read of the clock is 40 s later: one batch fits in a minute
    monkeypatch.setattr(common.time, "perf_counter", lambda: next(clock))
    partial = tmp_path / "answers.partial.pt"
    first = answers(partial, 1.0)
    assert len(first) == 2 and torch.load(partial) == [first]
    monkeypatch.undo()
    rest = answers(partial, None)
    assert rest == whole and sum(torch.load(partial), []) == whole


def test_drafting_vocabulary_is_kept_when_a_run_resumes(tmp_path):
    """The head rows a run trains follow its first vocabulary: a resumed run whose data has grown
    must not re-rank the ids."""
    import torch

    from d3d.train.drafter import drafting_vocabulary

    path, quiet = tmp_path / "draft_vocab.pt", (lambda *_: None)
    first = drafting_vocabulary(torch.tensor([[3, 3, 5, 5, 7]]), torch.ones(1, 5), 2, 10, path, False, quiet)
    grown = torch.tensor([[3, 3, 5, 5, 7, 7, 7, 7]])  # re-ranked, the ids would be [3, 7]
    assert first.tolist() == [3, 5]
    assert drafting_vocabulary(grown, torch.ones(1, 8), 2, 10, path, True, quiet).tolist() == [3, 5]
    assert drafting_vocabulary(grown, torch.ones(1, 8), 2, 10, path, False, quiet).tolist() == [3, 7]
    with pytest.raises(ValueError, match="--draft-vocab=3"):
        drafting_vocabulary(grown, torch.ones(1, 8), 3, 10, path, True, quiet)


def test_chat_validation_and_evaluation_requests_are_disjoint(qwen3_tok):
    """A trainer's τ monitor (validation) and the reported figures (evaluation) never share a
    held-out function."""
    from d3d.train.chat_data import chat_prompts

    val = chat_prompts(qwen3_tok, None, 0.05, 16, "validation", seed=1234, templates=1)
    ev = chat_prompts(qwen3_tok, None, 0.05, 16, "evaluation", seed=1234, templates=1)
    assert len(val) == len(ev) == 16 and not {tuple(p) for p in val} & {tuple(p) for p in ev}


def test_explain_requests_ask_for_prose_about_the_same_validation_functions(qwen3_tok):
    """``explain=True``: the validation functions asked about in prose (bench's --sets explain), no
    function of the evaluation split among them."""
    from d3d.prompts import EXPLAIN_TEMPLATE
    from d3d.train.chat_data import chat_prompts

    code = [qwen3_tok.decode(p) for p in chat_prompts(qwen3_tok, None, 0.05, 4, "validation", seed=1234, templates=1)]
    prose = [qwen3_tok.decode(p) for p in chat_prompts(qwen3_tok, None, 0.05, 4, "validation", seed=1234,
                                                       templates=1, explain=True)]
    ev = {qwen3_tok.decode(p).split("```python")[1]
          for p in chat_prompts(qwen3_tok, None, 0.05, 16, "evaluation", seed=1234, templates=1)}
    for c, p in zip(code, prose):
        assert EXPLAIN_TEMPLATE.split("\n")[0] in p and "Complete the following" not in p
        assert c.split("```python")[1] == p.split("```python")[1] and p.split("```python")[1] not in ev
