#!/usr/bin/env bash
# before/after speed of the defaults: old (d5daae3) vs new (HEAD), alternating A B A B, validation requests
set -u
out=~/.cache/d3d-runs/ab
for round in 1 2; do
  for side in old new; do
    dir=$([ $side = old ] && echo /tmp/old || echo /tmp/new)
    (cd $dir && PYTHONPATH=$dir python -m bench speculative --validation --sets code --n 16 --new-tokens 128 \
        --modes ar sync --out $out/bundled_${side}_$round.json > $out/bundled_${side}_$round.log 2>&1)
    echo "bundled $side $round rc=$?"
  done
done
for round in 1 2; do
  for side in old new; do
    dir=$([ $side = old ] && echo /tmp/old || echo /tmp/new)
    (cd $dir && PYTHONPATH=$dir python -m bench speculative --validation --chat --sets code explain --n 8 --new-tokens 128 \
        --target ~/.cache/d3d-runs/qwen-q --drafter $dir/models/d3d-drafter-qwen2.5-coder-0.5b \
        --modes ar sync --out $out/real_${side}_$round.json > $out/real_${side}_$round.log 2>&1)
    echo "real $side $round rc=$?"
  done
done
