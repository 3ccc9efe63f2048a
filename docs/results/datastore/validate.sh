#!/usr/bin/env bash
# The datastore's setting on validation requests only (held-out functions; never an evaluation prompt):
# ar, sync (defaults), sync with datastore drafts (Datastore defaults: prior 1, any first estimate), side by side
# in one run per set (~40 min on a 2-core AVX2 CPU in fp32).
#   bash docs/results/datastore/validate.sh TARGET_DIR [OUT_DIR]
set -euo pipefail
T=${1:?target directory (python -m d3d fetch qwen2.5-coder-0.5b)}
D=${2:-docs/results/datastore}
for set in code explain; do
  python -m bench speculative --target "$T" --drafter models/d3d-drafter-qwen2.5-coder-0.5b --chat --validation \
    --sets $set --n 8 --new-tokens 128 --modes ar sync sync,store=0 \
    --datastore data/qwen2.5-coder-answers --out "$D/validation2_$set.json"
done
