"""One T-row pass of a real model, the full LM head against the greedy head (``d3d.cpu.greedy_head``), in turns on
the same cache (200 tokens of a standard-library source, then T more of it), medians; every argmax checked equal,
and the columns the greedy head computed exactly per row. Past its ``rows`` (``GREEDY_ROWS``: 4 with the VNNI kernel) a
greedy pass takes the full head as any other: set to 16 here so that every T is timed. Run from the repository root:

    python docs/results/greedy-head/passes.py MODEL OUT.json [REPS] [--avx2]

``--avx2``: this CPU as a stand-in for an AVX2-only one (``docs/results/avx2-int8/stand_in.py``: the AVX2 int8 kernel).
"""
import inspect
import statistics
import sys
import time

import torch

import d3d
from bench.common import machine, write_json
from d3d.kernels import quant as kernel
from d3d.fetch import resolve_model

if "--avx2" in sys.argv:
    sys.argv.remove("--avx2")
    sys.path.insert(0, "docs/results/avx2-int8")
    from stand_in import avx2_only  # noqa: E402

    avx2_only()
torch.set_grad_enabled(False)
name, out_path = sys.argv[1:3]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 21
path = resolve_model(name)
m, tok = d3d.load_model(path, weights="auto"), d3d.load_tokenizer(path)
ids = torch.tensor(tok.encode(open(inspect.getsourcefile(statistics)).read()[3000:12000]))
ctx, Ts = 200, (1, 2, 4, 8, 16)
cache = m.new_cache(1, ctx + max(Ts))
m(ids[:ctx], cache.layout([ctx]), cache)
head = m.greedy_head()
if head is None:
    raise SystemExit(f"{name}: its LM head is not one the greedy head takes")
rows, head.rows = head.rows, max(Ts)
times, computed = {}, []
for rep in range(reps):
    for T in Ts:
        new = ids[ctx + rep * 7: ctx + rep * 7 + T]
        outs = {}
        for greedy in ((False, True) if rep % 2 else (True, False)):
            t = time.perf_counter()
            logits = m(new, cache.layout([T]), cache, greedy=greedy)
            times.setdefault(f"{T}/{'greedy' if greedy else 'full'}", []).append(time.perf_counter() - t)
            cache.crop(0, ctx)
            outs[greedy] = logits
        if not torch.equal(outs[True].argmax(-1), outs[False].argmax(-1)):
            raise SystemExit(f"T={T}: the argmax differs")
        if T <= 4:
            computed += torch.isfinite(outs[True]).sum(-1).tolist()
summary = {}
for T in Ts:
    a, b = statistics.median(times[f"{T}/full"]), statistics.median(times[f"{T}/greedy"])
    summary[T] = {"full_ms": a * 1e3, "greedy_ms": b * 1e3, "speedup": a / b}
    print(f"T={T:2d}: full {a * 1e3:6.2f} ms, greedy head {b * 1e3:6.2f} ms, {a / b:.3f}x")
c = sorted(computed)
cols = {"median": c[len(c) // 2], "p90": c[int(len(c) * 0.9)], "max": c[-1], "rows": len(c)}
print("columns computed exactly per row (T <= 4):", cols)
write_json(out_path, {"bench": "greedy head against the full LM head, one pass", "machine": machine(), "model": name,
                      "context": ctx, "reps": reps, "summary": summary, "exact_columns": cols,
                      "greedy_rows": rows, "int8_kernel": kernel.int8_kernel().__name__})
