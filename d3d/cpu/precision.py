"""The dtype policy: bf16 where the CPU multiplies bf16 fast, fp32 elsewhere (``dtype="auto"``).

Why a policy and not a constant: the development CPUs change between machines and the fast
dtype changes with them (docs/design.md §9). Where the CPU has bf16 matmul instructions (AMX,
avx512_bf16) a 16-row bf16 ``F.linear`` costs a fraction of fp32's; where it has none, bf16 is
emulated and several times slower than fp32 (the timings per CPU: docs/results.md, "Measurements behind the code").

Speculative verification runs 16-row passes, so bf16 is what makes it nearly free where the
hardware has it. The decision:

1. ``D3D_DTYPE=float32|bfloat16|float16`` in the environment forces a dtype (tests pin fp32 for
   their exact token-equality checks; users can pin one for a whole process).
2. CUDA: the checkpoint's own dtype (``config.json``), as every GPU engine does.
3. CPU: bf16 only if the CPU advertises bf16 matmul instructions (``amx_bf16`` or
   ``avx512_bf16`` in /proc/cpuinfo) *and* a ~50 ms probe confirms it: a 16-row bf16 matmul
   must beat the fp32 one by at least ``MIN_SPEEDUP``. Flags alone are not enough (a
   hypervisor can advertise what the library build does not use); a probe alone on an
   AVX2 machine wastes nothing but is noisy, so both must agree.

Norms, softmax, RoPE and acceptance run in fp32 whatever the policy picks (``d3d.model.transformer``,
``d3d.kernels``): only weights, activations and the KV cache are bf16.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from .. import env
from ..hardware import cpu_flags, llc_bytes

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
MIN_SPEEDUP = 1.3  # bf16 must be clearly faster at 16 rows to be worth its rounding


@dataclass(frozen=True)
class DtypeChoice:
    """What the policy picked and what it saw (recorded in every bench JSON)."""

    dtype: str
    reason: str
    cpu_flags: tuple[str, ...] = ()  # the bf16-related flags present
    probe_ms: dict | None = None  # {"float32": ms, "bfloat16": ms} for the 16-row probe

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cpu_flags"] = list(self.cpu_flags)
        return d


def probe_matmul_ms(rows: int = 16, k: int = 1024, n: int = 2048, repeats: int = 5) -> dict:
    """Median ms of ``F.linear`` [rows, k] x [n, k] in fp32 and bf16 (about 50 ms in all)."""
    out = {}
    for name in ("float32", "bfloat16"):
        dt = DTYPES[name]
        x, w = torch.randn(rows, k, dtype=dt), torch.randn(n, k, dtype=dt)
        F.linear(x, w)  # first call: library dispatch / kernel selection
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            F.linear(x, w)
            times.append(time.perf_counter() - t)
        out[name] = sorted(times)[len(times) // 2] * 1e3
    return out


def decide_cpu(flags: set[str], probe) -> DtypeChoice:
    """The CPU decision from the flags and a probe function (separate so tests can mock both)."""
    have = tuple(f for f in BF16_FLAGS if f in flags)
    if not have:
        return DtypeChoice("float32", "no bf16 matmul instructions (amx_bf16/avx512_bf16) on this CPU")
    ms = probe()
    speedup = ms["float32"] / ms["bfloat16"]
    if speedup >= MIN_SPEEDUP:
        return DtypeChoice("bfloat16", f"{'/'.join(have)} present and a 16-row bf16 matmul is {speedup:.1f}x "
                                       f"faster than fp32", have, ms)
    return DtypeChoice("float32", f"{'/'.join(have)} present but bf16 is only {speedup:.2f}x fp32 at 16 rows "
                                  f"(< {MIN_SPEEDUP})", have, ms)


@functools.lru_cache(maxsize=None)
def _cpu_choice() -> DtypeChoice:
    return decide_cpu(cpu_flags(), probe_matmul_ms)


def auto_dtype(device: torch.device | str = "cpu", checkpoint_dtype: str | None = None) -> DtypeChoice:
    """The policy's dtype for ``device`` (see the module docstring for the rules)."""
    forced = env.read("D3D_DTYPE")
    if forced != "auto":
        return DtypeChoice(str(DTYPES[forced]).removeprefix("torch."), "forced by D3D_DTYPE")
    device = torch.device(device)
    if device.type == "cpu":
        return _cpu_choice()
    dt = str(DTYPES[checkpoint_dtype]).removeprefix("torch.") if checkpoint_dtype in DTYPES else "bfloat16"
    return DtypeChoice(dt, f"{device.type}: the checkpoint's dtype")


