#!/usr/bin/env bash
# before/after speed of the defaults: an old checkout vs a new one (d5daae3 vs HEAD when first run), alternating
# A B A B, validation requests:  bash docs/results/refactor/ab.sh OLD_CHECKOUT NEW_CHECKOUT [OUT_DIR]
set -u
old=${1:?old checkout}; new=${2:?new checkout}; out=${3:-~/.cache/d3d-runs/ab}
mkdir -p "$out"
for round in 1 2; do
  for side in old new; do
    dir=$([ $side = old ] && echo "$old" || echo "$new")
    (cd $dir && PYTHONPATH=$dir python -m bench speculative --validation --sets code --n 16 --new-tokens 128 \
        --modes ar sync --out $out/bundled_${side}_$round.json > $out/bundled_${side}_$round.log 2>&1)
    echo "bundled $side $round rc=$?"
  done
done
for round in 1 2; do
  for side in old new; do
    dir=$([ $side = old ] && echo "$old" || echo "$new")
    (cd $dir && PYTHONPATH=$dir python -m bench speculative --validation --chat --sets code explain --n 8 --new-tokens 128 \
        --target ~/.cache/d3d-runs/qwen-q --drafter $dir/models/d3d-drafter-qwen2.5-coder-0.5b \
        --modes ar sync --out $out/real_${side}_$round.json > $out/real_${side}_$round.log 2>&1)
    echo "real $side $round rc=$?"
  done
done
