"""What attention over a long context costs a decoding step (``attend_cpu``, one query row, fp32 K and V): the
0.5B's heads (14 x 64, 2 kv heads, 24 layers) and the 1.5B's (12 x 128, 2 kv, 28 layers), each layer its own
cache, so that a step reads them from memory as decoding does; then one layer's cache kept in cache (resident) on
1 and 2 threads. Medians. ``attend_blocks.patch`` (each key read once for all heads, in 16 KB blocks; the same
bits) measured slower with this script (0.5B at 4,096 keys: 9.94 against 7.95 ms a step) and is not applied.

    python docs/results/draft-window/attention.py > docs/results/draft-window/attention.txt
"""
import statistics
import time

import torch

from d3d.hardware import cpu_flags
from d3d.kernels.attention_cpu import _load

attend = _load()[0].attend
HEADS = (("0.5B", 14, 2, 64, 24), ("1.5B", 12, 2, 128, 28))
print("cpu flags:", " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "avx_vnni", "amx")))))


def call(T, H, Hkv, D, L, kc, vc, g):
    q = torch.randn(T, H, D, generator=g)
    rows, nkeys = torch.zeros(T, dtype=torch.long), torch.full((T,), L)
    first, mask = torch.full((T,), L - 1), torch.ones(T, 1, dtype=torch.bool)
    return lambda: attend(q, kc, vc, rows, nkeys, first, mask, D ** -0.5, 0)


torch.set_num_threads(2)
for name, H, Hkv, D, layers in HEADS:
    for L in (256, 1024, 2048, 4096):
        g = torch.Generator().manual_seed(L)
        caches = [(torch.randn(1, Hkv, L + 8, D, generator=g), torch.randn(1, Hkv, L + 8, D, generator=g))
                  for _ in range(layers)]
        calls = [call(1, H, Hkv, D, L, kc, vc, g) for kc, vc in caches]
        ts = []
        for _ in range(12):
            t = time.perf_counter()
            for c in calls:
                c()
            ts.append(time.perf_counter() - t)
        dt = statistics.median(ts[2:])
        mb = layers * 2 * Hkv * L * D * 4 / 1e6
        print(f"{name} L={L:5d}, 2 threads, caches from memory: {dt * 1e3:6.2f} ms a step ({layers} layers), "
              f"K and V {mb:6.1f} MB -> {mb / 1e3 / dt:5.1f} GB/s, {layers * H * L * D * 4 / dt / 1e9:5.1f} GFLOP/s")
for threads in (1, 2):
    torch.set_num_threads(threads)
    for name, H, Hkv, D, _ in HEADS:
        L = 4096
        g = torch.Generator().manual_seed(L)
        kc, vc = torch.randn(1, Hkv, L + 8, D, generator=g), torch.randn(1, Hkv, L + 8, D, generator=g)
        c = call(1, H, Hkv, D, L, kc, vc, g)
        ts = []
        for _ in range(200):
            t = time.perf_counter()
            c()
            ts.append(time.perf_counter() - t)
        dt = statistics.median(ts[20:])
        print(f"{name} L={L}, {threads} thread(s), one layer resident: {dt * 1e6:7.1f} us, "
              f"{H * L * D * 4 / dt / 1e9:5.1f} GFLOP/s")
