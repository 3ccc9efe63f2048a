"""attend_cpu.cpp on fixed random inputs: ``save`` its outputs, or ``check`` that a changed kernel gives the
same bits, and time 8 query rows over ~220 cached keys (L1-resident) for the 0.5B's and the 1.5B's heads.

    python docs/results/vnni-streams/attend_bits.py save    # before the change
    python docs/results/vnni-streams/attend_bits.py check   # after it
"""
import sys
import time

import torch

from d3d.kernels import attention_cpu as A
REF = "/tmp/attend_bits.pt"
mod = A._load()[0]
g = torch.Generator().manual_seed(0)
outs = []
for (T, H, Hkv, D, L, dt) in [(8, 14, 2, 64, 300, torch.float32), (8, 12, 2, 128, 300, torch.float32), (5, 16, 4, 96, 77, torch.bfloat16), (1, 14, 2, 64, 210, torch.float32), (3, 12, 2, 128, 50, torch.bfloat16)]:
    q = torch.randn(T, H, D, generator=g).to(dt)
    kc = torch.randn(2, Hkv, L, D, generator=g).to(dt); vc = torch.randn(2, Hkv, L, D, generator=g).to(dt)
    rows = torch.tensor([i % 2 for i in range(T)]); nk = torch.tensor([L - 3 - i for i in range(T)])
    first = nk - 2; mask = torch.ones(T, 2, dtype=torch.bool); mask[:, 1] = False
    outs.append(mod.attend(q, kc, vc, rows, nk, first, mask, D ** -0.5))
    if T == 8:
        qq = torch.randn(T, H, D); kk = torch.randn(1, Hkv, 512, D); vv = torch.randn(1, Hkv, 512, D)
        r = torch.zeros(T, dtype=torch.long); n = torch.tensor([220 + i for i in range(T)]); f = n.clone(); m = torch.zeros(T, 0, dtype=torch.bool)
        for _ in range(200): mod.attend(qq, kk, vv, r, n, f, m, 0.1)
        s = time.perf_counter()
        for _ in range(2000): mod.attend(qq, kk, vv, r, n, f, m, 0.1)
        print(f"T=8 H={H} D={D}: {(time.perf_counter() - s) / 2000 * 1e6:.1f} us a layer")
if sys.argv[1] == "save":
    torch.save(outs, REF)
else:
    ref = torch.load(REF)
    print("identical bits:", all(torch.equal(a, b) for a, b in zip(outs, ref)))
