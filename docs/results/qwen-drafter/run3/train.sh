#!/usr/bin/env bash
# Issue 16, third run (2026-12-01, second session): the second run's drafter (1,000 steps, docs/results/qwen-drafter/
# train.sh) trained on to 2,400 steps on the same 5,600 chat answers. --steps 2400 re-spans the cosine schedule over
# 2,400 steps, so step 1,000 restarts at lr 3.5e-4 (a warm restart; it had decayed to 5e-5). Run from the repository root, with OUT the
# second run's directory (its training_state.pt at step 1,000 and its data/):
#   TARGET=runs/qwen2.5-coder-0.5b-instruct OUT=runs/qwen-drafter bash docs/results/qwen-drafter/run3/train.sh
# This run used the trainer as it was before the compacted BD3 pass and the length-grouped batches (both landed
# while it ran); rerun today, the same command trains faster and draws other batches.
exec python -m d3d train-drafter --target "${TARGET:-runs/qwen2.5-coder-0.5b-instruct}" --out "${OUT:-runs/qwen-drafter}" \
  --data chat --n-sequences 5600 --gen-len 160 --window 256 --num-layers 2 --draft-vocab 16384 --threads 2 \
  --batch-size 8 --steps 2400 --lr 5e-4 --warmup 100 --eval-every 400 --eval-prompts 8 --eval-new-tokens 64 \
  --save-every 50 --log-every 10 --resume "$@"
