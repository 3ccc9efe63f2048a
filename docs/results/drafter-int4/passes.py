"""One drafter pass of sync's shape (the anchor and 4 masks after 2 newly committed tokens, a 200-token context
cached), its matrices int8 against int4 (groups of 32, requantized from the stored int8), beside the real quantized
target; median ms of REPS passes, the two taking turns. Run from the repository root:

    python docs/results/drafter-int4/passes.py MODEL OUT.json [REPS] [--avx2]

``--avx2``: this CPU as a stand-in for an AVX2-only one (``docs/results/avx2-int8/stand_in.py``: the AVX2 int8 kernel).
"""
import statistics
import sys
import time

import torch

sys.path.insert(0, "docs/results/avx2-int8")
from stand_in import avx2_from_argv  # noqa: E402

avx2_from_argv()
import d3d  # noqa: E402
from bench.common import machine, write_json  # noqa: E402
from d3d.assets import models_dir  # noqa: E402
from d3d.cpu.quant import quantize  # noqa: E402
from d3d.draft.drafter import Block, load_drafter  # noqa: E402
from d3d.fetch import resolve_model  # noqa: E402
from d3d.kernels import quant as kernel  # noqa: E402
from d3d.model.transformer import QuantLinear  # noqa: E402

torch.set_grad_enabled(False)
name, out_path = sys.argv[1], sys.argv[2]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 50
target = d3d.load_model(resolve_model(name), weights="auto")
drafters = {}
for how in ("int8", "int4"):
    d = load_drafter(models_dir() / "d3d-drafter-qwen2.5-coder-0.5b", target=target, weights="int8")
    for n, mod in list(d.model.named_modules()):
        if how == "int4" and isinstance(mod, QuantLinear) and (n.startswith("layers") or n == "lm_head"):
            d.model.set_weight(n + ".weight", quantize(mod.weight.dequantize(), "int4"))
    drafters[how] = d
context = [(7 * i + 11) % 30000 for i in range(203)]
ms = {how: [] for how in drafters}
for i in range(reps + 3):
    for how, d in (drafters.items() if i % 2 == 0 else reversed(drafters.items())):
        cache = d.new_cache(1, 256)
        d.draft_blocks(cache, [0], [context[:198]], [[Block(198, context[198])]], 5)  # the context cached
        t = time.perf_counter()
        d.draft_blocks(cache, [0], [context[198:200]], [[Block(2, context[200])]], 5)
        if i >= 3:
            ms[how].append(1e3 * (time.perf_counter() - t))
summary = {how: round(statistics.median(v), 3) for how, v in ms.items()}
isa = "vnni" if kernel.vnni_available() else "avx2"
print(f"{name}, {isa}: drafter pass ms", summary, f"int4 / int8 {summary['int4'] / summary['int8']:.3f}")
write_json(out_path, {"bench": "drafter pass, int8 vs int4", "machine": machine(), "model": name, "isa": isa,
                      "reps": reps, "median_ms": summary, "ms": ms})
