#!/usr/bin/env bash
# Superseded (2026-12-02, eighth session) by the committed answer store, which outlives the machine: see
# data/qwen2.5-coder-answers/README.md. This script now writes its answers to a store under OUT/data/answers.
# Issue 16, 2026-12-01 (fourth session): twice the chat answers, in session-sized chunks. The first 5,600 requests
# are the earlier runs' (their answers are reused when OUT/data holds them); the next 205 ask about the rest of
# the standard library's training functions, the other 5,395 about functions of the installed torch / pip /
# setuptools / triton / safetensors / tokenizers sources (training split of --corpus python-sources; a function
# whose text the standard library holds out is never asked about). --data-only: no training; rerun to go on
# (each call generates for at most DATA_MINUTES, saving every batch of 64). Run from the repository root:
#   TARGET=runs/qwen2.5-coder-0.5b-instruct OUT=runs/qwen-drafter-v5 DATA_MINUTES=50 bash docs/results/qwen-drafter/more-data/make_data.sh
# N_SEQUENCES (default 11200, what ../run5/ trained on) asks for more: a longer list's first 11,200 requests are
# these, so their finished answers are reused and only the rest is generated (17,321 functions on this machine).
exec python -m d3d train-drafter --target "${TARGET:-runs/qwen2.5-coder-0.5b-instruct}" --out "${OUT:-runs/qwen-drafter-v5}" \
  --data chat --n-sequences "${N_SEQUENCES:-11200}" --gen-len 160 --window 256 --extra-functions --threads 2 \
  --data-only --data-minutes "${DATA_MINUTES:-50}" "$@"
