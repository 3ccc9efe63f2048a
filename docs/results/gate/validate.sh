#!/usr/bin/env bash
# The gate's default on validation requests only (held-out functions; never an evaluation prompt):
# ar, sync without and with the gate, side by side in one run per set (~30 min on a 2-core AVX2 CPU).
#   bash docs/results/gate/validate.sh TARGET_DIR [OUT_DIR]
set -euo pipefail
T=${1:?target directory (bench/get_qwen25_coder.sh)}
D=${2:-docs/results/gate}
for set in code explain; do
  python -m bench speculative --target "$T" --drafter models/d3d-drafter-qwen2.5-coder-0.5b --chat --validation \
    --sets $set --n 8 --new-tokens 128 --modes ar sync+nogate sync+gate --out "$D/validation_$set.json"
done
