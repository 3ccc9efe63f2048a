#!/usr/bin/env bash
# The gate on the evaluation sets (after its default was chosen on validation requests): ar, the
# sync (its defaults: no gate) and sync with the gate (~35 min on a 2-core AVX2 CPU).
#   bash docs/results/gate/evaluate.sh TARGET_DIR [OUT_DIR]
set -euo pipefail
T=${1:?target directory (bench/get_qwen25_coder.sh)}
D=${2:-docs/results/gate}
python -m bench speculative --target "$T" --drafter models/d3d-drafter-qwen2.5-coder-0.5b --chat --sets mtbench \
  --n 8 --new-tokens 128 --modes ar sync sync+gate --out "$D/speculative_mtbench.json"
python -m bench speculative --target "$T" --drafter models/d3d-drafter-qwen2.5-coder-0.5b --chat --sets humaneval \
  --n 16 --new-tokens 128 --modes ar sync sync+gate --out "$D/speculative_humaneval.json"
