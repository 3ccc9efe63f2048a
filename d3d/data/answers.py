"""The target's answers to training requests, kept in files that can be committed.

Every label of the real-model drafter costs a target pass (130-210 answer tok/s on the 2-core
CPUs here, so 10M labels are 13-20 CPU-hours), and a new machine keeps nothing outside the work
tree: 16,800 answers (2.1M tokens, ~4.5 CPU-hours) kept in a run directory were lost with their
machine (issue 16). A store is a directory that grows by
sealed chunks: a session answers requests for as long as it has, seals what it made as one
chunk, and the next session, on any machine, goes on from the committed store. A request (its
prompt ids) is answered once.

Layout of a store directory::

    manifest.json          {"format": 1, "target": fingerprint, "model": name (optional), "gen_len": 160,
                            "chunks": [{"file", "rows", "answer_tokens", "kinds", "dtype", "seconds", "sealed"}]}
    answers-00000.json.xz  {"rows": [{"kind": "code", "prompt": [ids], "answer": [ids]}, ...]}
    pending.pt             this machine's answers not sealed yet (resumed, never committed)

Chunks are xz-compressed JSON: readable with ``xzcat``; ~0.52 bytes per stored token, ~0.99 per answer
token, on the Qwen chat requests (``docs/results/answer-store/summary.json``). The manifest's fingerprint names the target (config +
first embedding rows) and the answer cap: answers of another model or cap are refused, not mixed. ``model`` names
the real model that answered (``d3d.fetch``), so that a datastore serves it loaded from another checkpoint too
(``d3d.decode.datastore.load_datastore``: its HF weights and its GGUF's blocks have different fingerprints).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..files import atomic, write_json
from ..cpu.quant import is_quantized
from ..model.transformer import Transformer

FORMAT = 1


def target_fingerprint(target: Transformer) -> str:
    """A short hash of the target's config and first embedding rows: which model wrote an answer.
    The rows are hashed as bf16 so that the fingerprint names the model, not the dtype it was loaded
    in (the store's chunks record their dtype): an AVX2 machine answers in fp32, an avx512_bf16 one in bf16,
    a quantized checkpoint through its blocks (whose rows are read dequantized)."""
    w = target.embed_tokens.weight
    rows = (w.dequantize(torch.arange(4)) if is_quantized(w) else w[:4].detach()).to(torch.bfloat16).float()
    return hashlib.sha256(json.dumps(target.cfg.to_hf(), sort_keys=True).encode()
                          + rows.cpu().numpy().tobytes()).hexdigest()[:16]


@dataclass
class Answer:
    """One request (``kind``: "code", "explain", ...; ``prompt``: chat-formatted ids) and the
    target's greedy answer ids (end-of-turn token included when it stopped)."""
    kind: str
    prompt: list[int]
    answer: list[int]


class AnswerStore:
    """A store directory (see the module docstring), created on first use."""

    def __init__(self, root: str | Path, target: str, gen_len: int, model: str | None = None):
        self.root, self.manifest_path = Path(root), Path(root) / "manifest.json"
        self.pending_path = self.root / "pending.pt"
        if self.manifest_path.is_file():
            self.manifest = read_manifest(self.root)
            if (self.manifest["target"], self.manifest["gen_len"]) != (target, gen_len):
                raise ValueError(
                    f"{self.root}: answers of target {self.manifest['target']} capped at {self.manifest['gen_len']} "
                    f"tokens, asked to add those of target {target} capped at {gen_len}: another store directory, "
                    f"or the same --target and --gen-len")
        else:
            self.manifest = {"format": FORMAT, "target": target, "gen_len": gen_len, "chunks": []}
            if model is not None:  # the real model that answers (d3d.fetch): its other checkpoints' phrasing too
                self.manifest["model"] = model
        self._sealed: list[Answer] | None = None

    def sealed(self) -> list[Answer]:
        """The sealed chunks' answers, in chunk order."""
        if self._sealed is None:
            self._sealed = sealed_answers(self.root, self.manifest)
        return self._sealed

    def pending(self) -> list[Answer]:
        """This machine's unsealed answers: ``pending.pt`` holds the batches of
        ``d3d.train.common.resumable_chunks``, each a list of (kind, prompt, answer)."""
        if not self.pending_path.is_file():
            return []
        return [Answer(*row) for batch in torch.load(self.pending_path) for row in batch]

    def seal(self, seconds: float | None, dtype: str) -> dict | None:
        """Write the pending answers as the next chunk and record it in the manifest (chunk first,
        then manifest: a chunk the manifest does not name is ignored, so a kill in between loses
        nothing but the pending file's removal). Returns the chunk's record, None when nothing is pending."""
        answers = self.pending()
        if not answers:
            return None
        name = f"answers-{len(self.manifest['chunks']):05d}.json.xz"
        write_chunk(self.root / name, answers)
        record = {"file": name, **chunk_record(answers), "dtype": dtype,
                  "seconds": None if seconds is None else round(seconds), "sealed": time.strftime("%Y-%m-%d")}
        self.manifest["chunks"].append(record)
        write_json(self.manifest_path, self.manifest)
        self.pending_path.unlink(missing_ok=True)
        self._sealed = None
        return record

    def drop(self, unwanted, why: str) -> int:
        """Rewrite the sealed chunks without the answers ``unwanted(answer)`` flags (e.g. requests
        found to ask about held-out text); each changed chunk's record notes how many and why.
        Returns how many were dropped."""
        dropped = 0
        for record in self.manifest["chunks"]:
            answers = read_chunk(self.root / record["file"])
            kept = [a for a in answers if not unwanted(a)]
            if len(kept) == len(answers):
                continue
            write_chunk(self.root / record["file"], kept)
            record.update(chunk_record(kept), dropped=record.get("dropped", 0) + len(answers) - len(kept), why=why)
            dropped += len(answers) - len(kept)
        write_json(self.manifest_path, self.manifest)
        self._sealed = None
        return dropped

    def prepare(self) -> None:
        """Create the directory, with a .gitignore that keeps the pending file out of commits."""
        self.root.mkdir(parents=True, exist_ok=True)
        ignore = self.root / ".gitignore"
        if not ignore.is_file():
            ignore.write_text("pending.pt\n.*.tmp\n")


def chunk_record(answers: list[Answer]) -> dict:
    """What the manifest says of a chunk's content: rows, answer tokens, rows per request kind."""
    kinds: dict[str, int] = {}
    for a in answers:
        kinds[a.kind] = kinds.get(a.kind, 0) + 1
    return {"rows": len(answers), "answer_tokens": sum(len(a.answer) for a in answers), "kinds": kinds}


def read_manifest(root: str | Path) -> dict:
    path = Path(root) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable answer-store manifest ({e})") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def sealed_answers(root: str | Path, manifest: dict | None = None) -> list[Answer]:
    """Every sealed answer of the store at ``root``, in chunk order (no target needed: for reading)."""
    manifest = manifest or read_manifest(root)
    return [a for c in manifest["chunks"] for a in read_chunk(Path(root) / c["file"])]


def write_chunk(path: Path, answers: list[Answer]) -> None:
    rows = [{"kind": a.kind, "prompt": a.prompt, "answer": a.answer} for a in answers]
    with atomic(path) as tmp:
        with lzma.open(tmp, "wt", preset=9) as f:
            json.dump({"rows": rows}, f, separators=(",", ":"))


def read_chunk(path: Path) -> list[Answer]:
    try:
        with lzma.open(path, "rt") as f:
            rows = json.load(f)["rows"]
        return [Answer(r["kind"], r["prompt"], r["answer"]) for r in rows]
    except (OSError, ValueError, KeyError, lzma.LZMAError) as e:
        raise ValueError(f"{path}: not a readable answer chunk ({e})") from None
