"""The one training loop every trainer here runs (target, D3D drafter, DFlash drafter).

A trainer builds its model, data and loss, then hands ``train_loop`` three things:

    loss_fn(step, gen) -> (loss, tokens)   one batch's scalar loss (drawn with ``gen``, which
                                           depends only on (seed, step): a resumed run sees the
                                           same batches) and how many tokens it covered
    evaluate(step) -> dict                 a held-out measurement, appended to the history
    on_eval(step, history)                 optional: e.g. save a usable model at every evaluation

and the loop does the rest the same way for all: cosine schedule with warm-up, AdamW step with
gradient clipping, bf16 autocast where the CPU multiplies bf16 fast (``compute_dtype``), progress
lines with ETA, evaluation every ``eval_every`` steps, an atomic
``training_state.pt`` every ``save_every`` steps (and at the end), ``--resume`` from it, and
``stop_after`` (steps) or ``stop_after_minutes`` (wall time: a chunk that fits a session) to end
this invocation early with an evaluation and a saved state (the schedule still spans ``steps``).
Ctrl-C or SIGTERM ends it after the current step, with the state saved.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

import torch

from ..cpu.precision import resolve_dtype
from .common import Progress, batch_generator, cosine_lr, load_training_state, save_training_state


@dataclass(kw_only=True)
class TrainSettings:
    """The settings every trainer has; each trainer's config adds its own (and may change defaults)."""

    out: str  # output directory
    corpus: str | None = None  # directory of .py files (default: the running interpreter's standard library)
    heldout_fraction: float = 0.05  # share of files held out (drafters: must match the target's split)
    batch_size: int = 8
    steps: int = 1000
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 200
    save_every: int = 100
    log_every: int = 10
    seed: int = 0
    stop_after: int | None = None  # end this invocation after N steps (resume later); the schedule spans `steps`
    stop_after_minutes: float | None = None  # end this invocation at the first step past this wall time (resume later)
    compute_dtype: str = "auto"  # matmuls under autocast in bf16 where the dtype policy picks it; fp32 master weights
    schedule_start: int = 0  # the warm-up + cosine span steps [schedule_start, steps): a warm restart of a resumed run


@dataclass
class LoopResult:
    losses: list[float] = field(default_factory=list)  # this invocation's
    history: list[dict] = field(default_factory=list)  # every evaluation, resumed runs included
    tokens_seen: int = 0
    seconds: float = 0.0
    start_step: int = 0
    steps_done: int = 0


def train_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg, state_path: Path,
               loss_fn: Callable[[int, torch.Generator], tuple[torch.Tensor, int]],
               evaluate: Callable[[int], dict], on_eval: Callable[[int, list[dict]], None] | None = None,
               resume: bool = False, log=print) -> LoopResult:
    """Train ``model`` (its parameters with ``requires_grad``) for ``cfg.steps`` steps.

    ``cfg``: a trainer's config (a ``TrainSettings``).
    """
    if not 0 <= cfg.schedule_start < cfg.steps:
        raise ValueError(f"schedule_start={cfg.schedule_start}: must be in [0, steps={cfg.steps})")
    res = LoopResult()
    if resume:
        state = load_training_state(state_path)
        changed = _changed_settings(state.get("config", {}), cfg)
        if changed:
            log(f"note: resuming with changed settings: {', '.join(changed)}")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        res.start_step, res.history = state["step"], state.get("history", [])
        log(f"resumed from {state_path} at step {res.start_step}")
    if cfg.schedule_start > res.start_step:  # steps before it would get a negative learning rate
        raise ValueError(f"schedule_start={cfg.schedule_start}: after step {res.start_step}, where this run "
                         f"{'resumes' if resume else 'starts'}; a warm restart starts where a resumed state ends")
    trainable = [p for p in model.parameters() if p.requires_grad]
    autocast = autocast_context(cfg.compute_dtype, next(model.parameters()).device)
    progress = Progress(cfg.steps, res.start_step)
    t0 = time.perf_counter()
    res.steps_done = res.start_step
    with _stop_requests() as stop:
        _run_steps(model, optimizer, cfg, state_path, loss_fn, evaluate, on_eval, res, trainable, autocast, progress,
                   t0, stop, log)
    res.seconds = time.perf_counter() - t0
    model.eval()
    return res


