#!/usr/bin/env bash
# The command of a GPU call (python -m bench travel --prepare prints the call): bench gpu's whole plan, its results
# packed into $OUT/gpu.tgz (a call returns at most 8 files; bench gpu writes ~18). The wheels the GPU image lacks
# travel in .whl (carried). Exits with bench gpu's status; the archive is written either way.
set -u
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
dir=${GPU_RESULTS:-docs/results/gpu}  # where bench gpu writes (tests: elsewhere)
python3 -m bench gpu --out "$dir" "$@"
rc=$?
tar -czf "${OUT:-.}/gpu.tgz" "$dir"
exit $rc
