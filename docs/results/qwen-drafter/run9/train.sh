#!/usr/bin/env bash
# Issue 16, 2026-12-03 (fifteenth session): the eighth run's recipe (run7/train.sh: --init-drafter from the shipped
# drafter, a fresh optimizer, 50 warm-up steps to 3e-4, cosine to 3e-5) for 1,600 steps on the whole answer store,
# now 12 chunks / 27,320 answers / 3.01M answer tokens (chunks 7-11 bring the tests and review requests the shipped
# drafter never saw). Started from the shipped (eighth run's) drafter: models/ at the commit that adds this file.
# On the 2-core AVX2 EPYC (fp32: no fast bf16 there), in chunks that fit a session:
#   TARGET=runs/qwen2.5-coder-0.5b-instruct OUT=runs/qwen-drafter-v10 bash docs/results/qwen-drafter/run9/train.sh --stop-after-minutes 55
#   ... later chunks: the same command with --resume added (the run's state is in OUT/training_state.pt).
OUT=${OUT:-runs/qwen-drafter-v10} exec bash docs/results/qwen-drafter/run7/train.sh --steps 1600 "$@"