def _run_steps(model, optimizer, cfg, state_path, loss_fn, evaluate, on_eval, res, trainable, autocast, progress, t0,
               stop, log) -> None:
    for step in range(res.start_step, cfg.steps):
        lr = schedule_lr(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        model.train()
        with autocast():
            loss, tokens = loss_fn(step, batch_generator(cfg.seed, step))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
        optimizer.step()
        res.losses.append(loss.item())
        res.tokens_seen += tokens
        res.steps_done = step + 1
        last = (step + 1 == cfg.steps or (cfg.stop_after is not None and len(res.losses) >= cfg.stop_after)
                or (cfg.stop_after_minutes is not None and time.perf_counter() - t0 >= 60 * cfg.stop_after_minutes))
        if (step + 1) % cfg.log_every == 0 or last:
            progress.report(step, res.tokens_seen, loss=res.losses[-1], lr=lr)
        if (step + 1) % cfg.eval_every == 0 or last:
            model.eval()
            with torch.no_grad():
                res.history.append({"step": step + 1, "loss": res.losses[-1], **evaluate(step + 1)})
            if on_eval is not None:
                on_eval(step + 1, res.history)
        if (step + 1) % cfg.save_every == 0 or last or stop.is_set():
            save_training_state(state_path, model, optimizer, step + 1, {"config": asdict(cfg), "history": res.history})
        if stop.is_set() and not last:
            log(f"interrupted after step {step + 1}: state saved to {state_path}; continue with --resume")
            break
        if last:
            break


def schedule_lr(step: int, cfg) -> float:
    """The learning rate of ``step``: warm-up and cosine over ``[cfg.schedule_start, cfg.steps)``.

    ``schedule_start = 0`` is the usual schedule. A warm restart (SGDR) of a trained state resumed at
    step s with ``schedule_start = s`` warms up again to ``cfg.lr`` and anneals by ``cfg.steps``,
    instead of re-spanning one cosine from step 0, which would resume near its tail (at 80% of the
    span: 19% of the peak) and leave new data little learning rate."""
    return cosine_lr(step - cfg.schedule_start, cfg.steps - cfg.schedule_start, cfg.lr, cfg.warmup)


@contextlib.contextmanager
def _stop_requests():
    """An event set by the first SIGINT (Ctrl-C) or SIGTERM: the loop then finishes its step, saves
    its state and stops, so an interrupted run loses nothing. A second signal interrupts at once."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers can only be installed from the main thread
        return

    def request(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    old = {sig: signal.signal(sig, request) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


_PER_INVOCATION = ("stop_after", "stop_after_minutes")  # may change between chunks without a note


def _changed_settings(saved: dict, cfg) -> list[str]:
    """The settings of ``cfg`` that differ from a saved state's; a setting the state predates counts
    at its default (so a warm restart's ``schedule_start`` is noted, a new default setting is not)."""
    defaults = {f.name: f.default if f.default is not MISSING else f.default_factory()
                for f in fields(cfg) if f.default is not MISSING or f.default_factory is not MISSING}
    now = asdict(cfg)
    return sorted(k for k in saved.keys() | now.keys()
                  if k not in _PER_INVOCATION and saved.get(k, defaults.get(k)) != now.get(k, defaults.get(k)))


def autocast_context(compute_dtype: str, device: torch.device):
    """A context factory: bf16 autocast when ``compute_dtype`` (or, for "auto", the dtype policy of
    ``d3d.cpu.precision``) says bf16, else nothing. Weights, optimizer state and the loss stay fp32.

    On a CPU with bf16 matmuls a training step under bf16 autocast takes a fraction of fp32's
    (docs/results.md, "Measurements behind the code")."""
    dtype = resolve_dtype(compute_dtype, device)
    if dtype == torch.float32:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)


__all__ = ["train_loop", "LoopResult", "TrainSettings", "autocast_context", "schedule_lr"]
