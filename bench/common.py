"""Shared benchmark helpers: machine description, timing with medians, Markdown tables, JSON."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from d3d.assets import BUNDLED_TARGET, bundled
from d3d.fetch import resolve_model
from d3d.files import write_json as atomic_write_json
from d3d.data.prompts import CHAT_SETS
from d3d.decode.config import SpecConfig


def target_dir(arg: str | None, bench: str) -> Path:
    """A bench's ``--target``: a directory, a real model's name (fetched once, saying so on stderr), or
    None for the bundled target."""
    if not arg:
        return bundled(BUNDLED_TARGET)
    return Path(resolve_model(arg, log=lambda m: print(f"bench {bench}: {m}", file=sys.stderr, flush=True)))


def machine() -> dict:
    import torch

    from d3d.cpu.precision import auto_dtype
    from d3d.hardware import cpu_flags

    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu": _cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_flags": sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16"}),
            "dtype_policy": auto_dtype("cpu").to_dict()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def interleaved(runners: dict, repeats: int, warmup: int = 1, sync=None) -> dict:
    """The one timer of the benches: seconds per run of every runner, runs interleaved (each
    runner once per repeat, in turn) so that machine drift hits all alike. ``sync`` (e.g.
    ``torch.cuda.synchronize``) is called before the clock starts and before it stops."""
    for fn in runners.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in runners}
    for _ in range(repeats):
        for k, fn in runners.items():
            if sync:
                sync()
            t = time.perf_counter()
            fn()
            if sync:
                sync()
            times[k].append(time.perf_counter() - t)
    return times


def timeit(fn, repeats: int, warmup: int = 1, sync=None) -> dict:
    """One runner through ``interleaved``: seconds per run, median, min, max and all."""
    times = interleaved({0: fn}, repeats, warmup, sync)[0]
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "all": times}


def copy_bandwidth_gbs(nbytes: int = 256 << 20, repeats: int = 7) -> float:
    """Measured memory bandwidth of a large tensor copy (bytes read + written per second), GB/s."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = timeit(lambda: dst.copy_(src), repeats)
    return 2 * nbytes / t["median"] / 1e9


def check_chat_sets(ap, sets: list[str]) -> None:
    """``--chat`` asks prompts as user turns: only request sets can be (``ap.error`` names the others)."""
    if raw := sorted(set(sets) - set(CHAT_SETS)):
        ap.error(f"--chat: sets {raw} are raw text; chat sets: {', '.join(CHAT_SETS)}")


def markdown_table(headers: list[str], rows: list[list]) -> str:
    def fmt(x):
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def over(speeds: list[float], base: list[float]) -> tuple[float, float]:
    """The median and the worst of the per-request ratios ``speeds[i] / base[i]``."""
    ratios = [a / b for a, b in zip(speeds, base)]
    return statistics.median(ratios), min(ratios)


def runs_over_ar(tok_s: dict[str, list[float]], tau: dict[str, list[float]]) -> dict:
    """Per run of one request set (tok/s and τ per request, ``"ar"`` among the runs): the medians of tok/s and τ,
    and the median and the worst of the per-request ratios over ar (``print_runs_over_ar`` prints them)."""
    out = {}
    for r, speeds in tok_s.items():
        median, worst = over(speeds, tok_s["ar"])
        out[r] = {"median_tok_s": round(statistics.median(speeds), 2),
                  "median_tau": round(statistics.median(tau[r]), 3) if r != "ar" else None,
                  "median_vs_ar": round(median, 3), "worst_vs_ar": round(worst, 3)}
    return out


# MT-Bench questions kept for choosing (validation) and for reporting (evaluation; bench llamacpp asks the first 4)
MTBENCH_SETS = {"mtbench": [6, 7, 8, 9, 61, 65, 71, 75], "mtbench-eval": [0, 1, 2, 3, 4, 5, 10, 11],
                "mtbench-free": [12, 13, 14, 15, 16, 17, 18, 19]}
REQUEST_SETS = ("code", "explain", "mtbench", "mtbench-free", "humaneval", "mtbench-eval", "library")


def request_sets(tok, path, names: list[str]) -> dict[str, list[list[int]]]:
    """The results scripts' chat requests by set name: validation, where choices are made, ``code`` and ``explain``
    (8 each, about the trainer's validation functions), ``mtbench`` (its 8 validation questions, several of them edits
    and rewrites that copies serve) and ``mtbench-free`` (8 role-play questions, free writing as the evaluation
    questions are); evaluation,
    reported only, ``humaneval`` (8), ``mtbench-eval`` (questions 0-5, 10, 11) and ``library`` (8 about held-out
    library functions). ``path``: the target's directory (its training corpus)."""
    from d3d.data.corpus import training_corpus
    from d3d.data.prompts import load_prompt_set, mtbench_prompts
    from d3d.train.chat_data import chat_prompts

    sets = {}
    for s in names:
        if s in ("code", "explain", "library"):
            split = "evaluation" if s == "library" else "validation"
            sets[s] = chat_prompts(tok, training_corpus(path), 0.05, 8, split, seed=1234, templates=1,
                                   explain=s == "explain")
        elif s in MTBENCH_SETS:
            questions = mtbench_prompts()
            sets[s] = [tok.encode_chat([{"role": "user", "content": questions[i]}]) for i in MTBENCH_SETS[s]]
        elif s == "humaneval":
            sets[s] = load_prompt_set(s, tok, 8, chat=True)
        else:
            raise SystemExit(f"SETS: unknown set {s!r} ({', '.join(REQUEST_SETS)})")
    return sets


