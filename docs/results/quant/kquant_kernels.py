"""Per-matrix cost of the VNNI kernel on K-quant matrices (two-level scales), the shapes of
Qwen2.5-Coder-1.5B: Q4_K as int4, and Q6_K held as int6 beside the same values as int8 with fp32
group scales (what d3d held before: what 6 bits and two-level scales save). Random blocks; enough copies of each matrix are streamed that the weights come
from memory, as in decoding; 2 threads; median of 7 sweeps, ms per matrix.

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


def copies_of(w: QuantWeight, six: bool, n: int) -> list[tuple]:
    """``n`` copies of w's kernel arguments in distinct memory (int8 panels where ``six`` is False)."""
    q, s, _, _ = w.parts()
    e = K._EMPTY
    out = []
    for _ in range(n):
        if w.bits == 4:
            out.append((w.q.clone(), e, w.scale.clone(), w.min.clone(), w.out_features, w.group, 4,
                        w.scale_d.clone(), w.min_d.clone()))
        elif six:
            nib, crumbs = K.int6_to_panels(q)
            out.append((nib, crumbs, K.to_panels(s.f), e, w.out_features, w.group, 6, K.to_panels(s.d.half()), e))
        else:
            out.append((K.to_panels(q), e, K.to_panels(s.expand()), e, w.out_features, w.group, 8, e, e))
    return out


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
            one = copies_of(w, six, 1)[0]
            mb = sum(t.numel() * t.element_size() for t in one if isinstance(t, torch.Tensor)) / 1e6
            ws = copies_of(w, six, max(1, round(STREAM_MB / mb)))
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
