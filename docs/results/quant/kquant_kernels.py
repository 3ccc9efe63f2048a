"""Per-matrix cost of the VNNI kernel on K-quant matrices (two-level scales), the shapes of
Qwen2.5-Coder-1.5B: Q4_K as int4, and Q6_K held as int6 beside the same values as int8 with fp32
group scales (what d3d held before: what 6 bits and two-level scales save). Random blocks; enough
copies of each matrix are streamed that the weights come from memory, as in decoding; 2 threads;
median of 7 sweeps, ms per matrix.

    python docs/results/quant/kquant_kernels.py > docs/results/quant/kquant_kernels.txt
"""
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from d3d.cpu.quant import QuantWeight
from d3d.hardware import cpu_flags
from d3d.kernels import quant as K
from d3d.model.gguf import block_parts

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from test_quant import random_blocks  # noqa: E402  (random GGUF blocks of a kind, the tests' helper)

torch.set_num_threads(2)
ROWS = (1, 2, 4, 8, 16)
SHAPES = [("gate_up", "Q4_K", 17920, 1536), ("down", "Q4_K", 1536, 8960), ("down", "Q6_K", 1536, 8960),
          ("lm_head", "Q6_K", 151936, 1536)]
STREAM_MB = 400  # at least this much weight per sweep, more than the last-level cache


def kernel_args(w: QuantWeight, six: bool) -> tuple:
    """w's arguments to the VNNI kernel: as it holds them, or (``six`` False, Q6_K) as int8 panels with
    fp32 group scales."""
    e = K._EMPTY
    if w.bits == 4 or six:
        return (w.q, e if w.high is None else w.high, w.scale, e if w.min is None else w.min, w.out_features,
                w.group, 6 if six else 4, w.scale_d, e if w.min_d is None else w.min_d)
    q, s, _, _ = w.parts()
    return K.to_panels(q), e, K.to_panels(s.expand()), e, w.out_features, w.group, 8, e, e


def copies(args: tuple, n: int) -> list[tuple]:
    """``n`` copies of kernel arguments in distinct memory."""
    return [tuple(t.clone() if isinstance(t, torch.Tensor) and t.numel() else t for t in args) for _ in range(n)]


def main():
    if not K.vnni_available():
        raise SystemExit(f"kquant_kernels: the VNNI kernel is unavailable: {K.why_vnni_unavailable()}")
    kernel = K._load_vnni()[0]
    print("cpu flags:", " ".join(sorted(cpu_flags() & {"avx2", "avx512f", "avx512_vnni", "avx512vbmi",
                                                       "avx512_bitalg", "amx_int8"})))
    print(f"{'matrix':8} kind  {'held':18}  MB/matrix  ms per matrix at rows " + " ".join(map(str, ROWS)))
    rng = np.random.default_rng(0)
    for name, kind, n, k in SHAPES:
        w = QuantWeight(*block_parts(random_blocks(kind, n, k, rng), kind, (n, k)))
        for six in ((True, False) if kind == "Q6_K" else (False,)):
            args = kernel_args(w, six)
            mb = sum(t.numel() * t.element_size() for t in args if isinstance(t, torch.Tensor)) / 1e6
            ws = copies(args, max(1, round(STREAM_MB / mb)))
            cells = []
            for rows in ROWS:
                x = torch.randn(rows, k)
                ts = []
                for _ in range(7):
                    t = time.perf_counter()
                    for a in ws:
                        kernel.matmul(x, *a)
                    ts.append((time.perf_counter() - t) / len(ws))
                cells.append(f"{rows}:{statistics.median(ts) * 1e3:.3f}")
            held = "int4" if kind == "Q4_K" else "int6" if six else "int8 (fp32 scales)"
            print(f"{name:8} {kind}  {held:18}  {mb:9.1f}  " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
