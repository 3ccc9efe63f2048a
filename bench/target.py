"""How well a small target writes Python, on code it never trained on (issue 19's measures).

  bits/byte    over the standard-library *evaluation* files of the python-sources corpus (split by
               a hash of the content, so never trained on) and over numpy's sources (kept out of
               every training corpus here: third-party code)
  completions  greedy completions of numpy function heads (signature + docstring, dedented), cut
               where the function ends (the first line back at the ``def``'s indentation, or the
               last complete line when the budget runs out); the share that parses as Python
               (``ast.parse``) and has at least one statement after the docstring; the share that
               loops (greedy repetition: fewer than half of 6+ lines distinct); the share that is
               sensible (parses, ends where the function ends, does not loop); with samples
  speed        AR tokens/s of the target in the policy's dtype (batch 1, greedy; median)

    python -m bench target [--model DIR] [--n 100] [--max-tokens 300000] [--out FILE]
"""

from __future__ import annotations

import argparse
import ast
import random
import statistics
import sys
import textwrap
import time
from pathlib import Path

import torch

import d3d
from d3d.assets import BUNDLED_TARGET, bundled
from d3d.data.corpus import default_corpus_root, find_corpus, read_texts
from d3d.train.target import evaluate, heldout_windows, token_byte_lengths, token_stream

from .common import machine, markdown_table, write_json


def numpy_files() -> list[Path]:
    try:
        import numpy
    except ImportError:
        raise SystemExit("bench target: numpy is not installed (pip install numpy): its sources are the unseen "
                         "third-party code this bench measures on") from None
    return sorted(Path(numpy.__file__).parent.rglob("*.py"))


def stdlib_evaluation_files() -> list[Path]:
    """python-sources evaluation files that come from the standard library."""
    stdlib = default_corpus_root().resolve()
    return [p for p in find_corpus("python-sources").part("evaluation") if p.resolve().is_relative_to(stdlib)]


def bits_per_byte(model, tok, files: list[Path], seq_len: int, max_tokens: int) -> dict:
    stream = token_stream(tok, read_texts(files))[:max_tokens]
    with torch.autocast("cpu", enabled=False):
        ev = evaluate(model, heldout_windows(stream, seq_len + 1), token_byte_lengths(tok).to(model.device))
    return {"files": len(files), "tokens": ev["tokens"], "loss": ev["loss"], "bits_per_byte": ev["bits_per_byte"]}


def function_heads(files: list[Path], n: int, seed: int = 0, max_head_lines: int = 40) -> list[dict]:
    """``n`` functions with a docstring, drawn at random: {file, name, head (dedented, ends with a
    newline), indent}."""
    heads = []
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(node) is None:
                continue
            if len(node.body) < 2 or node.body[0].end_lineno - node.lineno > max_head_lines:
                continue  # docstring-only functions have nothing to complete
            head = textwrap.dedent("".join(lines[node.lineno - 1: node.body[0].end_lineno]))
            if head.startswith(("def ", "async def ")):
                heads.append({"file": str(path), "name": node.name, "head": head})
    random.Random(seed).shuffle(heads)
    return heads[:n]


def cut_function(completion: str) -> tuple[str, bool]:
    """The completion up to where the function ends: the first non-blank line at column 0 (or
    ``<|endoftext|>``); without one, up to the last complete line. Returns (body, ended)."""
    completion, eot, _ = completion.partition("<|endoftext|>")
    out = []
    for line in completion.splitlines(keepends=True):
        if line.strip() and not line[0].isspace():
            return "".join(out), True
        out.append(line)
    if out and not out[-1].endswith("\n") and not eot:
        out.pop()  # a line cut by the token budget
    return "".join(out), bool(eot)


def has_statement(head: str, body: str) -> bool:
    try:
        fn = ast.parse(head + body).body[0]
    except SyntaxError:
        return False
    return len(fn.body) > 1


def loops(body: str, min_lines: int = 6) -> bool:
    """Greedy decoding of a small model repeats itself: ``min_lines`` or more non-blank lines of
    which fewer than half are distinct. Such a body can parse and still be no function."""
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    return len(lines) >= min_lines and len(set(lines)) < len(lines) / 2


