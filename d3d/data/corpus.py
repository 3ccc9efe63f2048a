"""The training corpus: real Python source, split into train and held-out *by file*.

Default corpus: the standard library of the running interpreter (docs/design.md §8) without its test
suites. The split is a stable hash of each file's path relative to the corpus root, so it is the
same on every machine and run, and a held-out file is never trained on (by the target or the
drafters). The held-out files are split once more, by a second hash, into

    validation   for every choice made while building models (a trainer's τ monitor, the
                 pruning search, thresholds): measured on, tuned on
    evaluation   for the figures reported (benches, model cards): never used for a choice

so that no reported figure comes from the prompts a choice was made on.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}

# ``--corpus python-sources``: the standard library plus the Python sources every d3d install
# has anyway, deduplicated by content and split by a hash of the content. numpy and transformers
# are never part of it: they are the unseen third-party code evaluations use.
PYTHON_SOURCES = "python-sources"
SOURCE_PACKAGES = ("torch", "pip", "setuptools", "triton", "safetensors", "tokenizers")
EVALUATION_ONLY_PACKAGES = ("numpy", "transformers")


def default_corpus_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@dataclass
class Corpus:
    root: Path
    train: list[Path]
    heldout: list[Path]  # validation + evaluation
    keys: dict[Path, str] | None = None  # split keys (content hashes) of a multi-root corpus

    def describe(self) -> str:
        return f"{self.root}: {len(self.train)} train files, {len(self.heldout)} held-out files"

    def part(self, name: str) -> list[Path]:
        """Held-out files of one part: "validation", "evaluation" or "heldout" (both)."""
        if name == "heldout":
            return self.heldout
        if name not in ("validation", "evaluation"):
            raise ValueError(f"part={name!r}: expected validation, evaluation or heldout")
        # ordered by a hash independent of the train/held-out one: the first half is validation
        def key(p: Path) -> str:
            return self.keys[p] if self.keys is not None else p.relative_to(self.root).as_posix()

        ranked = sorted(self.heldout, key=lambda p: zlib.crc32(("part:" + key(p)).encode()))
        half = (len(ranked) + 1) // 2
        return ranked[:half] if name == "validation" else ranked[half:]


def is_heldout(rel: str, fraction: float) -> bool:
    return zlib.crc32(rel.encode()) % 10_000 < fraction * 10_000


def source_roots() -> list[Path]:
    """The standard library and the installed packages of ``SOURCE_PACKAGES`` (those present)."""
    site = Path(sysconfig.get_paths()["purelib"])
    return [default_corpus_root()] + [site / name for name in SOURCE_PACKAGES if (site / name).is_dir()]


def multi_root_corpus(roots: list[Path], heldout_fraction: float, suffix: str = ".py", name: str = PYTHON_SOURCES
                      ) -> Corpus:
    """The ``*.py`` files under several roots, each distinct content once (the first path that has
    it), split train / held-out by a hash of the content: a file copied into two packages can
    never be on both sides."""
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction={heldout_fraction}: must be in (0, 1)")
    keys: dict[Path, str] = {}
    seen: set[str] = set()
    for root in roots:
        for p in sorted(root.rglob(f"*{suffix}")):
            if not p.is_file() or EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1]):
                continue
            if any(part in EVALUATION_ONLY_PACKAGES for part in p.parts):
                continue
            data = p.read_bytes()
            digest = hashlib.sha1(data).hexdigest()
            if data.strip() and digest not in seen:
                seen.add(digest)
                keys[p] = digest
    if not keys:
        raise ValueError(f"corpus {name}: no non-empty {suffix} files under {[str(r) for r in roots]}")
    train, heldout = [], []
    for p, digest in keys.items():
        (heldout if is_heldout(digest, heldout_fraction) else train).append(p)
    if not train or not heldout:
        raise ValueError(f"corpus {name}: {len(keys)} distinct file(s) are too few to split into train and held-out")
    return Corpus(Path(name), train, heldout, keys)


def find_corpus(root: str | Path | None = None, heldout_fraction: float = 0.05, suffix: str = ".py") -> Corpus:
    """All ``*.py`` files under ``root`` (default: the stdlib), split train / held-out by file;
    ``root="python-sources"``: ``multi_root_corpus`` over ``source_roots()``."""
    if str(root) == PYTHON_SOURCES:
        return multi_root_corpus(source_roots(), heldout_fraction, suffix)
    root = Path(root) if root is not None else default_corpus_root()
    if not root.exists():
        raise FileNotFoundError(f"corpus {root}: no such directory")
    if not root.is_dir():
        raise ValueError(f"corpus {root}: not a directory")
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction={heldout_fraction}: must be in (0, 1)")
    files = sorted(p for p in root.rglob(f"*{suffix}")
                   if p.is_file() and not EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1]))
    files = [p for p in files if p.stat().st_size > 0]
    if not files:
        raise ValueError(f"corpus {root}: no non-empty {suffix} files found")
    train, heldout = [], []
    for p in files:
        (heldout if is_heldout(p.relative_to(root).as_posix(), heldout_fraction) else train).append(p)
    if not train or not heldout:
        raise ValueError(f"corpus {root}: {len(files)} file(s) are too few to split into train and held-out")
    return Corpus(root, train, heldout)


def training_corpus(target_dir: str | Path) -> str | None:
    """The ``--corpus`` a target was trained on, from its ``train_summary.json`` (None: the standard
    library, also for a target without a summary). Code prompts for that target must come from the
    evaluation files of *this* corpus: another corpus's split can hold the target's training files."""
    path = Path(target_dir) / "train_summary.json"
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read it as JSON ({e})") from None
    corpus = summary.get("config", {}).get("corpus") if isinstance(summary, dict) else None
    return None if corpus is None else str(corpus)


def read_texts(files: list[Path]) -> list[str]:
    """File contents; files that are not UTF-8 are skipped (the stdlib has a few test fixtures)."""
    texts = []
    for p in files:
        try:
            texts.append(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
    return texts
