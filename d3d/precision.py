"""The dtype policy: bf16 where the CPU multiplies bf16 fast, fp32 elsewhere (``dtype="auto"``).

Why a policy and not a constant: the development CPUs change between machines and the fast
dtype changes with them (DESIGN.md §9). Measured with ``F.linear`` 896 -> 9728, 16 rows:

    Intel Xeon, AMX           bf16 0.90 ms   fp32 2.67 ms    (16 rows cost what 1 row does)
    AMD EPYC Zen 5, avx512_bf16  bf16 0.74 ms   fp32 3.92 ms
    AMD EPYC, AVX2 only       bf16 7-8x slower than fp32 (emulated)

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

Norms, softmax, RoPE and acceptance run in fp32 whatever the policy picks (``d3d.model``,
``d3d.kernels``): only weights, activations and the KV cache are bf16.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

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


def cpu_flags() -> set[str]:
    """The CPU feature flags the kernel reports (empty where /proc/cpuinfo is unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


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
    forced = os.environ.get("D3D_DTYPE", "").strip()
    if forced and forced != "auto":
        if forced not in DTYPES:
            raise ValueError(f"D3D_DTYPE={forced!r}: expected auto or one of {', '.join(DTYPES)}")
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


__all__ = ["DtypeChoice", "DTYPES", "auto_dtype", "resolve_dtype", "decide_cpu", "cpu_flags", "probe_matmul_ms"]
