"""Every script under docs/results/ runs against today's API, or it is gone (git keeps it:
``git log --diff-filter=D -- docs/results``).

The scripts measure for minutes to hours, so they are not run here. Instead:

- Python scripts are compiled, and every name they take from ``d3d`` or ``bench`` is resolved on the
  real package: imports, attribute chains on modules and classes (read or monkeypatched), the
  arguments of every call to a d3d/bench function (bound to its signature: ``generate(mode=...)``
  fails), spec strings (``spec="sync lookup=3"``, parsed as ``generate`` would) and the fields read
  from ``out.stats``. A script with an argument parser also runs ``--help``.
- Shell scripts run with a stand-in ``python`` first on PATH, in a copy of docs/results/, so each
  ``python -m d3d|bench ...`` line is only recorded; then every recorded command is parsed by the real
  argument parser (``python -m d3d``'s, ``bench speculative``'s with each ``--modes`` entry made into a
  spec), and inline Python (``python -c``, ``python - <<PY``) gets the Python checks.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import inspect
import io
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PY_SCRIPTS = sorted(RESULTS.rglob("*.py"))
SH_SCRIPTS = sorted(RESULTS.rglob("*.sh"))
OURS = ("d3d", "bench")


def _ours(name: str | None) -> bool:
    return bool(name) and name.split(".")[0] in OURS


def _attribute(obj, name: str):
    """``obj.name`` for a module (importing a submodule if need be) or a class (fields and annotations
    count); raises AttributeError where it does not exist. Other objects are not checked (None)."""
    if isinstance(obj, types.ModuleType):
        if hasattr(obj, name):
            return getattr(obj, name)
        try:
            return importlib.import_module(f"{obj.__name__}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"{obj.__name__} has no {name}") from None
    if isinstance(obj, type):
        if hasattr(obj, name):
            return getattr(obj, name)
        known = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        for klass in obj.__mro__:
            known |= set(getattr(klass, "__annotations__", {}))
        if name not in known:
            raise AttributeError(f"{obj.__qualname__} has no {name}")
    return None


class PythonCheck(ast.NodeVisitor):
    """The static checks of one Python source (module docstring)."""

    def __init__(self):
        self.names: dict[str, object] = {}  # local name -> the d3d/bench object it was imported as
        self.problems: list[str] = []

    def problem(self, node, text: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {text}")

    def imports(self, tree) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if not _ours(alias.name):
                        continue
                    try:
                        module = importlib.import_module(alias.name)
                    except ImportError as e:
                        self.problem(node, f"import {alias.name}: {e}")
                        continue
                    if alias.asname:
                        self.names[alias.asname] = module
                    else:
                        top = alias.name.split(".")[0]
                        self.names[top] = importlib.import_module(top)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and _ours(node.module):
                try:
                    module = importlib.import_module(node.module)
                except ImportError as e:
                    self.problem(node, f"from {node.module} import ...: {e}")
                    continue
                for alias in node.names:
                    try:
                        self.names[alias.asname or alias.name] = _attribute(module, alias.name)
                    except AttributeError:
                        self.problem(node, f"from {node.module} import {alias.name}: no such name")

    def resolve(self, node):
        """The d3d/bench object an expression names, or None (not ours, or not known statically)."""
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if base is None:
                return None
            try:
                return _attribute(base, node.attr)
            except AttributeError as e:
                self.problem(node, str(e))
        return None

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Attribute) and node.value.attr == "stats":  # out.stats.NAME
            from d3d import GenerationStats

            try:
                _attribute(GenerationStats, node.attr)
            except AttributeError as e:
                self.problem(node, str(e))
        if self.resolve(node) is None:
            self.generic_visit(node)

    def visit_Call(self, node):
        func = self.resolve(node.func)
        if callable(func) and not isinstance(func, types.ModuleType):
            self.bind(node, func)
        self.generic_visit(node)

    def bind(self, node, func) -> None:
        try:
            sig = inspect.signature(func)
        except (TypeError, ValueError):
            return
        name = getattr(func, "__qualname__", repr(func))
        params = sig.parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for kw in node.keywords:
            if kw.arg is not None and kw.arg not in params and not takes_any:
                self.problem(node, f"{name}() has no argument {kw.arg!r}")
        if not any(isinstance(a, ast.Starred) for a in node.args) and all(kw.arg for kw in node.keywords):
            try:
                sig.bind(*node.args, **{kw.arg: kw.value for kw in node.keywords})
            except TypeError as e:
                self.problem(node, f"{name}(): {e}")
        for kw in node.keywords:
            if kw.arg == "spec" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                from d3d import SpecConfig

                try:
                    SpecConfig.parse(kw.value.value)
                except ValueError as e:
                    self.problem(node, f"spec={kw.value.value!r}: {e}")


def check_python(source: str) -> list[str]:
    tree = ast.parse(source)
    check = PythonCheck()
    check.imports(tree)
    check.visit(tree)
    return list(dict.fromkeys(check.problems))


@pytest.mark.parametrize("path", PY_SCRIPTS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_python_script_uses_only_what_exists(path):
    problems = check_python(path.read_text())
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", [p for p in PY_SCRIPTS if "ArgumentParser(" in p.read_text()],
                         ids=lambda p: str(p.relative_to(RESULTS)))
def test_python_script_with_a_parser_answers_help(path):
    proc = subprocess.run([sys.executable, str(path), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-2000:]


STAND_IN = """#!/bin/bash
# records one python command line (NUL-separated words, then the stdin of "python -", then a record mark)
{ printf '%s\\0' "$@"; if [ "${1:-}" = "-" ]; then printf 'STDIN\\0'; cat; printf '\\0'; fi; printf 'END\\0'; } >> "$D3D_PYTHON_LOG"
"""


def recorded_commands(script: Path, tmp: Path) -> list[list[str]]:
    """The python command lines ``script`` runs, each as its words (a ``python -`` line's stdin after
    "STDIN"), from a run in a copy of docs/results/ with the stand-in python first on PATH."""
    copy = tmp / "tree"
    if not copy.exists():
        shutil.copytree(RESULTS, copy / "docs" / "results", ignore=shutil.ignore_patterns("*.json", "*.png", "*.txt"))
        (tmp / "bin").mkdir()
        for name in ("python", "python3"):
            (tmp / "bin" / name).write_text(STAND_IN)
            (tmp / "bin" / name).chmod(0o755)
        (tmp / "home").mkdir()
    log = tmp / f"{script.stem}.log"
    log.write_bytes(b"")
    env = {"PATH": f"{tmp / 'bin'}:{os.environ['PATH']}", "HOME": str(tmp / "home"), "D3D_PYTHON_LOG": str(log)}
    positional = ["."] * 4 if re.search(r"\$\{?1\b", script.read_text()) else []  # directories; else "$@" flags
    proc = subprocess.run(["bash", str(copy / script.relative_to(ROOT))] + positional, cwd=copy, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{script.relative_to(ROOT)} failed with the stand-in python: {proc.stderr[-2000:]}"
    words = log.read_bytes().decode().split("\0")
    commands, current = [], []
    for word in words:
        if word == "END":
            commands.append(current)
            current = []
        else:
            current.append(word)
    return commands


def parse_d3d(argv: list[str]) -> None:
    from d3d.__main__ import build_parser

    build_parser().parse_args(argv)


def parse_bench(argv: list[str]) -> None:
    from bench import run

    known = {line.split()[0] for line in run.__doc__.splitlines() if line.startswith("  ") and line.split()
             and not line.startswith("   ")}
    if not argv or argv[0] not in known:
        raise SystemExit(f"python -m bench {argv[:1]}: not a bench command ({', '.join(sorted(known))})")
    if argv[0] == "speculative":
        from bench.common import bench_spec
        from bench.speculative import parser

        args = parser().parse_args(argv[1:])
        store = types.SimpleNamespace(at=lambda confidence: None)
        for mode in args.modes:
            bench_spec("ar" if mode == "ar-fp32" else mode, store)


def check_command(words: list[str]) -> list[str]:
    """What is wrong with one recorded python command line (empty if nothing)."""
    line = " ".join(words)[:200]
    if "STDIN" in words:
        return check_python(words[words.index("STDIN") + 1])
    if words[:1] == ["-c"]:
        return check_python(words[1])
    if words[:1] == ["-m"] and words[1:2] in (["d3d"], ["bench"]):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                (parse_d3d if words[1] == "d3d" else parse_bench)(words[2:])
        except SystemExit as e:
            why = e.code if isinstance(e.code, str) else (err.getvalue().strip().splitlines() or ["?"])[-1]
            return [f"python {line}: {why}"]
        return []
    if words and words[0].endswith(".py"):
        return [] if (ROOT / words[0]).is_file() else [f"python {line}: no such script"]
    return [f"python {line}: not a command this test knows how to check"]


@pytest.mark.parametrize("path", SH_SCRIPTS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_shell_script_commands_parse(path, tmp_path_factory):
    tmp = tmp_path_factory.getbasetemp() / "results-scripts"
    tmp.mkdir(exist_ok=True)
    commands = recorded_commands(path, tmp)
    assert commands, f"{path.relative_to(ROOT)} ran no python command with the stand-in"
    problems = [p for words in commands for p in check_command(words)]
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(dict.fromkeys(problems))