def completion_rates(rows: list[dict]) -> dict:
    """Shares of completions that parse (with a statement), that loop, and that are *sensible*:
    parse, end where the function ends (within the budget) and do not loop."""
    n = max(len(rows), 1)
    looping = [loops(r["completion"]) for r in rows]
    return {"parse_rate": sum(r["parses"] for r in rows) / n, "loop_rate": sum(looping) / n,
            "sensible_rate": sum(r["parses"] and r["ended"] and not lp for r, lp in zip(rows, looping)) / n}


def completions(model, tok, heads: list[dict], max_new: int) -> dict:
    rows = []
    for h in heads:
        ids = tok.encode(h["head"])
        out = d3d.generate(model, ids, max_new_tokens=max_new, stop_ids=[tok.token_id("<|endoftext|>")])
        body, ended = cut_function(tok.decode(out.tokens[0], skip_special_tokens=False))
        try:
            ast.parse(h["head"] + body)
            parses = has_statement(h["head"], body)
        except SyntaxError:
            parses = False
        rows.append({"file": h["file"], "name": h["name"], "parses": parses, "ended": ended, "loops": loops(body),
                     "head": h["head"], "completion": body})
    return {"n": len(rows), **completion_rates(rows), "rows": rows}


def ar_speed(model, tok, prompts: list[str], new_tokens: int = 128, repeats: int = 3) -> float:
    rates = []
    for _ in range(repeats):
        for p in prompts:
            t = time.perf_counter()
            out = d3d.generate(model, tok.encode(p), max_new_tokens=new_tokens, stop_ids=[])
            rates.append(out.stats.total_generated / (time.perf_counter() - t))
    return statistics.median(rates)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench target", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="target directory (default: the bundled target)")
    ap.add_argument("--n", type=int, default=100, help="function heads to complete (default 100)")
    ap.add_argument("--max-new-tokens", type=int, default=160, help="completion budget per head (default 160)")
    ap.add_argument("--max-tokens", type=int, default=300_000, help="tokens per bits/byte measurement (default 300k)")
    ap.add_argument("--seq-len", type=int, default=256, help="window length of the bits/byte measurement")
    ap.add_argument("--samples", type=int, default=4, help="completions shown in the output (default 4)")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    model_dir = Path(args.model) if args.model else bundled(BUNDLED_TARGET)
    model, tok = d3d.load_model(model_dir), d3d.load_tokenizer(model_dir)
    fp32 = d3d.load_model(model_dir, dtype="float32")  # bits/byte in fp32: a property of the weights
    np_files = numpy_files()
    print(f"bits/byte: standard-library evaluation files, numpy sources ({len(np_files)} files)", file=sys.stderr)
    bpb = {"stdlib_evaluation": bits_per_byte(fp32, tok, stdlib_evaluation_files(), args.seq_len, args.max_tokens),
           "numpy": bits_per_byte(fp32, tok, np_files, args.seq_len, args.max_tokens)}
    print(f"completions of {args.n} numpy function heads", file=sys.stderr)
    comp = completions(model, tok, function_heads(np_files, args.n), args.max_new_tokens)
    speed = ar_speed(model, tok, ["def read_config(path):\n", "import os\n\n\nclass Cache:\n"])
    rows = [[k, v["tokens"], f"{v['bits_per_byte']:.3f}"] for k, v in bpb.items()]
    print(markdown_table(["held-out text", "tokens", "bits/byte"], rows))
    print(f"\ncompletions of {comp['n']} heads: {comp['parse_rate']:.0%} parse, {comp['loop_rate']:.0%} loop, "
          f"{comp['sensible_rate']:.0%} sensible (parse, end, no loop); AR {speed:.0f} tok/s "
          f"({str(model.dtype).removeprefix('torch.')})")
    for r in comp["rows"][:args.samples]:
        verdict = ("parses" if r["parses"] else "does not parse") + (", loops" if r["loops"] else "")
        print(f"\n--- {r['name']} ({verdict})\n{r['head']}{r['completion']}")
    payload = {"bench": "target", "machine": machine(), "model": str(model_dir),
               "parameters": model.cfg.num_parameters(), "dtype": str(model.dtype).removeprefix("torch."),
               "bits_per_byte": bpb, "completions": comp, "ar_tok_s": speed, "config": vars(args)}
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
