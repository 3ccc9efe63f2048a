#!/usr/bin/env bash
# Issue 16, 2026-12-01 (fourth session): drafting cost against τ, 4-layer drafter (train.sh, 1,000 steps) and the
# shipped 2-layer one (2,400 steps), each in its own run of the bench (ar measured beside it), on validation
# requests only (code requests and prose explanations of validation functions), bf16, 128 tokens, sync with verify_min_prob 0.05.
# Run from the repository root:  TARGET=… OUT=… bash docs/results/qwen-drafter/depth/bench.sh
set -euo pipefail
D=docs/results/qwen-drafter/depth
for d in "4l:${OUT:-runs/qwen-drafter-4l}" "2l:models/d3d-drafter-qwen2.5-coder-0.5b"; do
  python -m bench speculative --target "${TARGET:-runs/qwen2.5-coder-0.5b-instruct}" --drafter "${d#*:}" --chat --validation \
    --sets code explain --n 8 --new-tokens 128 --modes ar sync,verify_min_prob=0.05 --out "$D/bench_${d%%:*}.json"
done
