"""How full the fixed batches of 64 were that made the answer store's first chunks (before continuous
batching): a batch runs until its longest answer ends, so its occupancy is
sum(answer lengths) / (64 × longest answer). Batches are rebuilt from the stored order, 64 at a time
(chunks 0-3: 13,112 answers, all made in fixed batches; the 8 answers dropped later shift a few
batch boundaries, which does not matter at this precision).

    PYTHONPATH=. python docs/results/continuous/occupancy.py data/qwen2.5-coder-answers docs/results/continuous/occupancy.json
"""
import sys
from pathlib import Path

from d3d.files import write_json
from d3d.data.answers import read_chunk, read_manifest

root, out = Path(sys.argv[1]), sys.argv[2]
chunks = read_manifest(root)["chunks"][:4]
lengths = [len(a.answer) for c in chunks for a in read_chunk(root / c["file"])]
batches = [lengths[i: i + 64] for i in range(0, len(lengths), 64)]
steps = sum(max(b) for b in batches)
result = {"chunks": [c["file"] for c in chunks], "answers": len(lengths), "batch": 64,
          "occupancy": round(sum(lengths) / (64 * steps), 3),
          "mean_answer": round(sum(lengths) / len(lengths), 1)}
write_json(out, result)
print(result)
