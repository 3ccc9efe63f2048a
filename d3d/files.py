"""Atomic file writes: every file d3d writes (checkpoints, configs, summaries, bench JSON) goes
through a temporary file in the same directory and one ``os.replace`` at the end, so a write
killed half-way (Ctrl-C, SIGTERM at the end of a training chunk, a machine taken away) leaves the
previous file or none, never half a file that loads as garbage."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic(path: str | Path):
    """``with atomic(path) as tmp:`` write ``tmp``; on success it replaces ``path``, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~current_umask())  # as open() would create it (safetensors writes 0600)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | Path, obj) -> None:
    """``obj`` as indented JSON with a final newline, atomically."""
    with atomic(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2) + "\n")
