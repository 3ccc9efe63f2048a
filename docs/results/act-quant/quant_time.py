"""The activations' quantization of the int8 kernels alone (quant_int8.h's quantize_rows), ns an input, for the
0.5B's input widths and 1-256 rows. Run from the repository root, once per checkout to compare:

    python docs/results/act-quant/quant_time.py CHECKOUT NAME > OUT.txt

CHECKOUT: the repository whose d3d/kernels/quant_int8.h is timed; NAME: its extension's name (one per checkout).
"""
import sys
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

root, name = sys.argv[1], sys.argv[2]
mod = load(name="qb_" + name, sources=[str(Path(__file__).with_name("qb.cpp"))],
           extra_include_paths=[root + "/d3d/kernels"], extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c"])
torch.manual_seed(0)
for K in (896, 4864):
    for M in (1, 8, 16, 256):
        x = torch.randn(M, K)
        # int5 (Q5_0), int4 with mins (the drafter's), Q4_K (two-level, super-blocks of 256)
        for (A, S, nib, xs, fmt) in ((32, 32, True, False, "int5"), (32, 32, True, True, "int4m"),
                                    (32, 256, True, False, "q4k")):
            reps = max(20, 200000 // (M * K) * 20)
            mod.time_quant(x, A, S, nib, xs, reps)
            t = sorted(mod.time_quant(x, A, S, nib, xs, reps) for _ in range(7))[3]
            print(f"{fmt} K={K} M={M}: {1e6 * t:.2f} us {1e9 * t / (M * K):.3f} ns/input")