def turns(sets: dict, runs: list[str], reps: int):
    """(repetition, set, request index, prompt, the runs in their order): each request's runs take turns, the order
    reversed every other request and repetition."""
    for rep in range(reps):
        for s, prompts in sets.items():
            for i, p in enumerate(prompts):
                yield rep, s, i, p, runs if (i + rep) % 2 == 0 else runs[::-1]


def request_done(outs: dict, tok_s: dict, what: str) -> None:
    """After one request's runs (``outs``: run -> its tokens, ``"ar"`` among them): stop if any output differs from
    ar's, else print the runs' last tok/s (``tok_s``: run -> list) after ``what``, on stderr."""
    if any(o != outs["ar"] for o in outs.values()):
        raise SystemExit(f"{what}: an output differs from ar's")
    print(what, {r: round(v[-1], 1) for r, v in tok_s.items()}, file=sys.stderr, flush=True)


def print_runs_over_ar(name: str, summary: dict) -> None:
    """``runs_over_ar``'s summary of the set ``name``, one line a run."""
    for r, v in summary.items():
        print(f"{name:9} {r:28} {v['median_tok_s']:6.1f} tok/s  tau {v['median_tau']}  {v['median_vs_ar']:.3f}x ar "
              f"(worst {v['worst_vs_ar']:.3f}x)")


def write_json(path: str | None, payload: dict) -> None:
    if path:
        atomic_write_json(path, payload)
        print(f"wrote {path}")


def load_json(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"--compare {path}: cannot read a benchmark JSON ({e})")


def _tok_s_by_key(payload: dict) -> dict:
    """(row key) -> tokens/s for the benches that measure throughput."""
    out = {}
    if payload.get("bench") == "speculative":
        for name, res in payload["results"].items():
            for mode, r in res.items():
                out[(name, mode)] = r["tok_s"]
    elif payload.get("bench") == "decode":
        for r in payload["results"]:
            out[(r["model"], "d3d")] = r["d3d"]["tok_s_median"]
            if "transformers" in r:
                out[(r["model"], "transformers")] = r["transformers"]["tok_s_median"]
    return out


def compare_table(new: dict, old: dict) -> str:
    """Markdown table of tok/s now vs a previous run of the same bench."""
    if new.get("bench") != old.get("bench"):
        raise SystemExit(f"--compare: the previous JSON is a {old.get('bench')!r} bench, this is {new.get('bench')!r}")
    a, b = _tok_s_by_key(new), _tok_s_by_key(old)
    rows = [[k[0], k[1], b[k], a[k], f"{a[k] / b[k]:.2f}x"] for k in a if k in b]
    note = "" if new["machine"].get("cpu") == old["machine"].get("cpu") else \
        f"\n(note: different machines: {old['machine'].get('cpu')} then {new['machine'].get('cpu')})"
    return "vs previous run:\n" + markdown_table(["set/model", "mode", "before tok/s", "now tok/s", "ratio"], rows) + note


def matmul_tflops(n: int = 1024, repeats: int = 5, device: str = "cpu", dtype=None) -> float:
    """Measured dense matmul throughput (the compute ceiling kernels are compared against)."""
    import torch

    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def run():
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()

    return 2 * n ** 3 / timeit(run, repeats)["median"] / 1e12


def random_model(name: str, device: str = "cpu"):
    """A random-weight fp32 model of ``d3d.model.config`` preset ``name`` (normal, std 0.02), for shapes
    no checkpoint here has."""
    import torch

    from d3d.model.config import preset
    from d3d.model.transformer import Transformer

    with torch.device(device):
        model = Transformer(preset(name))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return model.eval().requires_grad_(False)


def bench_spec(mode: str, datastore=None, block_size: int | None = None):
    """A bench mode -> ``d3d.SpecConfig``: the compact form ``generate --spec`` reads, commas for spaces
    ("sync,lookup=0,leaves=3"; ``d3d.decode.config.SpecConfig.parse``), plus the bench's own
    ``store=N``: drafts from ``--datastore`` where N% of the occurrences agree on the first
    (``d3d.decode.datastore``). ``block_size``: a bench's ``--block-size``, for a speculative mode
    that sets none."""
    items = mode.replace(",", " ").split()
    store = [i for i in items if i.startswith("store=")]
    try:
        spec = SpecConfig.parse(" ".join(i for i in items if not i.startswith("store=")))
    except ValueError as e:
        raise SystemExit(f"mode {mode!r}: {e}") from None
    if store:
        if datastore is None:
            raise SystemExit(f"mode {mode!r}: store= needs --datastore DIR (an answer store of this target)")
        spec = spec.replace(datastore=datastore.at(int(store[-1].removeprefix("store=")) / 100))
    if block_size is not None and spec.block_size is None and spec.mode != "ar":
        spec = spec.replace(block_size=block_size)
    return spec
