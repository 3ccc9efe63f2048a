"""d3d/env.py is the one place d3d reads the environment: what it lists, how it reads, and that
docs/design.md and the vocabularies elsewhere say the same."""

import re
from pathlib import Path

import pytest

from d3d import env

ROOT = Path(__file__).resolve().parent.parent


def test_only_env_module_reads_the_environment():
    """No module under d3d/ but d3d/env.py reads os.environ or getenv (a new variable goes in VARIABLES)."""
    readers = re.compile(r"\benviron\b|\bgetenv\b")
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "d3d").rglob("*"))
                 if p.suffix in (".py", ".cpp", ".h") and p != ROOT / "d3d" / "env.py"
                 and readers.search(p.read_text())]
    assert not offenders, f"read the environment with d3d.env.read, not os.environ: {offenders}"


def test_every_name_read_is_listed():
    """Every env.read("NAME") under d3d/ names a listed variable, and every listed variable is read."""
    read = set()
    for path in (ROOT / "d3d").rglob("*.py"):
        read |= set(re.findall(r"env\.read\(\"(\w+)\"\)", path.read_text()))
    assert read == set(env.VARIABLES), (sorted(read - set(env.VARIABLES)), sorted(set(env.VARIABLES) - read))


def test_design_lists_the_variables():
    """docs/design.md's "Environment variables" table has one row per variable of d3d/env.py, no more."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = re.search(r"^### Environment variables\n(.*?)(?=^#|\Z)", text, re.S | re.M)
    assert section, "docs/design.md has no '### Environment variables' section"
    rows = re.findall(r"^\| `(\w+)`", section.group(1), re.M)
    assert len(rows) == len(set(rows)), f"listed twice: {sorted({r for r in rows if rows.count(r) > 1})}"
    assert set(rows) == set(env.VARIABLES), (sorted(set(rows) - set(env.VARIABLES)),
                                             sorted(set(env.VARIABLES) - set(rows)))


def test_the_suites_variables_are_read_in_one_place_and_listed():
    """A test file reads no environment variable but d3d's (and PATH): the suite's own go through
    tests/helpers.py's ``suite_env``, each listed in SUITE_VARIABLES and in design.md's table for them."""
    from helpers import SUITE_VARIABLES

    reads = re.compile(r"""(?:environ\.get\(|getenv\(|environ\[)\s*["'](\w+)["']""")
    for path in sorted((ROOT / "tests").glob("*.py")):
        if path.name != "helpers.py":
            names = set(reads.findall(path.read_text())) - set(env.VARIABLES) - {"PATH"}
            assert not names, f"{path.name} reads {sorted(names)}: use helpers.suite_env (SUITE_VARIABLES)"
    asked = set()
    for path in (ROOT / "tests").glob("*.py"):
        asked |= set(re.findall(r"suite_env\(\"(\w+)\"\)", path.read_text()))
    assert asked == set(SUITE_VARIABLES), (sorted(asked - set(SUITE_VARIABLES)), sorted(set(SUITE_VARIABLES) - asked))
    text = (ROOT / "docs" / "design.md").read_text()
    section = re.search(r"^### The test suite's variables\n(.*?)(?=^#|\Z)", text, re.S | re.M)
    assert section, "docs/design.md has no '### The test suite's variables' section"
    assert re.findall(r"^\| `(\w+)`", section.group(1), re.M) == list(SUITE_VARIABLES)


def test_choices_match_the_vocabularies_they_name():
    from d3d.cpu.precision import DTYPES, WEIGHTS

    assert set(env.VARIABLES["D3D_DTYPE"].values) == {"auto", *DTYPES}
    assert set(env.VARIABLES["D3D_WEIGHTS"].values) == set(WEIGHTS)


def test_read_choices_flags_and_paths(monkeypatch, tmp_path):
    monkeypatch.delenv("D3D_KERNELS", raising=False)
    assert env.read("D3D_KERNELS") == "auto"
    monkeypatch.setenv("D3D_KERNELS", " Torch ")
    assert env.read("D3D_KERNELS") == "torch"
    monkeypatch.setenv("D3D_KERNELS", "")
    assert env.read("D3D_KERNELS") == "auto"
    monkeypatch.setenv("D3D_KERNELS", "cuda")
    with pytest.raises(env.BadEnvironmentValue, match="D3D_KERNELS='cuda': expected one of auto, torch, triton"):
        env.read("D3D_KERNELS")
    for value, on in (("", False), ("0", False), ("1", True), ("yes", True)):
        monkeypatch.setenv("D3D_CHECKS", value)
        assert env.read("D3D_CHECKS") is on
    monkeypatch.setenv("D3D_CACHE", "")
    assert env.read("D3D_CACHE") is None
    monkeypatch.setenv("D3D_CACHE", str(tmp_path))
    assert env.read("D3D_CACHE") == tmp_path
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert env.read("XDG_CACHE_HOME") == tmp_path / ".cache"
    with pytest.raises(KeyError, match="D3D_NOPE"):
        env.read("D3D_NOPE")


def test_cache_root_follows_d3d_cache_then_xdg(monkeypatch, tmp_path):
    from d3d.fetch import cache_root

    monkeypatch.setenv("D3D_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.delenv("D3D_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "d3d"
