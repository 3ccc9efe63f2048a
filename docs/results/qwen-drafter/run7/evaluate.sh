#!/usr/bin/env bash
# Issue 16, 2026-12-02 (eighth session): evaluate run7's drafter. Run from the repository root:
#   bash docs/results/qwen-drafter/run7/evaluate.sh TARGET_DIR RUN_DIR INT8_DIR
# (DIR=docs/results/qwen-drafter/run8 ...: the same evaluation of a later run, its JSONs written to DIR)
# 1. re-save RUN_DIR's drafter with int8 matrices to INT8_DIR (what models/ ships);
# 2. the choice, on validation requests only (choose.py): the new drafter replaces the shipped one when its
#    mean τ over the 16 code and the 16 explain validation requests is higher (validation_choice.json);
# 3. the figures, on evaluation prompts only, for the chosen drafter: τ on 16 evaluation requests and 16 HumanEval
#    chat prompts (eval.json), then speed on 16 HumanEval and 8 MT-Bench chat prompts, ar / the drafter alone
#    (sync,lookup=0) / the sync defaults (copied drafts, 2 bonus leaves), one run per set.
set -euo pipefail
T=$1; R=$2; S=$3; D=${DIR:-docs/results/qwen-drafter/run7}
python -c "
import sys, torch, d3d
t = d3d.load_model('$T', dtype='float32')
d3d.save_drafter(d3d.load_drafter('$R', target=t), '$S', dtype=torch.bfloat16, int8=True)"
PYTHONPATH=. python docs/results/qwen-drafter/run7/choose.py "$T" "$S" $D/validation_choice.json
CHOSEN=$(python -c "
import json; c = json.load(open('$D/validation_choice.json'))
mean = {k: (c[k]['code']['tau'] + c[k]['explain']['tau']) / 2 for k in ('shipped', 'new')}
print('$S' if mean['new'] > mean['shipped'] else 'models/d3d-drafter-qwen2.5-coder-0.5b')")
echo "drafter: $CHOSEN"
python -c "
from d3d.files import write_json; from d3d.train.drafter import evaluate_drafter
write_json('$D/eval.json', evaluate_drafter('$T', '$CHOSEN', chat=True))"
python -m bench speculative --target "$T" --drafter "$CHOSEN" --chat --sets humaneval --n 16 --new-tokens 128 \
  --modes ar sync,lookup=0 sync --out $D/speculative_humaneval.json
python -m bench speculative --target "$T" --drafter "$CHOSEN" --chat --sets mtbench --n 8 --new-tokens 128 \
  --modes ar sync,lookup=0 sync --out $D/speculative_mtbench.json
