"""Held-out prompts: validation and evaluation parts, and no window seen in training by content."""

import d3d
from d3d.assets import BUNDLED_TARGET, models_dir
from d3d.data.corpus import find_corpus
from d3d.data.prompts import heldout_prompts, seen_in

from test_train_target import make_corpus

LICENCE = "".join(f"# Licensed under the Example Licence, section {k}: you may not use this file except in "
                  f"compliance with the licence terms.\n" for k in range(12))


def test_windows_seen_in_training_are_dropped(tmp_path):
    """Held out by file is not held out by content: every file here starts with the same licence
    (half of each held-out file), and no evaluation window may contain a slice of it."""
    root = make_corpus(tmp_path / "corpus", n_files=40)
    for f in root.iterdir():
        f.write_text(LICENCE + f.read_text())
    corpus = find_corpus(root, 0.2)
    validation, evaluation = corpus.part("validation"), corpus.part("evaluation")
    assert validation and evaluation and not set(validation) & set(evaluation)
    assert set(validation) | set(evaluation) == set(corpus.heldout)
    tok = d3d.load_tokenizer(models_dir() / BUNDLED_TARGET)
    train_text = "\n".join(p.read_text() for p in corpus.train)
    for part in ("validation", "evaluation"):
        prompts = heldout_prompts(tok, str(root), 0.2, 24, 32, part=part)
        assert len(prompts) == 24
        texts = [tok.decode(p) for p in prompts]
        assert not any(seen_in(t, train_text) for t in texts)
        assert not any("Example Licence" in t for t in texts)


def test_multi_root_corpus_dedups_by_content_and_keeps_evaluation_packages_out(tmp_path):
    from d3d.data.corpus import multi_root_corpus

    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "pkg").mkdir(parents=True)
    for i in range(40):
        (a / "pkg" / f"m{i}.py").write_text(f"x_{i} = {i}\n")
    (b / "pkg" / "copy.py").write_text("x_7 = 7\n")  # the same content as a/pkg/m7.py
    (b / "numpy").mkdir()
    (b / "numpy" / "core.py").write_text("never_trained = 1\n")  # evaluation-only package
    corpus = multi_root_corpus([a, b], 0.2)
    files = corpus.train + corpus.heldout
    assert len(files) == 40 and b / "pkg" / "copy.py" not in files
    assert not any("numpy" in p.parts for p in files)
    assert set(corpus.part("validation")) | set(corpus.part("evaluation")) == set(corpus.heldout)


def test_code_prompts_come_from_the_targets_own_corpus(tmp_path):
    """A target records its --corpus in train_summary.json; the "code" set and the drafter trainers
    draw from that corpus's evaluation/validation files (another corpus's split may hold the
    target's training files). No summary: the standard library; an unreadable one: a named error."""
    import json

    import pytest

    from d3d.data.corpus import training_corpus
    from d3d.data.prompts import load_prompt_set

    root = make_corpus(tmp_path / "corpus", n_files=40)
    target = tmp_path / "target"
    target.mkdir()
    assert training_corpus(target) is None
    (target / "train_summary.json").write_text(json.dumps({"config": {"corpus": str(root)}}))
    assert training_corpus(target) == str(root)
    tok = d3d.load_tokenizer(models_dir() / BUNDLED_TARGET)
    texts = [tok.decode(p) for p in load_prompt_set("code", tok, 6, 24, corpus=training_corpus(target))]
    evaluation_text = "\n".join(p.read_text() for p in find_corpus(root, 0.05).part("evaluation"))
    assert all(t in evaluation_text for t in texts)
    (target / "train_summary.json").write_text("{not json")
    with pytest.raises(ValueError, match="train_summary.json"):
        training_corpus(target)


def test_a_summary_request_shows_the_modules_first_tokens():
    """``summary_request``: the module's source cut at ``tokens`` tokens, in one chat turn asking for a summary."""
    import textwrap

    from d3d.data.prompts import summary_request

    tok = d3d.load_tokenizer(models_dir() / BUNDLED_TARGET)
    short, long = summary_request(tok, "textwrap", 100), summary_request(tok, "textwrap", 400)
    assert len(short) < len(long) <= len(short) + 320
    text = tok.decode(long)
    source = open(textwrap.__file__).read()
    assert source[:200] in text and "Summarize what this code does." in text and source[-200:] not in text
