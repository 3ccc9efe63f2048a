"""What an answer store holds, per request kind: rows, answer tokens, mean answer length, share
of answers at the cap, and the bytes its chunks take per token.

    PYTHONPATH=. python docs/results/answer-store/summary.py data/qwen2.5-coder-answers OUT_JSON
"""
import sys
from pathlib import Path

from d3d.files import write_json
from d3d.data.answers import read_manifest, sealed_answers

root, out = Path(sys.argv[1]), sys.argv[2]
manifest, answers = read_manifest(root), sealed_answers(root)
cap = manifest["gen_len"]
kinds = {}
for a in answers:
    k = kinds.setdefault(a.kind, {"rows": 0, "answer_tokens": 0, "prompt_tokens": 0, "at_cap": 0})
    k["rows"] += 1
    k["answer_tokens"] += len(a.answer)
    k["prompt_tokens"] += len(a.prompt)
    k["at_cap"] += len(a.answer) == cap
for k in kinds.values():
    k["mean_answer"] = round(k["answer_tokens"] / k["rows"], 1)
    k["at_cap_share"] = round(k["at_cap"] / k["rows"], 3)
nbytes = sum((root / c["file"]).stat().st_size for c in manifest["chunks"])
answer_tokens = sum(k["answer_tokens"] for k in kinds.values())
stored = answer_tokens + sum(k["prompt_tokens"] for k in kinds.values())
summary = {"store": str(root), "chunks": len(manifest["chunks"]), "rows": len(answers), "answer_tokens": answer_tokens,
           "bytes": nbytes, "bytes_per_answer_token": round(nbytes / answer_tokens, 3),
           "bytes_per_stored_token": round(nbytes / stored, 3),
           "generation_seconds": sum(c["seconds"] or 0 for c in manifest["chunks"]), "kinds": kinds}
write_json(out, summary)
print(summary)
