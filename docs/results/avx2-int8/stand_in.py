"""This CPU as a stand-in for an AVX2-only one: d3d sees no AVX-512 flag, so the VNNI kernel does not build and
the quantized matmuls take the AVX2 int8 kernel (quant_maddubs.cpp); with ``--fp32-activations``, the AVX2 code of
quant_gemm.cpp with fp32 activations and int5 widened to int8, as d3d ran on AVX2 before it. Attention and the
glue keep their AVX-512 code (they check the CPU themselves; the same bits, a small part of a pass).

    python docs/results/avx2-int8/stand_in.py [--fp32-activations] BENCH ARGS...   # e.g. llamacpp --target ...
"""
from __future__ import annotations

import os
import sys

AVX512 = ("avx512", "amx")


def avx2_only(fp32_activations: bool = False) -> None:
    """Hide AVX-512 from d3d's checks of the CPU (call before any kernel is built or model loaded)."""
    import importlib

    import d3d.hardware as hw

    flags = {f for f in hw.cpu_flags() if not f.startswith(AVX512)}
    for name in ("d3d.hardware", "d3d.kernels.skinny", "d3d.kernels.cpp", "d3d.cpu.quant", "d3d.cpu.precision",
                 "d3d.doctor"):
        importlib.import_module(name).cpu_flags = lambda: set(flags)
    if fp32_activations:
        os.environ["D3D_QUANT_ACTIVATIONS"] = "fp32"
        import d3d.kernels.quant as kq

        def bound(q, h, s, m, n, group, bits, int8_activations=False, sd=None, md=None):
            assert not int8_activations
            h, m = kq._EMPTY if h is None else h, kq._EMPTY if m is None else m
            call = kq._load()[0].matmul
            return lambda x: call(x, q, h, s, m, n, group, bits, kq.ISAS["avx2"])

        kq.bound = bound


def avx2_from_argv() -> None:
    """``--avx2`` in sys.argv (taken out of it): this CPU as an AVX2-only one (``avx2_only``)."""
    if "--avx2" in sys.argv:
        sys.argv.remove("--avx2")
        avx2_only()


if __name__ == "__main__":
    argv = sys.argv[1:]
    fp32 = "--fp32-activations" in argv
    argv = [a for a in argv if a != "--fp32-activations"]
    avx2_only(fp32)
    from bench.run import main

    sys.exit(main(argv))
