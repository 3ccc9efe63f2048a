"""Pieces every training loop here shares: schedule, optimizer, checkpoints, progress output."""

from __future__ import annotations

import math
import sys
import hashlib
import time
from pathlib import Path

import torch

from ..files import atomic


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then cosine decay to ``floor * peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (norm gains and biases are not decayed)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def save_atomic(obj, path: Path) -> None:
    """``torch.save`` to a temporary file, then rename: a killed save never leaves a broken file."""
    with atomic(path) as tmp:
        torch.save(obj, tmp)


def labels_cache(cache_dir: Path, name: str, target, inputs: bytes, what: str, log=print):
    """Where the labels ``target`` makes for ``inputs`` are cached: ``(path, partial, cached)``, keyed by the
    inputs and the target (config, dtype, first weights); ``cached``: the finished file's contents or None."""
    key = hashlib.sha256(inputs + str(target.cfg.to_hf()).encode() + str(target.dtype).encode()
                         + target.embed_tokens.weight[:4].float().numpy().tobytes()).hexdigest()[:16]
    path, partial = cache_dir / f"{name}-{key}.pt", cache_dir / f"{name}-{key}.partial.pt"
    if not path.is_file():
        return path, partial, None
    log(f"using cached {what} {path}")
    return path, partial, torch.load(path)


def resumable_rows(partial: Path, total: int, chunk: int, make, what: str, per_row: int, unit: str,
                   log=print) -> torch.Tensor:
    """Rows ``[0, total)`` of a slow-to-make dataset, ``make(i, j)`` -> rows i..j-1 (a tensor),
    ``chunk`` rows at a time, resumable (``resumable_chunks``). Progress: ``per_row`` ``unit``s per
    row (tokens generated, labels, ...)."""
    return torch.cat(resumable_chunks(partial, total, chunk, make, what, unit, lambda rows: len(rows) * per_row,
                                      log=log))


def resumable_chunks(partial: Path, total: int, chunk: int, make, what: str, unit: str, count,
                     minutes: float | None = None, log=print) -> list:
    """The chunks ``make(i, j)`` (rows i..j-1, anything with a length) of rows ``[0, total)``, ``chunk``
    rows at a time; every chunk is saved to ``partial`` (atomically), so a killed job resumes where
    it stopped. ``minutes``: stop at the first chunk boundary past this wall time (the chunks made
    so far are returned; a later call goes on from there). Progress: ``count(chunk)`` ``unit``s."""
    done_chunks = torch.load(partial) if partial.is_file() else []
    done0 = sum(len(x) for x in done_chunks)
    if done0:
        log(f"resuming {what} from {partial}: {done0}/{total} rows done")
    t0, made = time.perf_counter(), 0
    for i in range(done0, total, chunk):
        if minutes is not None and time.perf_counter() - t0 >= 60 * minutes:
            log(f"{what}: stopping after {minutes} min with {i}/{total} rows done (saved in {partial}; "
                f"the same call goes on from there)")
            break
        done_chunks.append(make(i, min(i + chunk, total)))
        made += count(done_chunks[-1])
        done, el = min(i + chunk, total), time.perf_counter() - t0
        log(f"{what}: {done}/{total} ({made / el:.0f} {unit}/s, eta {el / (done - done0) * (total - done):.0f} s)")
        save_atomic(done_chunks, partial)
    return done_chunks


def save_training_state(path: Path, model, optimizer, step: int, extra: dict) -> None:
    """Atomic write (tmp + rename), so an interrupted save never leaves a broken checkpoint."""
    save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, **extra}, path)


def load_training_state(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no training checkpoint to resume from")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ValueError(f"{path}: cannot read training checkpoint ({e})") from None


def batch_generator(seed: int, step: int) -> torch.Generator:
    """Randomness for one step depends only on (seed, step): a resumed run sees the same batches."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


class Progress:
    """One line per report: step, loss, tokens/s, elapsed and ETA."""

    def __init__(self, total_steps: int, start_step: int = 0, out=None):
        self.total, self.start, self.out = total_steps, start_step, out  # None: sys.stderr when printing
        self.t0 = time.perf_counter()

    def report(self, step: int, tokens: int, **fields) -> str:
        elapsed = time.perf_counter() - self.t0
        done = step + 1 - self.start
        eta = elapsed / max(done, 1) * (self.total - step - 1)
        parts = [f"step {step + 1}/{self.total}"] + [
            f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items()]
        parts += [f"{tokens / max(elapsed, 1e-9):.0f} tok/s", f"elapsed {_hms(elapsed)}", f"eta {_hms(eta)}"]
        line = " | ".join(parts)
        print(line, file=self.out or sys.stderr, flush=True)
        return line


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
