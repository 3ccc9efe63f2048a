"""The committed answer stores (data/qwen2.5-coder-answers, the 0.5B's, and data/qwen2.5-coder-1.5b-answers):
what each holds is what its manifest says, and its requests are disjoint by content from every prompt a
choice or a reported figure is made on (the corpus's held-out functions: validation and evaluation
requests; HumanEval)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from d3d.assets import qwen3_tokenizer_dir
from d3d.data.corpus import find_corpus, read_texts
from d3d.data.prompts import humaneval_prompts
from d3d.model.tokenizer import load_tokenizer
from d3d.data.answers import read_manifest, sealed_answers
from d3d.train.chat_data import function_snippets

DATA = Path(__file__).resolve().parents[1] / "data"
STORES = ("qwen2.5-coder-answers", "qwen2.5-coder-1.5b-answers")  # the 0.5B's answers, the 1.5B's
# The one HumanEval sentence that occurs in a training function: a generic phrase
# (docs/results/qwen-drafter/more-data/README.md, "Disjoint from the evaluation prompts").
GENERIC = {"and return the result as a string"}


@pytest.fixture(scope="module", params=STORES)
def store(request):
    """(manifest, answers, the function snippet each request asks about). Qwen2.5 and the bundled
    Qwen3 tokenizer share their ids below 151,665 (the chat markers included), so it decodes them."""
    manifest, answers = read_manifest(DATA / request.param), sealed_answers(DATA / request.param)
    tok = load_tokenizer(qwen3_tokenizer_dir())
    code = []
    for a in answers:
        text = tok.decode(a.prompt)
        m = re.search(r"<\|im_start\|>user\n.*?```python\n(.*?)```<\|im_end\|>", text, re.S)
        assert m, f"not a chat request about a function: {text[:200]!r}"
        code.append(m.group(1))
    return manifest, answers, code


def test_the_store_holds_what_its_manifest_says(store):
    manifest, answers, _ = store
    assert len(answers) == sum(c["rows"] for c in manifest["chunks"]) > 0
    assert sum(map(len, (a.answer for a in answers))) == sum(c["answer_tokens"] for c in manifest["chunks"])
    assert all(0 < len(a.answer) <= manifest["gen_len"] for a in answers)
    assert len({tuple(a.prompt) for a in answers}) == len(answers)       # each request answered once
    kinds = {}
    for a in answers:
        kinds[a.kind] = kinds.get(a.kind, 0) + 1
    totals = {}
    for c in manifest["chunks"]:
        for k, n in c["kinds"].items():
            totals[k] = totals.get(k, 0) + n
    assert kinds == totals


def test_no_request_asks_about_a_held_out_function(store):
    """Validation requests (the τ monitor, checkpoint picks) and evaluation requests (reported
    code figures) are built from the held-out files' functions: none may be training data."""
    _, _, code = store
    held = {s.strip() for s in function_snippets(read_texts(find_corpus(None, 0.05).heldout))}
    assert held, "no held-out function found: the check would pass vacuously"
    assert not held & {c.strip() for c in code}


def test_no_request_contains_a_humaneval_sentence(store):
    _, _, code = store
    text = "\n".join(code)
    sentences = {s.strip() for p in humaneval_prompts() for s in re.split(r"[.\n!?]", p) if len(s.strip()) >= 30}
    assert len(sentences) > 100
    assert {s for s in sentences if s in text} <= GENERIC
