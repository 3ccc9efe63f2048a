"""``python -m d3d demo`` (``make demo``): a speculative answer next to plain decoding, measured in one run.

It loads a target and the drafter that fits it, warms both modes up, decodes the prompt with ``ar``,
then streams the speculative mode's answer, and ends with one line: tokens per second of each, τ,
the speed ratio, and whether the two outputs are identical token for token (greedy decoding is
lossless, so anything but "yes" is a bug: the command then exits with 1).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .assets import BUNDLED_TARGET, models_dir
from .cpu.linear import matmul_path
from .decode.config import SpecConfig
from .decode.engines import generate
from .draft.pick import decide_mode, default_draft_model, pick_drafter
from .fetch import model_dir as real_model_dir
from .model.checkpoint import load_model
from .model.tokenizer import StreamPrinter, load_tokenizer

CODE_PROMPT = "def read_config(path):"
CHAT_PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def log(msg: str) -> None:
    print(f"d3d demo: {msg}", file=sys.stderr, flush=True)


def run_demo(model: str | Path | None = None, drafter: str | Path | None = None, mode: str | None = None,
             prompt: str | None = None, chat: bool = False, max_new_tokens: int = 128, weights: str = "auto",
             out=None) -> int:
    out = out or sys.stdout
    model_dir = Path(model) if model else models_dir() / BUNDLED_TARGET
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"--model {model_dir}: no config.json there (expected a HF checkpoint directory)")
    start = time.perf_counter()
    log(f"loading the target {model_dir} (a first run also builds the CPU kernels, ~35 s each, said when it happens)")
    target = load_model(model_dir, weights=weights)
    tok = load_tokenizer(model_dir)
    mode, draft, note = pick_drafter(target, decide_mode(mode, target.device, "d3d"), drafter)  # a speculative mode
    chains = default_draft_model(target) if mode == "sync" else None  # the 1.5B: the 0.5B's, as generate's defaults
    if chains:
        note += f"{'; ' if note else ''}draft model: {chains}"
    spec = SpecConfig(mode, draft_model=load_model(real_model_dir(chains), weights=weights) if chains else None)
    log(f"loaded in {time.perf_counter() - start:.1f} s: {target.weights} weights, matmuls on "
        f"{matmul_path(target)}; mode {mode}" + (f"; {note}" if note else ""))
    prompt = prompt or (CHAT_PROMPT if chat else CODE_PROMPT)
    ids = tok.encode_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
    stops = sorted(set(tok.stop_token_ids()) | set(target.cfg.eos_token_ids))
    common = dict(max_new_tokens=max_new_tokens, stop_ids=stops)
    log("warming up both modes (8 tokens each)")
    generate(target, ids, max_new_tokens=8, stop_ids=stops, spec="ar")
    generate(target, ids, drafter=draft, max_new_tokens=8, stop_ids=stops, spec=spec)
    log(f"decoding with ar (up to {max_new_tokens} tokens, not shown)")
    ar = generate(target, ids, spec="ar", **common)
    log(f"decoding with {mode}, streamed:")
    print(("" if chat else prompt), end="", file=out, flush=True)
    fast = generate(target, ids, drafter=draft, stream=StreamPrinter(tok, out), spec=spec, **common)
    print(file=out)
    identical = fast.tokens == ar.tokens
    a, s = ar.stats, fast.stats
    print(f"{mode}: {s.total_generated} tokens at {s.tokens_per_second:.1f} tok/s, τ {s.tau:.2f} | "
          f"ar: {a.total_generated} tokens at {a.tokens_per_second:.1f} tok/s | "
          f"{s.tokens_per_second / a.tokens_per_second:.2f}x ar, identical to ar: {'yes' if identical else 'NO'}",
          file=out, flush=True)
    if not identical:
        log("the speculative output differs from ar: please report it with `python -m d3d doctor`")
    return 0 if identical else 1
