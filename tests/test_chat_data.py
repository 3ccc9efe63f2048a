"""Chat-format drafter training data: snippets, windows, prompts, mask-token choice."""

from __future__ import annotations

import pytest

from d3d.assets import qwen3_tokenizer_dir
from d3d.data.prompts import CHAT_TEMPLATES, code_request, load_prompt_set
from d3d.train.chat_data import function_snippets, to_windows
from d3d.model.tokenizer import load_tokenizer
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
    from d3d.decode.engines import generate
    from test_engines import tiny_target

    target = tiny_target()
    prompts = [[1 + i, 2 + i, 3] for i in range(5)]

    def answers(partial, minutes):
        chunks = common.resumable_chunks(partial, 5, 2, lambda i, j: generate(target, prompts[i:j], max_new_tokens=6, stop_ids=[]).tokens,
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
    from d3d.data.prompts import EXPLAIN_TEMPLATE
    from d3d.train.chat_data import chat_prompts

    code = [qwen3_tok.decode(p) for p in chat_prompts(qwen3_tok, None, 0.05, 4, "validation", seed=1234, templates=1)]
    prose = [qwen3_tok.decode(p) for p in chat_prompts(qwen3_tok, None, 0.05, 4, "validation", seed=1234,
                                                       templates=1, explain=True)]
    ev = {qwen3_tok.decode(p).split("```python")[1]
          for p in chat_prompts(qwen3_tok, None, 0.05, 16, "evaluation", seed=1234, templates=1)}
    for c, p in zip(code, prose):
        assert EXPLAIN_TEMPLATE.split("\n")[0] in p and "Complete the following" not in p
        assert c.split("```python")[1] == p.split("```python")[1] and p.split("```python")[1] not in ev


def _function(name: str) -> str:
    return f'def {name}(x):\n    """Return {name} of x, a docstring long enough to keep."""\n'


def _write_split(root, names, heldout_fraction, want_heldout):
    """Write one file per function under ``root``, renaming files until the path split puts
    exactly the functions in ``want_heldout`` on the held-out side."""
    from d3d.data.corpus import is_heldout

    root.mkdir()
    for name in names:
        k = 0
        while is_heldout(f"{name}_{k}.py", heldout_fraction) != (name in want_heldout):
            k += 1
        (root / f"{name}_{k}.py").write_text(_function(name) + "    return x\n")


def _write_train_file(root, stem, names, heldout_fraction):
    """A ``python-sources``-style file (split by a hash of its content) that lands in the train split."""
    import hashlib

    from d3d.data.corpus import is_heldout

    body = "".join(_function(n) + "    return x\n\n" for n in names)
    k = 0
    while is_heldout(hashlib.sha1(f"# {k}\n{body}".encode()).hexdigest(), heldout_fraction):
        k += 1
    (root / f"{stem}.py").write_text(f"# {k}\n{body}")


def test_extra_functions_come_from_other_sources_and_never_from_held_out_text(tmp_path, monkeypatch, qwen3_tok):
    """``--extra-functions``: past the corpus's training functions the requests ask about other
    packages' functions (their training split); a copy of a function the corpus holds out never
    becomes one, the first requests are those without the option, and held-out splits refuse it."""
    import d3d.train.chat_data as chat_data
    from d3d.data.corpus import PYTHON_SOURCES, find_corpus, multi_root_corpus

    frac = 0.3
    corpus, other = tmp_path / "corpus", tmp_path / "other"
    _write_split(corpus, ["alpha", "beta", "gamma", "delta", "held_a", "held_b"], frac, {"held_a", "held_b"})
    other.mkdir()
    _write_train_file(other, "pkg_one", ["omega", "held_a"], frac)   # vendored copy of a held-out function
    _write_train_file(other, "pkg_two", ["sigma", "alpha"], frac)    # and of a training one
    real = find_corpus
    monkeypatch.setattr(chat_data, "find_corpus", lambda root, f=0.05: multi_root_corpus([corpus, other], f)
                        if str(root) == PYTHON_SOURCES else real(root, f))
    c = real(corpus, frac)
    own = chat_data.function_snippets(chat_data.read_texts(c.train))
    extra = chat_data.extra_train_snippets(c, frac, set(own), seed=0)
    assert sorted(s.split("(")[0] for s in extra) == ["def omega", "def sigma"]

    def names(n, **kw):
        return [next(w for w in qwen3_tok.decode(p).split() if w.startswith(("alpha", "beta", "gamma", "delta", "held",
                                                                              "omega", "sigma")))
                for p in chat_data.chat_prompts(qwen3_tok, str(corpus), frac, n, "train", seed=3, **kw)]

    plain, more = names(6), names(6, extra_functions=True)
    assert more[:4] == plain[:4] and sorted(plain[:4]) == sorted(["alpha(x):", "beta(x):", "gamma(x):", "delta(x):"])
    assert plain[4:] == plain[:2]                                   # without the option: repeats
    assert sorted(more[4:]) == ["omega(x):", "sigma(x):"]           # with it: new functions first
    assert not any(n.startswith("held") for n in more)
    with pytest.raises(ValueError, match="train split"):
        chat_data.chat_prompts(qwen3_tok, str(corpus), frac, 2, "validation", extra_functions=True)


class _Tok:
    def stop_token_ids(self):
        return []

    def token_id(self, _):
        return 0


def _store_setup(monkeypatch, n_prompts=7):
    """A tiny target, ``n_prompts`` fixed requests and a record of the batch sizes generated."""
    import d3d.train.chat_data as chat_data
    from test_engines import tiny_target

    target = tiny_target()
    requests = [("code", [1 + i, 2 + i, 3]) for i in range(n_prompts)]
    monkeypatch.setattr(chat_data, "chat_requests", lambda tok, root, frac, n, *a, **k: requests[:n])
    batches, real = [], chat_data.generate_continuous
    monkeypatch.setattr(chat_data, "generate_continuous", lambda t, p, n, **kw: batches.append(len(p)) or real(t, p, n, **kw))

    def make(n, store, gen_len=6, **kw):
        batches.clear()
        return chat_data.make_chat_training_data(target, _Tok(), None, 0.05, n, gen_len, 16, 0, store, batch=2,
                                                 log=lambda *_: None, **kw)
    return make, batches


def test_answering_says_how_far_it_is_inside_a_batch(tmp_path, monkeypatch):
    """A batch of answers takes minutes on a real target: a progress line every PROGRESS_EVERY answers in it."""
    import d3d.train.chat_data as chat_data
    from test_engines import tiny_target

    requests = [("code", [1 + i, 2 + i, 3]) for i in range(5)]
    monkeypatch.setattr(chat_data, "chat_requests", lambda tok, root, frac, n, *a, **k: requests[:n])
    monkeypatch.setattr(chat_data, "PROGRESS_EVERY", 2)
    lines = []
    chat_data.make_chat_training_data(tiny_target(), _Tok(), None, 0.05, 5, 6, 16, 0, tmp_path / "store", batch=5,
                                      log=lines.append)
    inside = [line for line in lines if "this batch" in line]
    assert [line.split(" (")[0] for line in inside] == ["target answers: 2/5", "target answers: 4/5"], lines
    assert any(line.startswith("target answers: 5/5") for line in lines)  # the batch's own line


def test_the_answer_store_grows_by_sealed_chunks_and_refuses_another_target(tmp_path, monkeypatch):
    """Growing --n-sequences answers only the new requests (a second chunk); the rows equal a fresh
    store's; the chunks hold what the manifest says; another answer cap is refused, not mixed."""
    import json

    import torch

    from d3d.data.answers import AnswerStore, read_chunk

    make, batches = _store_setup(monkeypatch)
    store = tmp_path / "a"
    with pytest.raises(ValueError, match="no answers to train on"):
        make(4, store, minutes=0)
    small = make(4, store)
    assert batches == [2, 2]
    assert torch.equal(make(7, store, minutes=0)[0], small[0]) and batches == []   # --data-minutes 0: as stored
    big = make(7, store)
    assert batches == [2, 1]                      # rows 4..6 only
    assert make(7, store) and batches == []       # nothing left to answer
    fresh = make(7, tmp_path / "b")
    assert batches == [2, 2, 2, 1]
    assert torch.equal(big[0], fresh[0]) and torch.equal(big[1], fresh[1]) and torch.equal(big[0][:4], small[0])
    manifest = json.loads((store / "manifest.json").read_text())
    assert [(c["file"], c["rows"], c["kinds"]) for c in manifest["chunks"]] == [
        ("answers-00000.json.xz", 4, {"code": 4}), ("answers-00001.json.xz", 3, {"code": 3})]
    rows = read_chunk(store / "answers-00001.json.xz")
    assert [r.prompt for r in rows] == [[5, 6, 3], [6, 7, 3], [7, 8, 3]] and all(len(r.answer) == 6 for r in rows)
    assert sum(c["answer_tokens"] for c in manifest["chunks"]) == 42
    assert (store / ".gitignore").read_text().startswith("pending.pt")
    assert AnswerStore(store, manifest["target"], 6).drop(lambda a: a.prompt == [6, 7, 3], "a test") == 1
    manifest = json.loads((store / "manifest.json").read_text())
    assert (manifest["chunks"][1]["rows"], manifest["chunks"][1]["dropped"], manifest["chunks"][1]["why"]) == (2, 1, "a test")
    assert [r.prompt for r in read_chunk(store / "answers-00001.json.xz")] == [[5, 6, 3], [7, 8, 3]]
    assert manifest["chunks"][0]["rows"] == 4 and "dropped" not in manifest["chunks"][0]
    with pytest.raises(ValueError, match="capped at 6 tokens.*capped at 5"):
        make(7, store, gen_len=5)
    (store / "answers-00001.json.xz").write_bytes(b"not xz")
    with pytest.raises(ValueError, match="answers-00001.json.xz: not a readable answer chunk"):
        make(7, store)


def test_a_killed_calls_answers_are_sealed_by_the_next_call(tmp_path, monkeypatch):
    """Answers kept after each batch survive a kill: the next call seals them first and answers
    only the rest, so the store ends as one uninterrupted call's (no answer lost or doubled)."""
    import torch

    import d3d.train.common as common

    make, batches = _store_setup(monkeypatch)
    calls = {"n": 0}
    real = common.save_atomic

    def killed_after_two_batches(obj, path):
        real(obj, path)
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # the job is killed right after its second batch was saved

    monkeypatch.setattr(common, "save_atomic", killed_after_two_batches)
    with pytest.raises(KeyboardInterrupt):
        make(7, tmp_path / "a")
    monkeypatch.setattr(common, "save_atomic", real)
    assert (tmp_path / "a" / "pending.pt").is_file()
    resumed = make(7, tmp_path / "a")
    assert batches == [2, 1]                      # 4 answers were pending, sealed; 3 made now
    assert not (tmp_path / "a" / "pending.pt").exists()
    fresh = make(7, tmp_path / "b")
    assert torch.equal(resumed[0], fresh[0]) and torch.equal(resumed[1], fresh[1])


def test_chat_requests_ask_each_function_each_kind_in_turn(qwen3_tok):
    """code+explain: function j's code request (as ``chat_prompts`` builds it), then its explain
    request; unknown kinds are refused."""
    from d3d.train.chat_data import chat_prompts, chat_requests

    both = chat_requests(qwen3_tok, None, 0.05, 7, kinds=("code", "explain"))
    assert [k for k, _ in both] == ["code", "explain"] * 3 + ["code"]
    assert [p for k, p in both if k == "code"] == chat_prompts(qwen3_tok, None, 0.05, 4)
    assert [p for k, p in both if k == "explain"] == chat_prompts(qwen3_tok, None, 0.05, 3, explain=True)
    assert "in a few sentences of plain English" in qwen3_tok.decode(both[1][1])
    with pytest.raises(ValueError, match="request kinds"):
        chat_requests(qwen3_tok, None, 0.05, 2, kinds=("poem",))


def test_new_request_kinds_ask_about_the_same_functions(qwen3_tok):
    """tests and review: asked of the same functions in the same order, so a code+explain store
    grows by them; each kind's requests are those of a list without the others."""
    from d3d.train.chat_data import chat_requests

    both = chat_requests(qwen3_tok, None, 0.05, 8, kinds=("code", "explain"))
    four = chat_requests(qwen3_tok, None, 0.05, 16, kinds=("code", "explain", "tests", "review"))
    assert [k for k, _ in four] == ["code", "explain", "tests", "review"] * 4
    assert [r for r in four if r[0] in ("code", "explain")] == both
    tests = [p for k, p in four if k == "tests"]
    assert [p for _, p in chat_requests(qwen3_tok, None, 0.05, 4, kinds=("tests",))] == tests
    assert all("pytest" in qwen3_tok.decode(p) for p in tests) and len(set(map(tuple, tests))) == 4
    assert "point out a bug" in qwen3_tok.decode(four[3][1])


def test_data_only_makes_the_data_and_trains_nothing(tmp_path, monkeypatch):
    """``--data-only`` (data in session-sized chunks, training later): the data is made with the
    given options, then the trainer stops before building a drafter; --extra-functions needs chat data."""
    import torch

    import d3d.train.drafter as trainer
    from d3d.train.drafter import DrafterTrainConfig, train_drafter
    from d3d.train.target import train_target
    from test_train_target import tiny_config

    tcfg = tiny_config(tmp_path, steps=2, hidden_size=32, num_heads=2, num_kv_heads=1, num_layers=1,
                       intermediate_size=64, vocab_size=320, max_positions=256)
    train_target(tcfg, log=lambda *_: None)
    calls = []
    rows = (torch.randint(10, 300, (5, 32)), torch.ones(5, 32))
    monkeypatch.setattr(trainer, "make_chat_training_data", lambda *a, **kw: calls.append(kw | {"store": a[8]}) or rows)
    out = tmp_path / "drafter"
    common = dict(target=tcfg.out, out=str(out), corpus=tcfg.corpus, heldout_fraction=tcfg.heldout_fraction,
                  num_layers=1, block_size=4, window=32, batch_size=2, steps=2)
    summary = train_drafter(DrafterTrainConfig(**common, data="chat", data_only=True, extra_functions=True),
                            log=lambda *_: None)
    assert summary["data_rows"] == 5 and summary["history"] == []
    assert calls[0]["extra_functions"] is True
    assert not (out / "model.safetensors").exists() and not (out / "training_state.pt").exists()
    with pytest.raises(ValueError, match="--data chat"):
        train_drafter(DrafterTrainConfig(**common, data="windows", extra_functions=True), log=lambda *_: None)
    with pytest.raises(ValueError, match="--data chat"):
        train_drafter(DrafterTrainConfig(**common, data="windows", answers=str(tmp_path / "s")), log=lambda *_: None)
    with pytest.raises(ValueError, match="--requests='code\\+poem'"):
        train_drafter(DrafterTrainConfig(**common, data="chat", requests="code+poem"), log=lambda *_: None)
    train_drafter(DrafterTrainConfig(**common, data="chat", data_only=True, requests="explain+code",
                                     answers=str(tmp_path / "s")), log=lambda *_: None)
    assert calls[0]["store"] == out / "data" / "answers" and calls[0]["kinds"] == ("code",)
    assert calls[-1]["store"] == tmp_path / "s" and calls[-1]["kinds"] == ("explain", "code")


def test_init_drafter_starts_from_a_saved_int8_drafter_and_its_vocabulary(tmp_path, monkeypatch):
    """``--init-drafter DIR`` (going on from a committed drafter when no training state survives):
    the new run starts from DIR's weights, dequantized from int8, and keeps its drafting
    vocabulary even where its own data would pick other ids; another shape is refused."""
    import torch

    import d3d.train.drafter as trainer
    from d3d import load_drafter, load_model
    from d3d.draft.drafter import save_drafter
    from d3d.train.drafter import DrafterTrainConfig, train_drafter
    from d3d.train.target import train_target
    from test_train_target import tiny_config

    tcfg = tiny_config(tmp_path, steps=2, hidden_size=32, num_heads=2, num_kv_heads=1, num_layers=2,
                       intermediate_size=64, vocab_size=320, max_positions=256)
    train_target(tcfg, log=lambda *_: None)
    data = {"rows": (torch.randint(10, 100, (8, 32)), torch.ones(8, 32))}
    made = []
    monkeypatch.setattr(trainer, "make_chat_training_data", lambda *a, **kw: made.append(1) or data["rows"])
    monkeypatch.setattr(trainer, "chat_prompts", lambda *a, **kw: [[11, 12, 13]])
    common = dict(target=tcfg.out, corpus=tcfg.corpus, heldout_fraction=tcfg.heldout_fraction, data="chat",
                  num_layers=1, block_size=4, window=32, batch_size=2, draft_vocab=64, eval_every=100,
                  eval_prompts=1, eval_new_tokens=4, save_every=100, log_every=100)
    train_drafter(DrafterTrainConfig(**common, out=str(tmp_path / "a"), steps=3, lr=0.05), log=lambda *_: None)
    target = load_model(tcfg.out, dtype="float32")
    first = load_drafter(tmp_path / "a", target)
    save_drafter(first, tmp_path / "a8", int8=True)
    data["rows"] = (torch.randint(150, 300, (8, 32)), torch.ones(8, 32))   # ids the first vocabulary lacks
    train_drafter(DrafterTrainConfig(**common, out=str(tmp_path / "b"), steps=1, lr=1e-9,
                                     init_drafter=str(tmp_path / "a8")), log=lambda *_: None)
    train_drafter(DrafterTrainConfig(**common, out=str(tmp_path / "c"), steps=1, lr=1e-9), log=lambda *_: None)
    a8, b, c = (load_drafter(tmp_path / d, target) for d in ("a8", "b", "c"))
    assert torch.equal(b.vocab_map, first.vocab_map) and not torch.equal(c.vocab_map, first.vocab_map)
    w = {d: m.model.state_dict()["layers.0.mlp.down_proj.weight"].float() for d, m in (("a8", a8), ("b", b), ("c", c))}
    assert torch.allclose(w["b"], w["a8"], rtol=1e-2, atol=1e-3)
    assert not torch.allclose(w["c"], w["a8"], rtol=1e-2, atol=1e-3)
    # --fresh-vocab: the saved drafter's weights, a vocabulary chosen from this run's data (the new ids)
    train_drafter(DrafterTrainConfig(**common, out=str(tmp_path / "f"), steps=1, lr=1e-9, fresh_vocab=True,
                                     init_drafter=str(tmp_path / "a8")), log=lambda *_: None)
    f = load_drafter(tmp_path / "f", target)
    assert torch.equal(f.vocab_map, c.vocab_map) and bool((f.vocab_map >= 150).any())
    wf = f.model.state_dict()["layers.0.mlp.down_proj.weight"].float()
    assert torch.allclose(wf, w["a8"], rtol=1e-2, atol=1e-3)
    # the lender the saved drafter's config names (where its embeddings come from) is kept, no --base given
    import json
    cfg_a8 = json.loads((tmp_path / "a8" / "config.json").read_text())
    cfg_a8["d3d"]["embeddings_from"] = "a-lender"
    (tmp_path / "a8" / "config.json").write_text(json.dumps(cfg_a8))
    train_drafter(DrafterTrainConfig(**common, out=str(tmp_path / "h"), steps=1, lr=1e-9,
                                     init_drafter=str(tmp_path / "a8")), log=lambda *_: None)
    assert json.loads((tmp_path / "h" / "config.json").read_text())["d3d"]["embeddings_from"] == "a-lender"
    with pytest.raises(ValueError, match="--fresh-vocab"):
        train_drafter(DrafterTrainConfig(**common, out=str(tmp_path / "g"), steps=1, fresh_vocab=True),
                      log=lambda *_: None)
    made.clear()
    with pytest.raises(ValueError, match="--init-drafter .*this run trains"):
        train_drafter(DrafterTrainConfig(**{**common, "num_layers": 2}, out=str(tmp_path / "d"), steps=1,
                                         init_drafter=str(tmp_path / "a8")), log=lambda *_: None)
    assert not made                               # refused before any data is made


def test_training_requests_leave_out_functions_whose_text_is_also_held_out(tmp_path):
    """A training file's function whose exact text is also in a held-out file is never asked about
    (the standard library has 4 such duplicates); the other requests keep their order and phrasing."""
    import d3d.train.chat_data as chat_data

    frac = 0.3
    corpus = tmp_path / "corpus"
    _write_split(corpus, ["alpha", "beta", "dup", "held_x"], frac, {"held_x"})
    held_file = next(corpus.glob("held_x_*.py"))
    held_file.write_text(held_file.read_text() + "\n" + _function("dup") + "    return x\n")
    picks, kinds = chat_data.training_functions(str(corpus), frac, 6, "train", seed=3)
    assert picks and not any("def dup" in p for p in picks) and len(picks) == len(kinds) < 6
    assert any("def alpha" in p for p in picks) and any("def beta" in p for p in picks)
    held_file.write_text(held_file.read_text().replace("def dup", "def other"))
    all_picks, all_kinds = chat_data.training_functions(str(corpus), frac, 6, "train", seed=3)
    assert [(p, k) for p, k in zip(all_picks, all_kinds) if "def dup" not in p] == list(zip(picks, kinds))


def test_the_target_fingerprint_names_the_model_not_the_dtype_it_runs_in():
    """An AVX2 machine answers in fp32 and an avx512_bf16 one in bf16: both add to one store (each
    chunk records its dtype). Another model (one embedding value changed) has another fingerprint."""
    import torch

    from d3d.data.answers import target_fingerprint
    from test_engines import tiny_target

    target = tiny_target()
    fp32 = target_fingerprint(target)
    assert target_fingerprint(tiny_target().to(torch.bfloat16)) == fp32
    with torch.no_grad():
        target.embed_tokens.weight[0, 0] += 1.0
    assert target_fingerprint(target) != fp32


def test_base_builds_the_drafter_from_another_model_than_the_target(tmp_path, monkeypatch):
    """``--base NAME``: the drafter is built from (and borrows the embeddings of) a real model other
    than the target whose answers it learns; it records the name, so it loads beside the target
    alone and drafts losslessly for it. A base that is no real model, or speaks another vocabulary,
    is refused before any data is made."""
    import torch

    import d3d
    import d3d.fetch
    import d3d.train.drafter as trainer
    from d3d import load_drafter, load_model
    from d3d.decode.config import SpecConfig
    from d3d.train.drafter import DrafterTrainConfig, train_drafter
    from d3d.train.target import train_target
    from test_train_target import tiny_config

    small = tiny_config(tmp_path / "s", steps=2, vocab_size=320)
    wide = tiny_config(tmp_path / "w", steps=2, vocab_size=320, hidden_size=48, num_layers=2, head_dim=24)
    other = tiny_config(tmp_path / "o", steps=2, vocab_size=288)
    for c in (small, wide, other):
        train_target(c, log=lambda *_: None)
    dirs = {"tiny-small": small.out, "tiny-other": other.out}
    monkeypatch.setattr(d3d.fetch, "is_real_model", lambda name: name in dirs)
    monkeypatch.setattr(d3d.fetch, "fetch", lambda name, log=None: trainer.Path(dirs[name]))
    made = []
    monkeypatch.setattr(trainer, "make_chat_training_data",
                        lambda *a, **kw: made.append(1) or (torch.randint(10, 100, (8, 32)), torch.ones(8, 32)))
    monkeypatch.setattr(trainer, "chat_prompts", lambda *a, **kw: [[11, 12, 13]])
    common = dict(target=wide.out, corpus=wide.corpus, heldout_fraction=wide.heldout_fraction, data="chat",
                  num_layers=1, block_size=4, window=32, batch_size=2, draft_vocab=64, eval_every=100,
                  eval_prompts=1, eval_new_tokens=4, save_every=100, log_every=100, steps=2)
    train_drafter(DrafterTrainConfig(**common, out=str(tmp_path / "d"), base="tiny-small"), log=lambda *_: None)
    target = load_model(wide.out, dtype="float32")
    drafter = load_drafter(tmp_path / "d", target=target)
    assert drafter.dcfg.embeddings_from == "tiny-small"
    assert drafter.model.cfg.hidden_size == 32 != target.cfg.hidden_size
    prompt = [[1, 2, 3, 4], [5, 6]]
    ar = d3d.generate(target, prompt, max_new_tokens=12, stop_ids=[])
    assert d3d.generate(target, prompt, max_new_tokens=12, stop_ids=[], drafter=drafter,
                        spec=SpecConfig(mode="sync")).tokens == ar.tokens
    made.clear()
    with pytest.raises(ValueError, match="--base='nowhere': expected a real model"):
        train_drafter(DrafterTrainConfig(**common, out=str(tmp_path / "e"), base="nowhere"), log=lambda *_: None)
    with pytest.raises(ValueError, match="--base tiny-other: .*not the target's|--base tiny-other: 288 embedding"):
        train_drafter(DrafterTrainConfig(**common, out=str(tmp_path / "f"), base="tiny-other"), log=lambda *_: None)
    assert not made


def test_also_answers_adds_a_seeded_share_of_another_stores_rows(tmp_path, monkeypatch):
    """``--also-answers DIR --also-share S``: another store's answers make S of the rows (a seeded
    subset, the same one each call; all of them when it holds fewer); a bad share or a missing
    store is refused by name."""
    import torch

    from d3d.train.chat_data import store_rows
    from d3d.train.drafter import DrafterTrainConfig, check_train_config

    make, _ = _store_setup(monkeypatch)
    make(7, tmp_path / "other")
    ids, mask = store_rows(tmp_path / "other", 0.25, 9, 16, 0, seed=3)
    assert ids.shape == (3, 16) and mask.shape == (3, 16) and mask.sum(1).tolist() == [6, 6, 6]
    assert torch.equal(store_rows(tmp_path / "other", 0.25, 9, 16, 0, seed=3)[0], ids)
    assert not torch.equal(store_rows(tmp_path / "other", 0.25, 9, 16, 0, seed=4)[0], ids)
    assert store_rows(tmp_path / "other", 0.9, 9, 16, 0, seed=3)[0].shape[0] == 7
    common = dict(target="t", out="o", data="chat")
    with pytest.raises(ValueError, match="--also-share=1.0: must lie strictly between 0 and 1"):
        check_train_config(DrafterTrainConfig(**common, also_answers=str(tmp_path / "other"), also_share=1.0))
    with pytest.raises(ValueError, match="nowhere/manifest.json: not a readable answer-store manifest"):
        check_train_config(DrafterTrainConfig(**common, also_answers=str(tmp_path / "nowhere")))
    with pytest.raises(ValueError, match="--also-answers.*need --data chat"):
        check_train_config(DrafterTrainConfig(target="t", out="o", also_answers=str(tmp_path / "other")))
