#!/usr/bin/env bash
# Issue 16, 2026-12-02 (sixth session): the shipped drafter (fifth run, 2 layers, 4,800 steps on 11,200 chat
# answers) trained on for 1,000 more steps on the 16,800 answers of more-data/ (the first 11,200 are the ones it
# saw; the 5,600 new ones ask about more functions of the installed packages). A warm restart: --schedule-start
# 4800 warms up again (50 steps) to a peak of 3e-4 and anneals to 3e-5 by step 5,800. (The fifth run instead
# re-spanned one cosine over 0..4,800; re-spanning it over 0..5,800 would resume at 17% of its peak.)
# 1,000 steps: what fits a session after the data (2.5 s/step on this CPU, ~42 min plus the monitor).
# Run from the repository root, with OUT a copy of the fifth run's directory (its training_state.pt at
# step 4,800) whose data/ holds more-data's answers:
#   TARGET=runs/qwen2.5-coder-0.5b-instruct OUT=runs/qwen-drafter-v7 bash docs/results/qwen-drafter/run6/train.sh
# Resumable: rerun the same command.
exec python -m d3d train-drafter --target "${TARGET:-runs/qwen2.5-coder-0.5b-instruct}" --out "${OUT:-runs/qwen-drafter-v7}" \
  --data chat --n-sequences 16800 --extra-functions --gen-len 160 --window 256 --num-layers 2 --draft-vocab 16384 \
  --threads 2 --batch-size 8 --steps 5800 --schedule-start 4800 --lr 3e-4 --warmup 50 --eval-every 500 \
  --eval-prompts 16 --eval-new-tokens 64 --save-every 50 --log-every 10 --resume "$@"
