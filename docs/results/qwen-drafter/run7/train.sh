#!/usr/bin/env bash
# Issue 16, 2026-12-02 (eighth session): the shipped drafter (run6's, int8) trained on for 1,000 steps on the
# committed answer store (data/qwen2.5-coder-answers: code and prose-explanation answers). No training state
# survived the machine change, so the run starts from the committed files (--init-drafter) with a fresh optimizer:
# 50 warm-up steps to 3e-4, cosine to 3e-5. --data-minutes 0: train on the store as it is. INIT: the drafter to
# start from (the run started from the sixth run's, models/ at commit 473eb06). Run from the repo root:
#   TARGET=runs/qwen2.5-coder-0.5b-instruct OUT=runs/qwen-drafter-v8 bash docs/results/qwen-drafter/run7/train.sh
exec python -m d3d train-drafter --target "${TARGET:-runs/qwen2.5-coder-0.5b-instruct}" --out "${OUT:-runs/qwen-drafter-v8}" \
  --data chat --answers data/qwen2.5-coder-answers --data-minutes 0 --gen-len 160 --window 256 \
  --num-layers 2 --draft-vocab 16384 --init-drafter "${INIT:-models/d3d-drafter-qwen2.5-coder-0.5b}" \
  --threads 2 --batch-size 8 --steps 1000 --lr 3e-4 --warmup 50 --eval-every 500 \
  --eval-prompts 16 --eval-new-tokens 64 --save-every 50 --log-every 10 "$@"
