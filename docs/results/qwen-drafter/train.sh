#!/usr/bin/env bash
# Issue 16, 2026-12-01: the target's chat answers to 5,600 standard-library requests, then the 2-layer
# drafter now in models/d3d-drafter-qwen2.5-coder-0.5b. Run from the repository root:
#   TARGET=runs/qwen2.5-coder-0.5b-instruct OUT=runs/qwen-drafter bash docs/results/qwen-drafter/train.sh
# Resumable: answers are saved every 64 (rerun as is; add --data-minutes M to generate in chunks);
# training saves every 50 steps (rerun with --resume). The run was done in chunks exactly so.
exec python -m d3d train-drafter --target "${TARGET:-runs/qwen2.5-coder-0.5b-instruct}" --out "${OUT:-runs/qwen-drafter}" \
  --data chat --n-sequences 5600 --gen-len 160 --window 256 --num-layers 2 --draft-vocab 16384 --threads 2 \
  --batch-size 8 --steps 1000 --lr 5e-4 --warmup 100 --eval-every 250 --eval-prompts 8 --eval-new-tokens 64 \
  --save-every 50 --log-every 10 "$@"
