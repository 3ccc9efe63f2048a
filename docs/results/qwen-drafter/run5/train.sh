#!/usr/bin/env bash
# Issue 16, 2026-12-02 (fifth session): the shipped drafter (third run, 2 layers, 2,400 steps on 5,600 chat answers)
# trained on to 4,800 steps on the 11,200 answers of more-data/ (the first 5,600 are the ones it saw; the other
# 5,600 ask about 205 more standard-library functions and 5,395 functions of other installed packages). A warm
# restart: --steps 4800 re-spans the cosine, so step 2,400 resumes at lr 2.3e-4 (peak 4e-4, below the first run's
# 5e-4 because the model is already trained) and anneals to 4e-5. The drafting vocabulary stays the shipped
# drafter's 16,384 ids (the head rows follow them; the log reports their coverage of the new answers).
# --eval-prompts 16: the monitor's τ over 16 validation requests, not 8 (8 x 64 tokens moved by ±0.07 between
# neighbouring evaluations of the fourth run). Run from the repository root, with OUT a copy of the third run's
# directory (its training_state.pt at step 2,400) whose data/ holds more-data's answers:
#   TARGET=runs/qwen2.5-coder-0.5b-instruct OUT=runs/qwen-drafter-v6 bash docs/results/qwen-drafter/run5/train.sh
# Resumable: rerun the same command.
exec python -m d3d train-drafter --target "${TARGET:-runs/qwen2.5-coder-0.5b-instruct}" --out "${OUT:-runs/qwen-drafter-v6}" \
  --data chat --n-sequences 11200 --extra-functions --gen-len 160 --window 256 --num-layers 2 --draft-vocab 16384 \
  --threads 2 --batch-size 8 --steps 4800 --lr 4e-4 --warmup 100 --eval-every 400 --eval-prompts 16 \
  --eval-new-tokens 64 --save-every 50 --log-every 10 --resume "$@"
