"""The README stays true: its results tables are what `python -m bench readme` makes from committed JSON,
and a newcomer finds what d3d is, the two commands and the test command on the first screen."""

from pathlib import Path

from bench.readme import MARK, render

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_results_tables_come_from_committed_json():
    assert {m.group(2) for m in MARK.finditer(README)} == {"bundled", "real"}
    assert render(README) == README, "README tables are stale: run `python -m bench readme --write README.md`"


def test_first_screen_has_the_two_commands_and_the_test_command():
    first = README.splitlines()[:40]
    assert any(line.startswith("make demo") for line in first) and any(line.startswith("make test") for line in first)
    assert any("python -m pytest -q" in line for line in README.splitlines()[:60])
    assert len(README.splitlines()) <= 230


def test_docs_the_readme_links_exist():
    import re

    for target in re.findall(r"\]\(((?:docs|models)/[^)#]+)", README):
        assert (ROOT / target).exists(), target


def test_layout_names_every_cli_command():
    """The layout's ``__main__.py`` line lists exactly the commands ``python -m d3d`` has (``train-*``
    standing for the training commands)."""
    import argparse
    import re

    from d3d.__main__ import build_parser

    line = re.search(r"^  __main__\.py +CLI: (.*)$", README, re.M).group(1)
    listed = {name.strip() for name in line.split(",")}
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    commands = {"train-*" if name.startswith("train-") else name for name in sub.choices}
    assert listed == commands, f"README's __main__.py line: missing {sorted(commands - listed)}, " \
                               f"not a command {sorted(listed - commands)}"


def test_first_screen_shows_what_make_demo_prints():
    """The first 40 lines show the demo's last line as the demo prints it (d3d/demo.py's format)."""
    import re

    first = "\n".join(README.splitlines()[:40])
    assert re.search(r"^sync: \d+ tokens at [\d.]+ tok/s, τ [\d.]+ \| ar: \d+ tokens at [\d.]+ tok/s \| "
                     r"[\d.]+x ar, identical to ar: yes$", first, re.M)
    assert "make demo MODEL=bundled" in first
