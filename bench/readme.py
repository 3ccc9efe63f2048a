"""``python -m bench readme``: the README's two results tables, generated from committed JSON.

The README holds each table between ``<!-- bench readme: NAME -->`` and ``<!-- /bench readme -->``;
``--write README.md`` replaces them, and a test fails when the README differs from what this prints,
so every figure the README quotes comes from a committed JSON.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from .common import markdown_table

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = "docs/results/layers-cpu/bundled_speculative.json"
REAL = "docs/results/library/llamacpp_0.5b.json"
MARK = re.compile(r"(<!-- bench readme: (\w+) -->\n)(.*?)(<!-- /bench readme -->)", re.S)


def _machine(m: dict) -> str:
    flags = ", ".join(m.get("cpu_flags") or []) or "no AVX-512"
    return f"{m.get('cpu', '?')} ({flags}), {m.get('torch_threads', m.get('cores', '?'))} threads"


def bundled_table(path: str = BUNDLED) -> str:
    """The bundled pair: τ and speed over the fastest ar per prompt set, for the modes a reader compares."""
    p = json.loads((ROOT / path).read_text())
    modes = [("sync", "sync (CPU default)"), ("async", "async D3D"), ("dflash", "DFlash")]
    rows = []
    for name, res in p["results"].items():
        ar = res["ar"]
        row = [name, f"{ar['tok_s']:.0f}"]
        for mode, _ in modes:
            r = res.get(mode)
            row.append("–" if r is None else
                       f"{r['tau']:.2f} / {r.get('speedup_vs_fastest_ar', r['speedup_vs_ar']):.2f}x")
        row.append(f"{res['sync']['identical_to_ar']}/{p['config']['n']}")
        rows.append(row)
    table = markdown_table(["prompts", "ar tok/s"] + [f"{label}: τ / vs ar" for _, label in modes]
                           + ["sync equal to ar"], rows)
    cfg = p["config"]
    return (f"{table}\n\n{_machine(p['machine'])}, {cfg['dtype_used']} (the dtype policy's choice), "
            f"{cfg['n']} prompts per set, {cfg['new_tokens']} new tokens, T = 0, B = {cfg['block_size']}; "
            f"`{path}`.\n")


def real_table(path: str = REAL) -> str:
    """Qwen2.5-Coder-0.5B-Instruct against llama.cpp on the same GGUF and machine."""
    p = json.loads((ROOT / path).read_text())
    names = {"llama-ar": "llama.cpp AR", "llama-lookup": "llama.cpp prompt lookup",
             "d3d-ar": "d3d `ar`", "d3d": "d3d defaults (`sync`)"}
    med, vs = p["median_tok_s"], p["vs_llama_ar"]
    sets = [s for s in ("code", "library", "prose") if s in med]
    rows = [[label] + [f"{med[s][k]:.1f} ({vs[s][k]:.2f}x)" for s in sets] for k, label in names.items()]
    cfg = p["config"]
    asked = f"{cfg['n_code']} HumanEval + " + (f"{cfg['n_library']} held-out library function + " if "library" in med
                                                 else "") + f"{cfg['n_prose']} MT-Bench"
    return (markdown_table(["engine"] + [f"{s} tok/s (vs llama.cpp)" for s in sets], rows)
            + f"\n\n{_machine(p['machine'])}; d3d weights {p['d3d_weights']} (the GGUF's blocks); "
            f"{asked} chat requests, ≤ {cfg['new_tokens']} tokens, "
            f"end-to-end medians; speculative output equal to ar on {p['speculative_equal_to_ar']}; `{path}`.\n")


TABLES = {"bundled": bundled_table, "real": real_table}


def render(text: str) -> str:
    """``text`` with every marked table regenerated."""
    def fill(m):
        if m.group(2) not in TABLES:
            raise ValueError(f"unknown README table {m.group(2)!r}; known: {', '.join(TABLES)}")
        return m.group(1) + TABLES[m.group(2)]() + m.group(4)
    return MARK.sub(fill, text)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench readme", description=__doc__)
    ap.add_argument("--write", metavar="README", help="rewrite the marked tables of this file in place")
    args = ap.parse_args(argv)
    if not args.write:
        for name, make in TABLES.items():
            print(f"<!-- bench readme: {name} -->\n{make()}<!-- /bench readme -->\n")
        return
    path = Path(args.write)
    old = path.read_text()
    if not MARK.search(old):
        raise SystemExit(f"{path}: no '<!-- bench readme: NAME -->' block to fill")
    from d3d.files import atomic

    with atomic(path) as tmp:
        tmp.write_text(render(old))
    print(f"wrote {path}")
