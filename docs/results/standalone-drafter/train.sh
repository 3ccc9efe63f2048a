#!/usr/bin/env bash
# Issue 51, 2026-12-05 (twenty-second session): one drafter for both targets. The shipped drafter (built from
# the 0.5B: its layers, its embedding and LM-head rows, named by embeddings_from) trained on for STEPS steps
# on the 1.5B's answers (data/qwen2.5-coder-1.5b-answers) with the 0.5B's answers to the same kind of
# requests as half the rows (--also-answers, a seeded subset); the 1.5B verifies the τ monitor. As run7-run9:
# --init-drafter, a fresh optimizer, 50 warm-up steps to 3e-4, cosine to 3e-5. Run from the repository root
# (state in OUT, resumable with --resume):
#   python -m d3d fetch qwen2.5-coder-0.5b qwen2.5-coder-1.5b
#   OUT=~/.cache/d3d-runs/q15-drafter/run bash docs/results/standalone-drafter/train.sh
exec python -m d3d train-drafter --target "${TARGET:-$HOME/.cache/d3d/qwen2.5-coder-1.5b}" --base qwen2.5-coder-0.5b \
  --out "${OUT:-$HOME/.cache/d3d-runs/q15-drafter/run}" \
  --data chat --answers data/qwen2.5-coder-1.5b-answers --also-answers data/qwen2.5-coder-answers --also-share 0.5 \
  --data-minutes 0 --gen-len 160 --window 256 --num-layers 2 --draft-vocab 16384 \
  --init-drafter "${INIT:-models/d3d-drafter-qwen2.5-coder-0.5b}" --threads 2 --batch-size 8 --steps "${STEPS:-1400}" \
  --lr 3e-4 --warmup 50 --eval-every 700 --eval-prompts 16 --eval-new-tokens 64 --save-every 50 --log-every 10 "$@"
