"""Build-on-first-use for the C++ CPU kernels (``skinny_gemm.cpp``, ``quant_gemm.cpp``, ``quant_vnni.cpp``).

Triton has no CPU backend outside the interpreter, so the CPU matmuls of decoding are small C++
files compiled by ``torch.utils.cpp_extension`` with the system compiler the first time they are
needed (tens of seconds a kernel; cached under ``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``,
a directory per Python environment, ``build_directory``, from a copy of the sources there, ``stage``: checkouts
of the same code share an environment's builds, and no environment's build undoes another's).
A build says so on stderr when it starts and when it ends, so that a first run does not sit in
silence; ``python -m d3d build-kernels`` builds them ahead of time. Where the CPU lacks
the instructions or the build fails, ``build`` returns why, and the caller keeps a torch path.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from pathlib import Path

from ..files import atomic
from ..hardware import cpu_flags

AVX2_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]
AVX2 = frozenset({"avx2", "fma"})
NOTICE_AFTER_S = 2.0  # a cached build loads in well under this; a longer load is compiling
STALE_LOCK_S = 300.0  # a build takes ~35 s; a lock this old was left by a build that was killed


def module_of(loaded: tuple, what: str):
    """The module of a ``build`` result, or a RuntimeError naming ``what`` and why it is unavailable."""
    module, why = loaded
    if module is None:
        raise RuntimeError(f"{what}: unavailable: {why}")
    return module


def build(name: str, source: Path, cflags: list[str], needs: frozenset[str] = AVX2) -> tuple[object | None, str | None]:
    """``(module, None)``, or ``(None, why not)`` where this CPU (it lacks a flag of ``needs``) or
    machine cannot build ``source``."""
    missing = needs - cpu_flags()
    if missing:
        return None, f"this CPU lacks {' and '.join(sorted(missing))}"
    try:
        from torch.utils.cpp_extension import load

        where = build_directory(name)
        wait_for_lock(where / "lock")
        staged = stage(source, where / "src")
        # a cached build loads in well under a second; past 2 s it is compiling (first use, or a
        # changed source or flag): say so then, so that no first run sits in silence
        said = threading.Event()

        def say():
            said.set()
            print(f"d3d: building the CPU kernel {source.name} once (~35 s on 2 cores); cached in {where}",
                  file=sys.stderr, flush=True)

        timer = threading.Timer(NOTICE_AFTER_S, say)
        start = time.perf_counter()
        timer.start()
        try:
            # torch rebuilds when a source or a flag changes, not a header: the headers' hash is a flag
            headers = hashlib.sha1(b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))).hexdigest()[:12]
            module = load(name=name, sources=[str(staged)], verbose=False, build_directory=str(where),
                          extra_cflags=cflags + [f"-DD3D_HEADERS={headers}"], extra_ldflags=["-fopenmp"])
        finally:
            timer.cancel()
        if said.is_set():
            print(f"d3d: built {source.name} in {time.perf_counter() - start:.0f} s; later runs load it at once",
                  file=sys.stderr, flush=True)
    except Exception as e:  # no compiler, no ninja, a failed build: the torch path stays
        return None, f"building {source.name} failed ({type(e).__name__}: {str(e).strip().splitlines()[-1][:200]})"
    return module, None


def build_directory(name: str) -> Path:
    """Where ``name`` is built: under torch's extensions folder, one directory per Python environment. ninja
    rebuilds whenever a build's command changes, and another environment's include paths change it, so checkouts
    run with two environments (a CI clone's ``.venv`` beside the working one) had rebuilt every kernel after each
    other, 4-7 min a switch, and each such build left a window for a killed build's lock."""
    from torch.utils.cpp_extension import _get_build_directory, include_paths

    key = hashlib.sha1("\0".join([sys.prefix, *include_paths()]).encode()).hexdigest()[:8]
    return Path(_get_build_directory(f"{name}-{key}", verbose=False))


def stage(source: Path, into: Path) -> Path:
    """``source`` and the headers beside it, copied into ``into`` where their bytes differ (rewritten only then); the
    copy of ``source``. torch's ninja file names a source by its path, so two checkouts of the same code run with one
    environment had each rebuilt every kernel after the other (4-7 min a switch); built from one path whose files
    are unchanged, ninja finds nothing to do."""
    for f in [source, *sorted(source.parent.glob("*.h"))]:
        data, dest = f.read_bytes(), into / f.name
        if not dest.is_file() or dest.read_bytes() != data:
            with atomic(dest) as tmp:
                tmp.write_bytes(data)
    return into / source.name


def wait_for_lock(lock: Path, poll_s: float = 1.0) -> None:
    """torch's builder waits, silently and forever, while its lock file exists. Wait here instead while another
    process builds, saying so once, and remove a lock older than ``STALE_LOCK_S``: a build that was killed (Ctrl-C
    during a first run, a test's timeout) leaves one behind, and a lock only minutes old had hung the next run."""
    said = False
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > STALE_LOCK_S:
            print(f"d3d: removing {lock}, left {age:.0f} s ago by a build that did not finish", file=sys.stderr,
                  flush=True)
            lock.unlink(missing_ok=True)
            return
        if not said:
            print(f"d3d: waiting for another process's build ({lock} is {age:.0f} s old; taken as left by a killed "
                  f"build at {STALE_LOCK_S:.0f} s)", file=sys.stderr, flush=True)
            said = True
        time.sleep(poll_s)
