#!/usr/bin/env bash
# Every benchmark, one after the other; tables go to stdout and to $OUT/bench_*.md when OUT is set.
# REPLAYSSM_BENCHES="mamba2 mamba2_spec" (the default) picks which run: device minutes are scarce.
# Arguments go to every benchmark they name (both take --dims, --batches and --buffer-len).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./results}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the in-place build of scripts/gpu_check.sh
for name in ${REPLAYSSM_BENCHES:-mamba2 mamba2_spec}; do
  if [[ ! -f "bench/bench_$name.py" ]]; then
    echo "run_all.sh: no benchmark bench/bench_$name.py (REPLAYSSM_BENCHES=${REPLAYSSM_BENCHES:-mamba2 mamba2_spec})" >&2
    exit 2
  fi
  python3 "bench/bench_$name.py" "$@" 2>&1 | tee "$OUT/bench_$name.md"
done
