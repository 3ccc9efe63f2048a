#!/usr/bin/env bash
# Issues 47 and 51, 2026-12-06 (thirty-seventh session): the shipped drafter trained on for STEPS steps on the
# 0.5B's answers to general chat requests (data/qwen2.5-coder-chat-answers, --requests chat:
# d3d/train/general_requests.py) with as many rows of its answers about functions (--also-answers, a seeded
# subset of data/qwen2.5-coder-answers), so that it drafts prose as well as code; its drafting vocabulary chosen afresh
# from those rows (--fresh-vocab: 16,384 ids covered 87.9% of them). As run7-run9: --init-drafter, a
# fresh optimizer, 50 warm-up steps to 3e-4, cosine to 3e-5. Run from the repository root (state in OUT,
# resumable with --resume):
#   python -m d3d fetch qwen2.5-coder-0.5b
#   OUT=~/.cache/d3d-runs/chat-drafter/run bash docs/results/chat-drafter/train.sh
exec python -m d3d train-drafter --target "${TARGET:-$HOME/.cache/d3d/qwen2.5-coder-0.5b}" \
  --out "${OUT:-$HOME/.cache/d3d-runs/chat-drafter/run}" \
  --data chat --requests chat --answers data/qwen2.5-coder-chat-answers \
  --also-answers data/qwen2.5-coder-answers --also-share 0.5 \
  --data-minutes 0 --gen-len 160 --window 256 --num-layers 2 --draft-vocab 16384 \
  --init-drafter "${INIT:-models/d3d-drafter-qwen2.5-coder-0.5b}" --fresh-vocab --threads 2 --batch-size 8 --steps "${STEPS:-1000}" \
  --lr 3e-4 --warmup 50 --eval-every 1000 --eval-prompts 8 --eval-new-tokens 64 --save-every 50 --log-every 10 "$@"
