"""What quantized weights cost in quality: bits/byte on unseen Python and prose, and greedy agreement.

For each weights choice the model's bits/byte is measured teacher-forced over the same windows of
(1) numpy's sources (third-party Python no d3d model trained on) and (2) the Python documentation's
reStructuredText sources (prose; ``apt-get install python3.11-doc``), and its greedy answers to the
chat requests (HumanEval code requests and MT-Bench questions, evaluation prompts) are compared with
the reference's (the first choice, ``fp32`` by default) token by token: the share of positions that
agree and the share of answers that are identical.

    fp32     the checkpoint dequantized (for a convert-gguf checkpoint: the GGUF's exact values)
    auto     what ``load_model`` holds by default (a convert-gguf checkpoint: its own blocks)
    int8     every matrix of the fp32 model re-quantized by d3d: one scale per row
    int4     every matrix of the fp32 model re-quantized by d3d: groups of 32 with a scale and a min

    python -m bench quality --model DIR [--weights fp32 auto int8 int4] [--windows 32] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import d3d
from d3d.assets import BUNDLED_TARGET, bundled
from d3d.data.corpus import read_texts
from d3d.data.prompts import docs_root, load_prompt_set
from d3d.train.target import evaluate, heldout_windows, token_byte_lengths, token_stream

from .common import machine, markdown_table, write_json
from .target import numpy_files


def load(path: Path, weights: str):
    if weights in ("int8", "int4"):  # d3d's own quantization of the dense values
        return d3d.load_model(path, weights="fp32").quantize_(weights)
    return d3d.load_model(path, weights=weights)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench quality", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="target directory (default: the bundled target)")
    ap.add_argument("--weights", nargs="+", default=["fp32", "auto", "int8", "int4"],
                    choices=["fp32", "auto", "int8", "int4"], help="choices to compare; the first is the reference")
    ap.add_argument("--windows", type=int, default=32, help="256-token windows per text set (default 32)")
    ap.add_argument("--n-code", type=int, default=8, help="code requests for the agreement (default 8)")
    ap.add_argument("--n-prose", type=int, default=4, help="prose requests for the agreement (default 4)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    path = Path(args.model) if args.model else bundled(BUNDLED_TARGET)
    tok = d3d.load_tokenizer(path)
    docs = sorted(docs_root().rglob("*.rst.txt")) if docs_root().is_dir() else []
    if not docs:
        raise SystemExit(f"bench quality: no Python documentation under {docs_root()} "
                         "(apt-get install python3.11-doc, or set D3D_PYDOCS)")
    texts = {"python (numpy sources)": numpy_files(), "prose (Python docs)": docs}
    windows = {name: heldout_windows(token_stream(tok, read_texts(files)), 257, args.windows)
               for name, files in texts.items()}
    requests = load_prompt_set("humaneval", tok, args.n_code, chat=True) + \
        load_prompt_set("mtbench", tok, args.n_prose, chat=True)
    stops = sorted(set(tok.stop_token_ids()))
    nbytes = token_byte_lengths(tok)
    rows, answers = {}, {}
    for weights in args.weights:
        start = time.perf_counter()
        model = load(path, weights)
        row = {"held": model.weights}
        with torch.no_grad():
            for name, w in windows.items():
                row[name] = evaluate(model, w, nbytes, batch=4)["bits_per_byte"]
        answers[weights] = [d3d.generate(model, ids, max_new_tokens=args.new_tokens, stop_ids=stops).tokens[0]
                            for ids in requests]
        rows[weights] = row
        print(f"{weights}: {row} ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        del model
    ref = args.weights[0]
    for weights, row in rows.items():
        same = [sum(a == b for a, b in zip(x, y)) / max(len(x), len(y), 1)
                for x, y in zip(answers[weights], answers[ref])]
        row["agreement_with_" + ref] = sum(same) / len(same)
        row["identical_answers"] = sum(x == y for x, y in zip(answers[weights], answers[ref]))
        for name in windows:
            row[f"{name} vs {ref}"] = row[name] - rows[ref][name]
    names = list(windows)
    print(markdown_table(["weights", "held as"] + [f"{n} bits/byte (vs {ref})" for n in names]
                         + [f"tokens agreeing with {ref}", "identical answers"],
                         [[w, r["held"]] + [f"{r[n]:.4f} ({r[f'{n} vs {ref}']:+.4f})" for n in names]
                          + [f"{r['agreement_with_' + ref]:.1%}", f"{r['identical_answers']}/{len(requests)}"]
                          for w, r in rows.items()]))
    payload = {"bench": "quality", "machine": machine(), "config": {**vars(args), "model": str(path)},
               "windows": {n: int(w.shape[0]) for n, w in windows.items()}, "requests": len(requests), "results": rows}
    write_json(args.out, payload)
    return payload