def resolve_dtype(dtype, device: torch.device | str = "cpu", checkpoint_dtype: str | None = None,
                  what: str = "dtype") -> torch.dtype:
    """A torch dtype from ``dtype``: a torch.dtype, one of DTYPES' names, or None/"auto" (the policy)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return DTYPES[auto_dtype(device, checkpoint_dtype).dtype]
    if dtype not in DTYPES:
        raise ValueError(f"{what}={dtype!r}: expected auto or one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


# ---------------------------------------------------------------- the weights policy

WEIGHTS = {"auto": "auto", "dense": "dense", "fp32": "float32", "float32": "float32", "bf16": "bfloat16",
           "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "int8": "int8", "int4": "int4"}
PROBE_SHAPE = (2048, 1024)  # one probe matrix; the probe streams enough of them to leave the last-level cache


@dataclass(frozen=True)
class WeightsChoice:
    """How a model holds its matrices (``Transformer.weights_choice``, recorded by ``Transformer.load_weights``):
    a dense dtype's name, ``dense`` (in the dtype asked for, or the policy's), ``int8``, ``int4``, or
    ``checkpoint`` (a quantized checkpoint's own blocks)."""

    weights: str
    reason: str
    probe_ms: dict | None = None  # {"dense": ms, "int8": ms}: the streaming probe, where it ran

    @property
    def quantized(self) -> bool:
        return self.weights in ("int8", "int4", "checkpoint")

    @property
    def quantizes(self) -> bool:
        """Whether dense matrices of the checkpoint are quantized at load."""
        return self.weights in ("int8", "int4")

    def compute_dtype(self, dtype, device: torch.device | str = "cpu", checkpoint_dtype: str | None = None):
        """The dtype the model computes in: fp32 beside quantized matrices, a dense dtype's own, else
        ``dtype`` (None or ``"auto"``: the dtype policy's)."""
        if self.quantized:
            return torch.float32
        return resolve_dtype(self.weights if self.weights in DTYPES else dtype, device, checkpoint_dtype)


def probe_weights_ms(dtype: torch.dtype, llc: int, rows: tuple[int, ...] = (1, 8), repeats: int = 3) -> dict:
    """Median ms to stream matrices totalling twice the last-level cache, dense (``dtype``, packed as
    ``d3d.cpu.linear`` does) vs int8 (``d3d.cpu.quant``), summed over 1- and 8-row products (decoding
    steps and verification passes)."""
    from . import linear as cpu_linear
    from .quant import quantize

    n, k = PROBE_SHAPE
    count = max(2, min(32, -(-2 * llc // (n * k * torch.finfo(dtype).bits // 8))))
    dense = [torch.randn(n, k).to(dtype) for _ in range(count)]
    int8 = [quantize(w, "int8") for w in dense]
    for w in dense:
        cpu_linear.pack(w)
    out = {}
    for name, ws in (("dense", dense), ("int8", int8)):
        total = 0.0
        for r in rows:
            x = torch.randn(r, k).to(dtype if name == "dense" else torch.float32)
            times = []
            for _ in range(repeats + 1):
                t = time.perf_counter()
                for w in ws:
                    cpu_linear.linear(x, w)
                times.append(time.perf_counter() - t)
            total += sorted(times[1:])[len(times[1:]) // 2] * 1e3
        out[name] = total
    return out


def decide_weights(dense_bytes: int, llc: int, kernel: str | None, probe) -> WeightsChoice:
    """The CPU decision for a dense checkpoint: int8 where its matrices do not fit the last-level
    cache (decoding then streams them from memory, and int8 reads 2-4x fewer bytes) and the probe
    confirms int8 is faster; the dtype policy's dense weights otherwise. ``kernel``: why the int8
    kernel is unavailable, or None. Separate from the probe so tests can mock both."""
    if kernel is not None:
        return WeightsChoice("dense", f"the int8 kernel is unavailable ({kernel})")
    if dense_bytes <= llc:
        return WeightsChoice("dense", f"the matrices ({dense_bytes / 2**20:.0f} MiB) fit the last-level cache "
                                      f"({llc / 2**20:.0f} MiB): bytes are not what a pass waits for")
    ms = probe()
    if ms["int8"] < ms["dense"]:
        return WeightsChoice("int8", f"streaming int8 is {ms['dense'] / ms['int8']:.1f}x faster than dense on this "
                                     f"CPU", ms)
    return WeightsChoice("dense", f"streaming int8 is not faster than dense on this CPU "
                                  f"({ms['int8']:.1f} vs {ms['dense']:.1f} ms)", ms)


@functools.lru_cache(maxsize=None)
def _cpu_weights(dense_bytes: int, dtype_name: str) -> WeightsChoice:
    from ..kernels import quant as kernel

    llc = llc_bytes()
    kernel_why = None if kernel.available() else kernel.why_unavailable()
    return decide_weights(dense_bytes, llc, kernel_why, lambda: probe_weights_ms(DTYPES[dtype_name], llc))


def computes_in(weights: str, checkpoint_quantized: bool = False) -> torch.dtype | None:
    """The dtype a model computes in when its matrices are held as ``weights`` (a WEIGHTS word): a dense
    dtype's own; fp32 for quantized matrices, and for ``auto`` on a quantized checkpoint (which keeps its
    blocks); None where ``dtype`` decides (``dense``, ``auto`` on a dense checkpoint)."""
    want = WEIGHTS[weights]
    if want in DTYPES:
        return DTYPES[want]
    if want in ("int8", "int4") or (want == "auto" and checkpoint_quantized):
        return torch.float32
    return None


def auto_weights(weights: str, dtype, device: torch.device | str, cfg, checkpoint_quantized: bool,
                 follow: str | None = None) -> WeightsChoice:
    """How to hold the matrices of a checkpoint, a target's or a drafter's alike (``load_model``'s and
    ``load_drafter``'s ``weights``, CLI ``--weights``): the one reader of the WEIGHTS words.

    1. ``weights`` names a choice: fp32/bf16/fp16 or dense (the dtype policy's, or ``dtype``'s; a
       quantized checkpoint is dequantized), int8/int4 (dense matrices quantized at load; a
       quantized checkpoint keeps its blocks). An explicit ``dtype`` must agree with it (quantized
       matrices compute in fp32): a ValueError names both where they do not.
    2. ``"auto"``: beside a target (``follow``: its ``Transformer.weights``) as the target holds its own
       (its dtype; int4 beside int4, int8 beside other quantized formats); else ``D3D_WEIGHTS`` where
       set; else a quantized checkpoint keeps its blocks, and a dense one gets ``decide_weights``'s
       choice on a CPU when ``dtype`` is left to the policy, otherwise the dtype policy. An explicit
       ``dtype`` wins over what auto would pick in another dtype: dense matrices in ``dtype``.
    Quantized weights need the CPU kernel (``d3d.kernels.quant``): where it is missing, or off a
    CPU, they are dequantized with a warning.
    """
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}: expected one of {', '.join(WEIGHTS)}")
    given = None if dtype is None or dtype == "auto" else resolve_dtype(dtype)
    fixed = computes_in(weights)
    if given is not None and fixed not in (None, given):
        raise ValueError(f"weights={weights!r} and dtype={dtype!r} disagree ({weights} computes in "
                         f"{str(fixed).removeprefix('torch.')}); give one of them")
    how = "asked for"
    if weights == "auto":
        weights, how = _auto_word(follow)
        if given is not None and computes_in(weights, checkpoint_quantized) not in (None, given):
            return WeightsChoice("dense", "dtype given")
    return _held(weights, how, dtype, torch.device(device), cfg, checkpoint_quantized)


def _auto_word(follow: str | None) -> tuple[str, str]:
    """The WEIGHTS word ``"auto"`` stands for, and why: the target's way (``follow``), ``D3D_WEIGHTS``, or auto."""
    if follow is not None:
        word = follow if follow in DTYPES else "int4" if follow == "int4" else "int8"
        return word, f"follows the target ({follow})"
    forced = env.read("D3D_WEIGHTS")
    return (forced, "forced by D3D_WEIGHTS") if forced != "auto" else ("auto", "asked for")


def _held(weights: str, how: str, dtype, device: torch.device, cfg, checkpoint_quantized: bool) -> WeightsChoice:
    """``auto_weights``' choice once ``weights`` is a word that agrees with ``dtype``."""
    want = WEIGHTS[weights]
    if want == "dense":
        return WeightsChoice("dense", how)
    if want in DTYPES:
        return WeightsChoice(want, how)
    if want in ("int8", "int4") or checkpoint_quantized:
        return _quantized(want, how, device, checkpoint_quantized)
    dtype_auto = dtype is None or dtype == "auto"
    if not dtype_auto or device.type != "cpu":
        return WeightsChoice("dense", "dtype given" if not dtype_auto else f"{device.type}: the dtype policy")
    name = auto_dtype(device, cfg.torch_dtype).dtype
    dense_bytes = cfg.num_parameters() * torch.finfo(DTYPES[name]).bits // 8
    return _cpu_weights(dense_bytes, name)


def _quantized(want: str, how: str, device: torch.device, checkpoint_quantized: bool) -> WeightsChoice:
    """Quantized matrices (``want``: int8, int4, or auto on a quantized checkpoint), or dense with a
    warning where the kernel cannot multiply them."""
    why = _why_no_quant(device)
    if why is not None:
        import warnings

        warnings.warn(f"d3d: quantized weights {why}; dequantizing to dense", stacklevel=5)
        return WeightsChoice("dense", f"quantized weights {why}")
    if want == "auto":
        return WeightsChoice("checkpoint", "the checkpoint is quantized: its blocks are kept")
    kept = " (the checkpoint's own blocks are kept)" if checkpoint_quantized else ""
    return WeightsChoice(want, how + kept)


def _why_no_quant(device: torch.device) -> str | None:
    if device.type != "cpu":
        return f"run on a CPU only, not {device.type}"
    from ..kernels import quant as kernel

    return None if kernel.available() else f"need the CPU kernel ({kernel.why_unavailable()})"


__all__ = ["DtypeChoice", "DTYPES", "auto_dtype", "resolve_dtype", "decide_cpu", "probe_matmul_ms",
           "WeightsChoice", "WEIGHTS", "auto_weights", "computes_in", "decide_weights", "probe_weights_ms"]
