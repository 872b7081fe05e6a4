#!/usr/bin/env bash
# One launcher knob A/B'd on one build: the benchmark once per value of an environment variable, values
# alternating within each round, each run in its own process ("unset" leaves the variable out: the
# launcher's default). E.g. the one-wave heads-per-CTA rule against whole-group CTAs:
#   bash scripts/knob_ab.sh REPLAYSSM_STEP_HEADS_PER_CTA "unset 64" 2 bench/bench_mamba2.py --dims nano4b \
#       --batches 64 128 --no-stagger
# Tables go to $OUT/<var>_<value>_<round>.md (OUT defaults to ./results; no '=' in the names, which the
# device tool does not bring back); the extension must be built in place first (scripts/gpu_check.sh or
# `python3 setup.py build_ext --inplace`).
set -euo pipefail
cd "$(dirname "$0")/.."
var="$1"; values="$2"; rounds="$3"; shift 3
OUT="${OUT:-./results}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for round in $(seq 1 "$rounds"); do
  for v in $values; do
    if [[ $v == unset ]]; then unset "$var"; else export "$var=$v"; fi
    log="$OUT/${var}_${v}_${round}.md"
    timeout "${KNOB_AB_TIMEOUT:-300}" python3 "$@" > "$log" 2>&1 || echo "$var=$v round $round failed: see $log"
  done
done
unset "$var"
echo "tables in $OUT/"
