#!/usr/bin/env bash
# Issue 16, 2026-12-02 (ninth session): run7's recipe (docs/results/qwen-drafter/run7/train.sh: from the shipped
# drafter, --init-drafter, a fresh optimizer, 50 warm-up steps to 3e-4, cosine to 3e-5, the whole answer store),
# for 1,600 steps, started from run7's drafter (models/ at the commit that adds this file) on the store grown by
# this session's chunks. Run from the repository root:
#   TARGET=runs/qwen2.5-coder-0.5b-instruct OUT=runs/qwen-drafter-v9 bash docs/results/qwen-drafter/run8/train.sh
OUT=${OUT:-runs/qwen-drafter-v9} exec bash docs/results/qwen-drafter/run7/train.sh --steps 1600 "$@"
