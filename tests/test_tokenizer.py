"""The tokenizer wrapper on the real Qwen3 tokenizer.json, with the official chat template as oracle."""

import json

import pytest

from d3d.assets import qwen3_tokenizer_dir
from d3d.model.tokenizer import load_tokenizer

try:
    QWEN3 = qwen3_tokenizer_dir()
except FileNotFoundError as e:  # pragma: no cover - CI installs it (see .ci/run)
    pytest.skip(str(e), allow_module_level=True)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(QWEN3)


@pytest.fixture(scope="module")
def template():
    """Render the official jinja chat template from tokenizer_config.json (the oracle)."""
    jinja2 = pytest.importorskip("jinja2")
    source = json.loads((QWEN3 / "tokenizer_config.json").read_text())["chat_template"]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = json.dumps
    tmpl = env.from_string(source)
    return lambda messages, **kw: tmpl.render(messages=messages, **kw)


def test_vocab_and_special_tokens(tok):
    assert tok.vocab_size == 151669
    assert tok.token_id("<|im_start|>") == 151644
    assert tok.token_id("<|im_end|>") == 151645
    assert tok.eos_token_id == 151645
    assert tok.pad_token_id == 151643
    assert tok.stop_token_ids() == [151643, 151645]


@pytest.mark.parametrize("text", [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Héllo wörld — ünïcödé 你好 🙂",
    "   leading spaces and\ttabs\n\n\n",
    "<|im_start|>user\nhi<|im_end|>",
])
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text


def test_special_tokens_encode_as_one_id(tok):
    ids = tok.encode("<|im_start|>assistant\n")
    assert ids[0] == 151644 and len(ids) == 3
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n"


CONVERSATIONS = [
    [{"role": "user", "content": "Write a haiku about caches."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\nsay hi\n</think>\n\nHello!"},
     {"role": "user", "content": "and again"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
     {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"},
     {"role": "assistant", "content": "<think>r2</think>a2"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("gen", [True, False])
def test_chat_format_equals_official_template(tok, template, messages, gen):
    assert tok.apply_chat(messages, add_generation_prompt=gen) == template(messages, add_generation_prompt=gen)


def test_chat_without_thinking(tok, template):
    msgs = CONVERSATIONS[0]
    ours = tok.apply_chat(msgs, enable_thinking=False)
    assert ours == template(msgs, add_generation_prompt=True, enable_thinking=False)
    assert ours.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_bad_inputs(tok, tmp_path):
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([151669])
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        tok.apply_chat([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="messages is empty"):
        tok.apply_chat([])
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        load_tokenizer(tmp_path)
