#!/usr/bin/env bash
# After the choice on validation requests: the evaluation prompts (HumanEval 16, MT-Bench 8 first turns),
# ar, sync at the old fixed 0.05, sync (defaults: verify_min_prob auto) and sync with datastore drafts (the
# README command), side by side in one run per set (~35 min, AVX2 fp32).
#   bash docs/results/copy-length/evaluate.sh TARGET_DIR [OUT_DIR]
set -euo pipefail
T=${1:?target directory (python -m d3d fetch qwen2.5-coder-0.5b)}
D=${2:-docs/results/copy-length}
for spec in "humaneval 16" "mtbench 8"; do
  set -- $spec
  python -m bench speculative --target "$T" --drafter models/d3d-drafter-qwen2.5-coder-0.5b --chat \
    --sets $1 --n $2 --new-tokens 128 --modes ar sync,verify_min_prob=0.05 sync sync,store=0 \
    --datastore data/qwen2.5-coder-answers --out "$D/speculative_$1.json"
done
