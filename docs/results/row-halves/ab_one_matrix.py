"""One matrix (1024 x 1536) of each format the VNNI kernel takes, at 8 and 16 rows: this checkout's kernel against
the same file at REV, built side by side, calls interleaved, medians of 40 (us). Same bits checked first. The
int4 matrices stay in L2 on one thread; the int8 one (1.5 MB) does not.

    python docs/results/row-halves/ab_one_matrix.py REV [THREADS]
"""
import statistics, sys, time, torch
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "docs/results/vnni-streams"))
from test_quant import vnni_format
from sweep import build_at
from d3d.kernels import quant as K
rev = sys.argv[1]
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
kernels = {"new": K._load_vnni()[0], rev: build_at(rev)}
N, Kd = 1024, 1536
g = torch.Generator().manual_seed(0)
E = K._EMPTY
for fmt in ["int8-16", "int5-16", "int4-16", "q4k", "q6k"]:
    args, _ = vnni_format(fmt, N, Kd, g)
    q, s, m, n, bits, h = args[:6]
    sd, md = (args[6], args[7]) if len(args) > 6 else (None, None)
    call_args = (q, E if h is None else h, s, E if m is None else m, n, Kd // s.shape[1], bits, E if sd is None else sd, E if md is None else md)
    line = []
    for M in (8, 16):
        x = torch.randn(M, Kd)
        outs = {name: k.matmul(x, *call_args) for name, k in kernels.items()}
        assert len({o.numpy().tobytes() for o in outs.values()}) == 1
        ts = {name: [] for name in kernels}
        for _ in range(40):
            for name, k in kernels.items():
                t = time.perf_counter(); k.matmul(x, *call_args); ts[name].append(time.perf_counter() - t)
        line.append(f"M={M:2d} " + " vs ".join(f"{name} {statistics.median(v) * 1e6:6.1f}" for name, v in ts.items()))
    print(f"{fmt:8}", " | ".join(line), flush=True)
