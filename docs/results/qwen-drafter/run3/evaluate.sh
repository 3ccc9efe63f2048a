#!/usr/bin/env bash
# Issue 16, third run (2026-12-01): evaluate a Qwen2.5-Coder-0.5B drafter and choose --verify-min-prob.
# Run from the repository root:
#   bash docs/results/qwen-drafter/run3/evaluate.sh TARGET_DIR RUN_DIR INT8_DIR [OUT_DIR]
# OUT_DIR (default this directory) receives the JSON files; VAL_PROMPTS=N (default 8, as in the third run)
# sets the number of validation requests of step 2.
# 1. re-save RUN_DIR's drafter with int8 matrices to INT8_DIR (what models/ ships);
# 2. choice of drafter: τ of the shipped drafter and the new one on VAL_PROMPTS *validation* requests (fp32, 64 tokens);
# 3. choice of P (verify only drafts believed in with probability >= P): sync speed on 8 validation
#    requests for P in 0 / 0.02 / 0.05 / 0.1 / 0.2, the fastest kept (validation_verify.json);
# 4. the figures, on evaluation prompts only: τ (eval.json), then speed on 8 HumanEval + 8 MT-Bench
#    chat prompts, ar / sync / async with and without the chosen P, one run (speculative.json).
set -euo pipefail
T=$1; R=$2; S=$3; D=${4:-docs/results/qwen-drafter/run3}; N_VAL=${VAL_PROMPTS:-8}
SHIPPED=models/d3d-drafter-qwen2.5-coder-0.5b
mkdir -p "$D"
python - "$T" "$R" "$S" "$D" "$SHIPPED" "$N_VAL" <<'PY'
import sys, torch, d3d
from d3d.files import write_json
from d3d.train.chat_data import chat_prompts
from d3d.train.drafter import measure_tau
T, R, S, D, SHIPPED, N_VAL = sys.argv[1:]; N_VAL = int(N_VAL)
t = d3d.load_model(T, dtype="float32")
d3d.save_drafter(d3d.load_drafter(R, target=t), S, dtype=torch.bfloat16, int8=True)
tok = d3d.load_tokenizer(T)
val = chat_prompts(tok, None, 0.05, N_VAL, "validation", seed=1234, templates=1)
choice = {}
for name, path in (("shipped", SHIPPED), ("new", S)):
    choice[name] = measure_tau(t, d3d.load_drafter(path, target=t), val, 64, 16, stop_ids=tok.stop_token_ids())
    print(f"{name}: validation τ {choice[name]['tau']:.3f}", flush=True)
choice["chosen"] = "new" if choice["new"]["tau"] > choice["shipped"]["tau"] else "shipped"
write_json(f"{D}/validation_choice.json", {"prompts": f"{N_VAL} validation chat requests, 64 new tokens, fp32", **choice})
PY
CHOSEN=$(python -c "import json; c = json.load(open('$D/validation_choice.json'))['chosen']; print('$S' if c == 'new' else '$SHIPPED')")
echo "drafter: $CHOSEN"
python -m bench speculative --target "$T" --drafter "$CHOSEN" --chat --validation --sets code --n 8 --new-tokens 128 \
  --modes ar sync,verify_min_prob=0 sync,verify_min_prob=0.02 sync,verify_min_prob=0.05 \
  sync,verify_min_prob=0.1 sync,verify_min_prob=0.2 --out "$D/validation_verify.json"
P=$(python -c "
import json; r = json.load(open('$D/validation_verify.json'))['results']['code']
best = max((m for m in r if m.startswith('sync')), key=lambda m: r[m]['tok_s'])
print(best.rpartition('=')[2])")
echo "chosen verify_min_prob: $P"
python -c "
import sys; from d3d.files import write_json; from d3d.train.drafter import evaluate_drafter
write_json('$D/eval.json', evaluate_drafter('$T', '$CHOSEN', chat=True))"
python -m bench speculative --target "$T" --drafter "$CHOSEN" --chat --sets humaneval mtbench --n 8 --new-tokens 128 \
  --modes ar sync,verify_min_prob=0 "sync,verify_min_prob=${P:-0}" async,verify_min_prob=0 \
  "async,verify_min_prob=${P:-0}" --out "$D/speculative.json"
