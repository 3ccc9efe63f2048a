"""Widen a drafter's reduced drafting vocabulary without retraining (issue 16).

The drafter's head is *frozen*: the target's LM-head rows for the K drafting ids
(``d3d.draft.drafter.draft_head``), so the trained weights never depend on which ids are scored, and more
ids can be appended after training. The shipped 16,384 ids came from the first 5,600 answers of the
store; they cover 97% of its supervised tokens now, and a token outside them can never be drafted.
This keeps the shipped ids in their order and appends the store's most frequent answer ids it lacks.

    PYTHONPATH=. python docs/results/qwen-drafter/vocab/widen.py DRAFTER STORE K OUT_DIR

writes OUT_DIR (config.json with draft_vocab_size=K, model.safetensors with every other tensor copied
bit for bit) and prints the coverage of the store's answer tokens before and after.
"""
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from d3d.draft.drafter import DRAFT_VOCAB
from d3d.data.answers import sealed_answers


def answer_counts(store: str) -> Counter:
    return Counter(t for a in sealed_answers(store) for t in a.answer)


def widened(ids: torch.Tensor, counts: Counter, k: int) -> torch.Tensor:
    """``ids`` then the most frequent ids of ``counts`` not among them, ``k`` in all."""
    if k < ids.numel():
        raise ValueError(f"K={k}: smaller than the drafter's {ids.numel()} ids (this only widens)")
    have = set(ids.tolist())
    extra = [t for t, _ in counts.most_common() if t not in have][: k - ids.numel()]
    if len(extra) < k - ids.numel():
        raise ValueError(f"K={k}: the store uses only {len(have) + len(extra)} distinct ids with these")
    return torch.cat([ids, torch.tensor(extra, dtype=torch.int64)])


def coverage(ids: torch.Tensor, counts: Counter) -> float:
    have = set(ids.tolist())
    return sum(c for t, c in counts.items() if t in have) / sum(counts.values())


def main(drafter: str, store: str, k: str, out: str):
    src, dst = Path(drafter), Path(out)
    tensors = load_file(src / "model.safetensors")
    counts = answer_counts(store)
    ids = widened(tensors[DRAFT_VOCAB], counts, int(k))
    print(f"coverage of {sum(counts.values()):,} store answer tokens: {coverage(tensors[DRAFT_VOCAB], counts):.4f} "
          f"({tensors[DRAFT_VOCAB].numel()} ids) -> {coverage(ids, counts):.4f} ({ids.numel()} ids)")
    cfg = json.loads((src / "config.json").read_text())
    cfg["d3d"]["draft_vocab_size"] = ids.numel()
    dst.mkdir(parents=True, exist_ok=True)
    tensors[DRAFT_VOCAB] = ids
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for extra in ("README.md",):
        if (src / extra).is_file():
            shutil.copy(src / extra, dst / extra)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
