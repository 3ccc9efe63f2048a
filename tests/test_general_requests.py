"""General chat requests for the drafter's training (``d3d.train.general_requests``): deterministic, distinct, a
stream whose first requests do not depend on how many are asked, and disjoint from MT-Bench (the sets choices and
reports are made on): no topic of theirs and no run of five words is an MT-Bench question's, checked against the
committed hashes of MT-Bench's word n-grams, which a known MT-Bench phrase must hit."""

import json

import pytest

from d3d.data.prompts import mtbench_path
from d3d.train.general_requests import (LONGEST, SLOTS, TEMPLATES, general_requests, mtbench_ngrams, ngram_hash,
                                        ngram_hashes, words, write_mtbench_ngrams)


def texts(n):
    return [m[0]["content"] for m in general_requests(n)]


def test_a_stream_of_distinct_requests():
    first = texts(3000)
    assert len(set(first)) == 3000
    assert texts(40) == first[:40]  # a store grows by the requests after those it holds
    assert [m[0]["content"] for m in general_requests(40, seed=1)] != first[:40]
    assert all(m[0]["role"] == "user" for m in general_requests(5))
    used = {t.split("{")[0] for t in TEMPLATES}  # every template comes up
    assert all(any(r.startswith(u) for r in first) for u in used)


def test_disjoint_from_mtbench():
    mt = mtbench_ngrams()
    assert ngram_hash(words("write a captivating short story")) in mt  # the hashes are MT-Bench's
    assert ngram_hash(words("photography")) in mt
    for slot, values in SLOTS.items():
        for v in values:
            ws = words(v)
            ws = ws[1:] if ws[0] in ("a", "an", "the") else ws
            assert len(ws) <= LONGEST and ngram_hash(ws) not in mt, f"{slot} {v!r}: an MT-Bench topic"
    for r in texts(5000):
        shared = ngram_hashes(words(r), 5) & mt
        assert not shared, f"{r!r} shares a run of five words with an MT-Bench question"


def test_the_committed_hashes_are_mtbench_s(tmp_path):
    """Where the questions are here, the committed hashes are exactly what they give."""
    if not mtbench_path().is_file():
        pytest.skip("MT-Bench questions not fetched (python -m bench fetch-mtbench); the committed hashes stand")
    n = write_mtbench_ngrams(mtbench_path(), tmp_path / "h.xz")
    assert mtbench_ngrams(tmp_path / "h.xz") == mtbench_ngrams() and n == len(mtbench_ngrams())
    rows = [json.loads(line) for line in mtbench_path().read_text().splitlines() if line.strip()]
    assert len(rows) == 80


def test_the_committed_chat_store_asks_these_requests():
    """data/qwen2.5-coder-chat-answers: what its manifest says, each request answered once, and every request one of
    the stream's (so the checks above cover what the drafter trained on)."""
    import re
    from pathlib import Path

    from d3d.assets import qwen3_tokenizer_dir
    from d3d.data.answers import read_manifest, sealed_answers
    from d3d.model.tokenizer import load_tokenizer

    store = Path(__file__).resolve().parents[1] / "data" / "qwen2.5-coder-chat-answers"
    manifest, answers = read_manifest(store), sealed_answers(store)
    assert len(answers) == sum(c["rows"] for c in manifest["chunks"]) > 0
    assert sum(len(a.answer) for a in answers) == sum(c["answer_tokens"] for c in manifest["chunks"])
    assert all(a.kind == "chat" and 0 < len(a.answer) <= manifest["gen_len"] for a in answers)
    assert len({tuple(a.prompt) for a in answers}) == len(answers)
    tok, stream = load_tokenizer(qwen3_tokenizer_dir()), set(texts(len(answers) + 100))
    for a in answers:
        m = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", tok.decode(a.prompt), re.S)
        assert m and m.group(1) in stream, tok.decode(a.prompt)[:200]
