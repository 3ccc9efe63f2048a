"""Per-matrix cost of the quantized kernels by format, scale dtype and instruction set (vnni: int8
activations, ``quant_vnni.cpp``; avx2/avx512: fp32 activations, ``quant_gemm.cpp``), beside oneDNN's
bf16 and fp32 (a 9728 x 896 matrix, the 0.5B target's fused gate/up; 12 copies streamed so that the
weights come from memory, as in decoding; 2 threads; median of 5 sweeps, ms per matrix).

    python docs/results/quant/kernels.py > docs/results/quant/kernels.txt
"""
import time

import torch

from d3d.cpu import linear as cpu_linear
from d3d.kernels import quant as K
from d3d.cpu.quant import QuantWeight
from d3d.hardware import cpu_flags

torch.set_num_threads(2)
N, D, G, L, ROWS = 9728, 896, 32, 12, (1, 2, 4, 8, 16)
g = torch.Generator().manual_seed(0)
print("cpu flags:", " ".join(sorted(cpu_flags() & {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
                                                   "amx_bf16"})))


def sweep(ws, dtype, call):
    out = []
    for rows in ROWS:
        x = torch.randn(rows, D).to(dtype)
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            for w in ws:
                call(x, w)
            ts.append(time.perf_counter() - t)
        out.append(f"{rows}:{sorted(ts)[2] * 1e3 / L:.3f}")
    return " ".join(out)


def quant(bits, half):
    s = torch.rand(N, D // G, generator=g)
    s = s.half().float() if half else s
    if bits == 8:
        return QuantWeight(torch.randint(-128, 128, (N, D), dtype=torch.int8, generator=g), s)
    q = torch.randint(0, 256, (N, D // 2), dtype=torch.uint8, generator=g)
    if bits == 5:
        return QuantWeight(q, s, high=torch.randint(0, 256, (N, D // 8), dtype=torch.uint8, generator=g))
    m = torch.randn(N, D // G, generator=g)
    return QuantWeight(q, s, m.half().float() if half else m)


print(f"format    scales isa     MB/matrix  ms per matrix at rows " + " ".join(map(str, ROWS)))
for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    ws = [torch.randn(N, D, generator=g).to(dtype) for _ in range(L)]
    for w in ws:
        cpu_linear.pack(w)
    print(f"{name:9s} -      oneDNN  {ws[0].numel() * ws[0].element_size() / 1e6:5.1f}      "
          + sweep(ws, dtype, lambda x, w: cpu_linear.linear(x, w)), flush=True)
isas = ["avx2"] + (["avx512"] if {"avx512bw", "avx512vl"} <= cpu_flags() else [])
isas += ["vnni"] if K.vnni_available() else []  # int8 activations, integer dot products
for bits in (8, 5, 4):
    for half in (True, False):
        ws = [quant(bits, half) for _ in range(L)]
        for isa in isas:
            if isa == "vnni":
                call = lambda x, w: K.matmul_vnni(x, w.q, w.scale, w.min, w.out_features, w.bits, w.high)  # noqa
            else:
                call = lambda x, w, isa=isa: K.matmul(x, w.q, w.scale, w.min, w.out_features, w.bits, isa=isa,  # noqa
                                                      h=w.high)
            print(f"int{bits:<5d} {'fp16' if half else 'fp32':6s} {isa:7s} {ws[0].nbytes / 1e6:5.1f}      "
                  + sweep(ws, torch.float32, call), flush=True)
