"""The q/k/v projections that mix formats (a Q4_K_M GGUF's layers whose v is held otherwise): q and k joined into
one matrix (``d3d.cpu.quant.join``'s runs, now) against each block alone (before), the model loaded both ways, the
projections of every such layer timed in turns (``Stacked.linear``, weights from memory), outputs checked equal.

    python docs/results/kquant-rows/qk_join.py qwen2.5-coder-0.5b > docs/results/kquant-rows/qk_join_0.5b.txt
"""
import statistics
import sys
import time

import torch

import d3d.cpu.quant as cq
import d3d.model.checkpoint as ckpt
from d3d.fetch import resolve_model
from d3d.hardware import cpu_flags
from d3d.model.checkpoint import load_model


def stacked(model) -> list:
    return [m.weight for m in model.modules() if isinstance(getattr(m, "weight", None), cq.Stacked)]


def main():
    torch.set_grad_enabled(False)
    path = resolve_model(sys.argv[1])
    now = stacked(load_model(path, weights="auto"))
    ckpt.join = lambda parts, what="weight": (  # before: every block of a mixed-format matrix alone
        cq.join(parts, what) if cq.joins(parts) else cq.Stacked([cq.QuantWeight(*p, what=what) for p in parts]))
    try:
        before = stacked(load_model(path, weights="auto"))
    finally:
        ckpt.join = cq.join
    print(f"{sys.argv[1]}; cpu flags", " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))))
    print(f"{len(now)} mixed projections: blocks now {[p.out_features for p in now[0].parts]}, "
          f"before {[p.out_features for p in before[0].parts]}")
    for rows in (1, 8):
        x = torch.randn(rows, now[0].in_features)
        assert all(torch.equal(a.linear(x), b.linear(x)) for a, b in zip(now, before))
        t = {"now": [], "before": []}
        for _ in range(31):
            for name, ws in (("now", now), ("before", before)):
                s = time.perf_counter()
                for w in ws:
                    w.linear(x)
                t[name].append(time.perf_counter() - s)
        a, b = statistics.median(t["now"]), statistics.median(t["before"])
        print(f"rows {rows}: now {a * 1e3:.3f} ms, before {b * 1e3:.3f} ms a pass ({b / a:.2f}x)")


if __name__ == "__main__":
    main()
