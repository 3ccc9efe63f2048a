"""A prompt's prefill with AMX's bf16 tiles against the int8 kernels: the pass's time by prompt length (the two taking
turns, medians) and what the tiles change in the model's predictions (the mean negative log-likelihood of the
prompt's next tokens, and how often the argmax differs), on the first T tokens of a standard-library module shown
for a summary. Run from the repository root:

    python docs/results/prefill-tiles/prefill.py MODEL OUT.json [REPS] [--lengths 24,32,...] [--min-rows N]

``--min-rows``: the prompt length from which the tiles are taken, for this run (``d3d.cpu.prefill.MIN_ROWS``): how it
was chosen.
"""
import os
import statistics
import sys

import torch

import d3d
from bench.common import interleaved, write_json
from d3d.cpu import prefill as tiles
from d3d.data.prompts import summary_request
from d3d.decode.generation import prefill
from d3d.fetch import resolve_model
from d3d.hardware import cpu_flags

LENGTHS = (32, 64, 128, 256, 512)


def timed(target, ids: list[int], reps: int) -> dict:
    """Median ms of one prefill pass, tiles off and on, in turns."""
    cache = target.new_cache(1, len(ids) + 1)

    def run(setting):
        def go():
            os.environ["D3D_PREFILL_TILES"] = setting
            cache.crop(0, 0)
            with torch.inference_mode():
                prefill(target, [ids], cache, lambda logits: logits.argmax(-1).tolist(), rows=[0])
        return go

    times = interleaved({"int8": run("off"), "tiles": run("on")}, reps)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def predictions(target, ids: list[int]) -> dict:
    """Mean NLL of each next token and the argmax agreement, the whole prompt read in one pass either way."""
    out = {}
    for setting in ("off", "on"):
        os.environ["D3D_PREFILL_TILES"] = setting
        cache = target.new_cache(1, len(ids) + 1)
        layout = cache.layout([len(ids)], [0])
        with torch.inference_mode(), tiles.tiles([len(ids)]):
            logits = target(torch.tensor(ids), layout, cache).float()
        out[setting] = logits
    nll = {k: float(torch.nn.functional.cross_entropy(v[:-1], torch.tensor(ids[1:]))) for k, v in out.items()}
    agree = float((out["off"].argmax(-1) == out["on"].argmax(-1)).float().mean())
    return {"nll_int8": nll["off"], "nll_tiles": nll["on"], "argmax_agreement": agree}


def main(name: str, out: str, reps: int = 5, lengths=LENGTHS, min_rows: int | None = None) -> None:
    if min_rows is not None:
        tiles.MIN_ROWS = min_rows
    path = resolve_model(name)
    target, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
    if not tiles.usable():
        raise SystemExit("AMX's bf16 tiles do not run here: nothing to compare")
    text = summary_request(tok, "argparse")
    rows = []
    for n in lengths:
        ms = timed(target, text[:n], reps)
        rows.append({"tokens": n, "int8_ms": ms["int8"], "tiles_ms": ms["tiles"], "speedup": ms["int8"] / ms["tiles"]})
        print(f"{n:4d} tokens: int8 kernels {ms['int8']:7.1f} ms, tiles {ms['tiles']:7.1f} ms "
              f"({ms['int8'] / ms['tiles']:.2f}x)", flush=True)
    quality = predictions(target, text[:max(lengths)])
    print(f"{max(lengths)} tokens: NLL {quality['nll_int8']:.4f} (int8) {quality['nll_tiles']:.4f} (tiles), "
          "argmax agreement "
          f"{quality['argmax_agreement']:.4f}", flush=True)
    write_json(out, {"model": name, "cpu_flags": sorted(cpu_flags()), "threads": torch.get_num_threads(),
                     "weights": target.weights, "reps": reps, "min_rows": tiles.MIN_ROWS, "prefill": rows,
                     f"predictions_{max(lengths)}": quality})


if __name__ == "__main__":
    args = sys.argv[1:]
    opts = {}
    for flag, key, parse in (("--lengths", "lengths", lambda v: tuple(map(int, v.split(",")))),
                             ("--min-rows", "min_rows", int)):
        if flag in args:
            i = args.index(flag)
            opts[key] = parse(args[i + 1])
            del args[i:i + 2]
    if len(args) not in (2, 3):
        raise SystemExit(__doc__)
    main(args[0], args[1], *map(int, args[2:]), **opts)
