#!/usr/bin/env bash
# The bundled pair's recipe (issue 19) end to end, resumable: every stage continues a partial run
# and is skipped once complete, so the script can be re-run, one chunk of at most MINUTES of
# training per run, across sessions and machines.
#
#   bash bench/bundled_pair.sh [RUNS_DIR] [MINUTES]      (defaults: ~/.cache/d3d-runs, 120)
#
# Stages (one long CPU job at a time, in this order):
#   1 target   models/target-16m when committed, else trained in RUNS_DIR/target-16m
#   2 d3d      the D3D drafter on the target's own continuations   (RUNS_DIR/d3d-drafter-16m)
#   3 dflash   the DFlash baseline on the same data, same budget    (RUNS_DIR/dflash-drafter-16m)
#   4 eval     τ and speed of both, every mode, every prompt set     (RUNS_DIR/pair-speculative.json,
#              and τ in fp32: pair-drafters-fp32.json; docs/results/bundled-pair/ has the committed run)
#   5 prune    the pruning study on validation prompts               (RUNS_DIR/d3d-drafter-16m-pruned)
# A stage that stops at its time limit saves its state and ends the script: run it again.
# Drafter settings can be overridden: D3D_ARGS="--num-layers 4 ...", DFLASH_ARGS="...".
set -euo pipefail
runs=${1:-$HOME/.cache/d3d-runs}
minutes=${2:-120}
mkdir -p "$runs"

complete() {  # a run directory whose train_summary.json says every scheduled step is done
  python - "$1" <<'EOF'
import json, pathlib, sys
p = pathlib.Path(sys.argv[1]) / "train_summary.json"
s = json.loads(p.read_text()) if p.is_file() else {}
sys.exit(0 if s and s.get("steps_done", 0) >= s["config"]["steps"] else 1)
EOF
}
resume() { if [ -f "$1/training_state.pt" ]; then echo --resume; fi; }
chunk_ended() { echo "$1: this chunk ended before the last step (state saved); run the script again"; exit 0; }

target=models/target-16m
if [ ! -f "$target/config.json" ]; then  # the committed target (one file or shards), else trained here
  target=$runs/target-16m
  if ! complete "$target"; then
    python -m d3d train-target --out "$target" --corpus python-sources --hidden-size 384 --num-layers 8 \
      --num-heads 6 --num-kv-heads 2 --head-dim 64 --intermediate-size 1024 --seq-len 256 --batch-size 16 \
      --steps 3700 --warmup 200 --lr 1.5e-3 --eval-every 400 --save-every 200 --log-every 50 \
      --stop-after-minutes "$minutes" $(resume "$target")
    complete "$target" || chunk_ended target
  fi
fi
echo "target: $target"

# the same data (8,192 continuations: the cache key includes the count) and budget for both drafters
data="--n-sequences 8192"
budget="--steps 6000 --batch-size 8 --lr 2e-3 --warmup 100 --eval-every 500 --save-every 100 --log-every 25"
d3d=$runs/d3d-drafter-16m
if ! complete "$d3d"; then
  # shellcheck disable=SC2086
  python -m d3d train-drafter --target "$target" --out "$d3d" ${D3D_ARGS:---num-layers 4} \
    $data $budget --stop-after-minutes "$minutes" $(resume "$d3d")
  complete "$d3d" || chunk_ended d3d
fi

dflash=$runs/dflash-drafter-16m
if ! complete "$dflash"; then
  # shellcheck disable=SC2086
  python -m d3d train-dflash --target "$target" --out "$dflash" --data-dir "$d3d/data" \
    ${DFLASH_ARGS:---num-layers 4} $data $budget --stop-after-minutes "$minutes" $(resume "$dflash")
  complete "$dflash" || chunk_ended dflash
fi

if [ ! -f "$runs/pair-speculative.json" ]; then  # the README's modes, 16 prompts per set
  python -m bench speculative --target "$target" --drafter "$d3d" --dflash "$dflash" --n 16 \
    --modes ar ar-fp32 sync sync+exact async async:none@0/4x1 async:none@0/8x3 async:thread@0/4x1 \
    async:packed@0/4x1 dflash --out "$runs/pair-speculative.json" --plots "$runs/pair-plots"
fi
if [ ! -f "$runs/pair-drafters-fp32.json" ]; then  # D3D vs DFlash τ at equal budget, fp32
  python -m bench speculative --target "$target" --drafter "$d3d" --dflash "$dflash" --n 16 --dtype float32 \
    --modes ar sync dflash --out "$runs/pair-drafters-fp32.json"
fi

if [ ! -f "$runs/d3d-drafter-16m-pruned/prune_report.json" ]; then
  python -m d3d prune --target "$target" --drafter "$d3d" --greedy 1 --out "$runs/d3d-drafter-16m-pruned"
fi
echo "done: $d3d, $dflash, $runs/pair-speculative.json, $runs/d3d-drafter-16m-pruned"
