#!/usr/bin/env bash
# Issue 48, 2026-12-05: the session's start (0174fe3: quantized matrices as Linear's popped parameter, the
# spec's old path) against its end (QuantLinear modules swapped in, the spec resolved once), alternating,
# one forward pass of the real 0.5B (T = 1 and 8, 200 tokens of context) and of its drafter. Run from the
# repository root on an idle machine, each tree with its own kernel cache:
#   git worktree add /tmp/old 0174fe3 && bash docs/results/refactor/session22_ab.sh /tmp/old
OLD=${1:?the old tree}
for i in 1 2; do
  for side in old new; do
    dir=$PWD; [ $side = old ] && dir=$OLD
    (cd "$dir" && TORCH_EXTENSIONS_DIR=/tmp/ext_$side python -m bench passes --target "$(python -m d3d fetch qwen2.5-coder-0.5b)" \
      --weights auto --T 1 8 --context 200 --repeats 5 --out "$OLDPWD/docs/results/refactor/session22_passes_${side}_$i.json")
  done
done
