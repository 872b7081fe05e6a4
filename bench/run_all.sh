#!/usr/bin/env bash
# Every benchmark, one after the other; tables go to stdout and to $OUT/bench_*.md when OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./results}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the in-place build of scripts/gpu_check.sh
python3 bench/bench_mamba2.py "$@" 2>&1 | tee "$OUT/bench_mamba2.md"
python3 bench/bench_mamba2_spec.py 2>&1 | tee "$OUT/bench_mamba2_spec.md"
