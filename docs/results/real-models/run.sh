#!/usr/bin/env bash
# The real models side by side on one machine (issues 50, 51): d3d on Qwen2.5-Coder-1.5B and 0.5B
# against llama.cpp on the same GGUFs, and the drafter's τ alone beside the defaults', evaluation
# requests only. Run on an otherwise idle machine (2 cores: anything else running ruins the timings).
#   bash docs/results/real-models/run.sh LLAMA_BIN_DIR     (LLAMA_BIN_DIR: bash ../shared/llama_build.sh)
set -euo pipefail
BIN=${1:?llama.cpp bin directory (bash ../shared/llama_build.sh prints it)}
OUT=docs/results/real-models
T15=$(python -m d3d fetch qwen2.5-coder-1.5b)
T05=$(python -m d3d fetch qwen2.5-coder-0.5b)
D=models/d3d-drafter-qwen2.5-coder-0.5b
# llama.cpp AR, llama-lookup, llama-speculative-simple (the 0.5B as draft model), d3d ar, d3d defaults
[ -f $OUT/llamacpp_1.5b.json ] || python -m bench llamacpp --target qwen2.5-coder-1.5b --llama-bin "$BIN" --n-code 6 --n-prose 3 --out $OUT/llamacpp_1.5b.json
# τ of the drafter alone (no copied or retrieved drafts, every round drafts) beside the defaults'
# (chat requests: HumanEval and MT-Bench; raw text: heads of held-out library functions, the code set)
for T in "$T15" "$T05"; do
  name=$(basename "$T")
  python -m bench speculative --target "$T" --drafter $D --chat --sets humaneval mtbench --n 5 \
    --modes ar sync sync,lookup=0,verify_min_prob=0 --out $OUT/tau_chat_$name.json
  python -m bench speculative --target "$T" --drafter $D --sets code --n 5 \
    --modes ar sync sync,lookup=0,verify_min_prob=0 --out $OUT/tau_code_$name.json
done
