#!/usr/bin/env bash
# Issue 16, 2026-12-01 (second session): the v2 recipe (2 layers, 1,000 steps x 8 x 256, lr 5e-4) on the same 5,600
# chat answers, distilled on the target's top-8 distributions (--soft-labels 8; labels made first, cached in data/),
# with the compacted BD3 pass and length-grouped batches. Compare validation τ at 250/500/750/1000 with v2's
# 1.316/1.480/1.612/1.617. Resumable: rerun with --resume once training has saved (labels resume by themselves).
# Run from anywhere: TARGET=runs/qwen2.5-coder-0.5b-instruct OUT=runs/qwen-drafter-kd bash docs/results/qwen-drafter/kd/train.sh
# With the second run's answers linked into OUT/data (chat-answers-*.pt) only the soft labels are made (~55 min here);
# without them the answers are generated first (~73 min, docs/results/qwen-drafter/train.sh).
cd "$(dirname "$0")/../../../.."
exec python -m d3d train-drafter --target "${TARGET:-runs/qwen2.5-coder-0.5b-instruct}" --out "${OUT:-runs/qwen-drafter-kd}" \
  --data chat --n-sequences 5600 --gen-len 160 --window 256 --num-layers 2 --draft-vocab 16384 --threads 2 \
  --batch-size 8 --steps 1000 --lr 5e-4 --warmup 100 --eval-every 250 --eval-prompts 8 --eval-new-tokens 64 \
  --save-every 50 --log-every 10 --soft-labels 8 "$@"
