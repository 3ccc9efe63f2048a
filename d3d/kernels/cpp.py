"""Build-on-first-use for the C++ CPU kernels (``skinny_gemm.cpp``, ``quant_gemm.cpp``, ``quant_vnni.cpp``).

Triton has no CPU backend outside the interpreter, so the CPU matmuls of decoding are small C++
files compiled by ``torch.utils.cpp_extension`` with the system compiler the first time they are
needed (~35 s on 2 cores; cached under ``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``).
A first build says so on stderr, so that a first run does not sit in silence. Where the CPU lacks
the instructions or the build fails, ``build`` returns why, and the caller keeps a torch path.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from ..cpu.precision import cpu_flags

AVX2_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]
AVX2 = frozenset({"avx2", "fma"})


def build(name: str, source: Path, cflags: list[str], needs: frozenset[str] = AVX2) -> tuple[object | None, str | None]:
    """``(module, None)``, or ``(None, why not)`` where this CPU (it lacks a flag of ``needs``) or
    machine cannot build ``source``."""
    missing = needs - cpu_flags()
    if missing:
        return None, f"this CPU lacks {' and '.join(sorted(missing))}"
    try:
        from torch.utils.cpp_extension import _get_build_directory, load

        cached = any(Path(_get_build_directory(name, verbose=False)).glob(f"{name}*.so"))
        if not cached:
            print(f"d3d: compiling {source.name} for this CPU (first use only, ~35 s on 2 cores) ...",
                  file=sys.stderr, flush=True)
        start = time.perf_counter()
        # torch rebuilds when a source or a flag changes, not a header: the headers' hash is a flag
        headers = hashlib.sha1(b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))).hexdigest()[:12]
        module = load(name=name, sources=[str(source)], verbose=False,
                      extra_cflags=cflags + [f"-DD3D_HEADERS={headers}"], extra_ldflags=["-fopenmp"])
        if not cached:
            print(f"d3d: built {source.name} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    except Exception as e:  # no compiler, no ninja, a failed build: the torch path stays
        return None, f"building {source.name} failed ({type(e).__name__}: {str(e).strip().splitlines()[-1][:200]})"
    return module, None
