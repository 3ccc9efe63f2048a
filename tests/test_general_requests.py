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
