#!/usr/bin/env bash
# verify_min_prob "auto" (d3d/decode/row_price.py; copied chains now carry d3d/decode/lookup.py's estimates) on
# validation requests only (held-out functions; never an evaluation prompt): ar, sync at 0.05 (the default then),
# auto and 0.2 side by side in one run per set (~50 min on a 2-core AVX2 CPU in fp32).
#   bash docs/results/copy-length/validate.sh TARGET_DIR [OUT_DIR]
# The second run: RUN=2 MODES= bash docs/results/copy-length/validate.sh TARGET_DIR (no 0.2)
set -euo pipefail
T=${1:?target directory (python -m d3d fetch qwen2.5-coder-0.5b)}
D=${2:-docs/results/copy-length}
for set in code explain; do
  python -m bench speculative --target "$T" --drafter models/d3d-drafter-qwen2.5-coder-0.5b --chat --validation \
    --sets $set --n 8 --new-tokens 128 --modes ar sync,verify_min_prob=0.05 sync,verify_min_prob=auto \
    ${MODES-sync,verify_min_prob=0.2} --out "$D/validation${RUN:-}_$set.json"
done
