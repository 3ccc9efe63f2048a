"""Every environment variable d3d reads, listed once, and the one function that reads them.

Environment variables are for what a caller cannot pass as an argument: a test suite pinning fp32 for a
whole process, a bench comparing two kernels, CI forcing a backend. Everything else is an argument.
``VARIABLES`` says, for each, what it changes, the values it takes and what unset means; docs/design.md's
"Environment variables" table lists the same names (tests/test_env.py checks that the two agree and that
no other module under d3d/ reads ``os.environ``).

The lowest floor of d3d/ (tests/test_imports.py): it imports no d3d module, so every folder may read it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

KINDS = ("choice", "flag", "path")


@dataclass(frozen=True)
class Variable:
    """One environment variable. ``kind``: ``choice`` (one of ``values``, any case, ``default`` where
    unset), ``flag`` (unset or ``0``: off, any other value: on) or ``path`` (a file or folder; unset:
    ``default`` with ``~`` the home folder, or None where there is no default)."""

    name: str
    changes: str  # what it changes, in a sentence
    kind: str
    values: tuple[str, ...] = ()  # a choice's allowed values
    default: str | None = None  # what unset (or empty) means: a choice's value or a path

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind={self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.kind == "choice" and self.default not in self.values:
            raise ValueError(f"{self.name}: default={self.default!r} is not one of its values {self.values}")


class BadEnvironmentValue(ValueError):
    """An environment variable set to a value it does not take (the message names both and the choices)."""


_DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")

VARIABLES = {v.name: v for v in (
    Variable("D3D_DTYPE", "the dtype of weights, activations and KV cache wherever a dtype is left to the "
             "policy (dtype=\"auto\", d3d.cpu.precision); tests pin float32", "choice", ("auto", *_DTYPES), "auto"),
    Variable("D3D_WEIGHTS", "how a model holds its matrices where weights=\"auto\" (a drafter beside a target "
             "follows the target; an explicit dtype wins; d3d.cpu.precision); tests pin dense", "choice",
             ("auto", "dense", *_DTYPES, "int8", "int4"), "auto"),
    Variable("D3D_QUANT_ACTIVATIONS", "whether quantized matrices multiply int8 activations (AVX-512 VNNI, or "
             "AVX2: the same bits) or fp32 ones (bit-equal to the dequantized model); auto: int8 where a kernel "
             "builds", "choice",
             ("auto", "int8", "fp32"), "auto"),
    Variable("D3D_PREFILL_TILES", "whether a prompt's prefill multiplies quantized matrices with AMX's bf16 tiles "
             "(d3d.cpu.prefill); auto: where the CPU has AMX-BF16", "choice", ("auto", "on", "off"), "auto"),
    Variable("D3D_HUGEPAGES", "whether a loaded model's matrices are moved into 2 MB pages (Linux's "
             "transparent huge pages, d3d.cpu.hugepages); auto: where Linux offers them", "choice", ("auto", "off"),
             "auto"),
    Variable("D3D_CPU_MATMUL", "the fp32 CPU matmul: the panel kernel (d3d/kernels/skinny.py) or oneDNN; "
             "auto: panels on AVX2 CPUs without AVX-512", "choice", ("auto", "panels", "onednn"), "auto"),
    Variable("D3D_KERNELS", "Triton or torch for the kernels in d3d/kernels/; auto: Triton on CUDA tensors, "
             "torch elsewhere", "choice", ("auto", "torch", "triton"), "auto"),
    Variable("D3D_CHECKS", "the Triton attention's value checks on CUDA tensors (off: no device sync)", "flag",
             default="0"),
    Variable("TRITON_INTERPRET", "Triton's own: its kernels run in the interpreter, on CPU tensors too (set "
             "before d3d.kernels is imported)", "flag", default="0"),
    Variable("D3D_CACHE", "where real models are fetched to and looked for (python -m d3d fetch); unset: "
             "$XDG_CACHE_HOME/d3d", "path"),
    Variable("XDG_CACHE_HOME", "the user's cache folder, whose d3d/ holds real models where D3D_CACHE is unset",
             "path", default="~/.cache"),
    Variable("D3D_MTBENCH", "the MT-Bench questions (python -m bench fetch-mtbench writes them)", "path",
             default="~/.cache/d3d/mt_bench/question.jsonl"),
    Variable("D3D_PYDOCS", "the Python documentation sources the docs prompt set reads", "path",
             default="/usr/share/doc/python3.11-doc/html/_sources"),
)}


def read(name: str) -> str | bool | Path | None:
    """The value of the variable ``name`` now (read at every call: tests and benches set them between
    calls): a choice in lower case, a flag as a bool, a path as a Path (None: unset with no default).
    Unset or empty means the default. A value not among a choice's values raises BadEnvironmentValue."""
    var = VARIABLES.get(name)
    if var is None:
        raise KeyError(f"{name!r} is not one of d3d's environment variables (d3d/env.py VARIABLES: "
                       f"{', '.join(VARIABLES)})")
    raw = os.environ.get(name, "")
    if var.kind == "flag":
        return raw not in ("", "0")
    if var.kind == "path":
        return Path(raw) if raw else Path(var.default).expanduser() if var.default else None
    choice = raw.strip().lower() or var.default
    if choice not in var.values:
        raise BadEnvironmentValue(f"{name}={raw.strip()!r}: expected one of {', '.join(var.values)}")
    return choice


__all__ = ["Variable", "VARIABLES", "BadEnvironmentValue", "read"]
