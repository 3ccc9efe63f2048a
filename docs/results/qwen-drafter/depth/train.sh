#!/usr/bin/env bash
# Issue 16, 2026-12-01 (third session): depth comparison — 4 layers (init from target layers 0/8/15/23) against the
# 2-layer distillation run (qwen-drafter-kd: 1.291/1.502/1.583/1.661 at steps 250/500/750/1000), same data, soft
# labels (--soft-labels 8, cached: OUT/data links the kd run's), schedule (1,000 steps x 8 x 256, lr 5e-4), compacted
# BD3 pass and length-grouped batches. First session: --stop-after 500, then --resume until the step-750 evaluation
# (stopped by SIGTERM, state saved); the next session, --resume to step 1,000. Resumable: rerun with --resume.
cd "$(dirname "$0")/../../../.."
exec python -m d3d train-drafter --target "${TARGET:-runs/qwen2.5-coder-0.5b-instruct}" --out "${OUT:-runs/qwen-drafter-4l}" \
  --data chat --n-sequences 5600 --gen-len 160 --window 256 --num-layers 4 --draft-vocab 16384 --threads 2 \
  --batch-size 8 --steps 1000 --lr 5e-4 --warmup 100 --eval-every 250 --eval-prompts 8 --eval-new-tokens 64 \
  --save-every 50 --log-every 10 --soft-labels 8 "$@"
