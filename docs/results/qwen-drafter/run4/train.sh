#!/usr/bin/env bash
# Issue 16, 2026-12-01 (fourth session): the shipped drafter (third run, 2 layers, 2,400 steps) trained on to 3,400
# steps on the same 5,600 chat answers. --steps 3400 re-spans the cosine over 3,400 steps, so step 2,400 resumes at
# lr 1.0e-4 (it had decayed to the floor) and anneals again. Run from the repository root, with OUT a copy of the
# third run's directory (its training_state.pt at step 2,400 and its data/):
#   TARGET=runs/qwen2.5-coder-0.5b-instruct OUT=runs/qwen-drafter-v4 bash docs/results/qwen-drafter/run4/train.sh
exec python -m d3d train-drafter --target "${TARGET:-runs/qwen2.5-coder-0.5b-instruct}" --out "${OUT:-runs/qwen-drafter-v4}" \
  --data chat --n-sequences 5600 --gen-len 160 --window 256 --num-layers 2 --draft-vocab 16384 --threads 2 \
  --batch-size 8 --steps 3400 --lr 5e-4 --warmup 100 --eval-every 400 --eval-prompts 8 --eval-new-tokens 64 \
  --save-every 50 --log-every 10 --resume "$@"
