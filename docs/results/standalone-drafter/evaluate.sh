#!/usr/bin/env bash
# Issue 51, 2026-12-05: evaluate the run of train.sh. Run from the repository root on an otherwise idle machine:
#   bash docs/results/standalone-drafter/evaluate.sh RUN_DIR INT8_DIR
# 1. re-save RUN_DIR's drafter with int8 matrices to INT8_DIR (what models/ ships);
# 2. the choice, on validation requests only (choose.py, its rule fixed before the run): validation_choice.json;
# 3. the figures, on evaluation prompts only, for both targets: τ of the drafter alone (the shipped one and the
#    new one) on 16 evaluation requests and 16 HumanEval chat prompts (eval_1.5b.json, eval_0.5b.json); then,
#    for the chosen drafter, side by side
#    with llama.cpp on the same GGUFs (6 HumanEval + 3 MT-Bench chat requests; llama.cpp AR, llama-lookup,
#    llama-speculative-simple with the 0.5B as draft model for the 1.5B; d3d ar, the drafter alone
#    (d3d-alone), the defaults): llamacpp_1.5b.json, llamacpp_0.5b.json. LLAMA_BIN: llama.cpp's bin directory.
set -euo pipefail
R=$1; S=$2; D=docs/results/standalone-drafter
LLAMA_BIN=${LLAMA_BIN:-$HOME/.cache/d3d-runs/llama/build/bin}
python -c "
import torch, d3d; from d3d.fetch import fetch
base = d3d.load_model(fetch('qwen2.5-coder-0.5b'), weights='float32')  # dense: its tables stay out of the file
d3d.save_drafter(d3d.load_drafter('$R', target=base), '$S', dtype=torch.bfloat16, int8=True)"
PYTHONPATH=. python $D/choose.py "$S" $D/validation_choice.json
CHOSEN=$(python -c "
import json; print('$S' if json.load(open('$D/validation_choice.json'))['chosen'] == 'new' else 'models/d3d-drafter-qwen2.5-coder-0.5b')")
echo "drafter: $CHOSEN"
for T in 1.5b 0.5b; do
  python -c "
from d3d.fetch import fetch; from d3d.files import write_json; from d3d.train.drafter import evaluate_drafter
t = str(fetch('qwen2.5-coder-$T'))
write_json('$D/eval_$T.json', {name: evaluate_drafter(t, d, chat=True)
                               for name, d in (('shipped', 'models/d3d-drafter-qwen2.5-coder-0.5b'), ('new', '$S'))})"
done
for T in 1.5b 0.5b; do
  python -m bench llamacpp --target qwen2.5-coder-$T --llama-bin "$LLAMA_BIN" --drafter "$CHOSEN" --n-code 6 \
    --n-prose 3 --out $D/llamacpp_$T.json
done
