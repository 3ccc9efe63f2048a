#!/usr/bin/env bash
# Issue 16: evaluate a freshly trained Qwen2.5-Coder-0.5B drafter (run from the repository root).
#   bash docs/results/qwen-drafter/evaluate.sh TARGET_DIR RUN_DIR INT8_DIR
# 1. re-save RUN_DIR's drafter with int8 matrices to INT8_DIR (what models/ ships);
# 2. the choice: τ of the shipped drafter and of the new one on 8 *validation* requests (fp32);
# 3. the figures: τ on 16 evaluation requests + 16 HumanEval chat prompts (evaluate_drafter), then
#    the speed bench on 8 HumanEval + 8 MT-Bench chat prompts, all modes in one run.
set -euo pipefail
T=$1; R=$2; S=$3; D=docs/results/qwen-drafter
mkdir -p "$D"
python - "$T" "$R" "$S" "$D" <<'PY'
import json, sys, torch, d3d
from d3d.files import write_json
from d3d.train.chat_data import chat_prompts
from d3d.train.drafter import evaluate_drafter, measure_tau
T, R, S, D = sys.argv[1:]
t = d3d.load_model(T, dtype="float32")
d3d.save_drafter(d3d.load_drafter(R, target=t), S, dtype=torch.bfloat16, int8=True)
tok = d3d.load_tokenizer(T)
val = chat_prompts(tok, None, 0.05, 8, "validation", seed=1234, templates=1)
choice = {}
for name, path in (("shipped", "models/d3d-drafter-qwen2.5-coder-0.5b"), ("new", S)):
    choice[name] = measure_tau(t, d3d.load_drafter(path, target=t), val, 64, 16, stop_ids=tok.stop_token_ids())
    print(f"{name}: validation τ {choice[name]['tau']:.3f}", flush=True)
write_json(f"{D}/validation_choice.json", {"prompts": "8 validation chat requests, 64 new tokens, fp32", **choice})
del t
write_json(f"{D}/eval.json", evaluate_drafter(T, S, chat=True))
PY
python -m bench speculative --target "$T" --drafter "$S" --chat --sets humaneval mtbench --n 8 --new-tokens 128 \
  --modes ar sync async --out "$D/speculative.json"
