#!/usr/bin/env bash
# The replay step's heads per CTA, swept with REPLAYSSM_STEP_HEADS_PER_CTA on one build (session 21,
# runs 4, 5 and 7: how the launcher's choice was checked and the one-wave rule found). Each value and
# dims set runs in its own process, values alternating within a round; "auto" leaves the knob unset (the
# launcher's choice). The knob takes the largest divisor of the group's heads <= the value.
#   bash scripts/heads_per_cta_sweep.sh "auto 16 8" "8 16 32" [rounds]
# Tables go to $OUT/<dims>/k<value>_<round>.md (OUT defaults to ./results); the extension must be built
# in place first (scripts/gpu_check.sh or `python3 setup.py build_ext --inplace`). SWEEP_BENCH_ARGS
# replaces the benchmark's extra arguments (default `--no-stagger`; an empty value keeps the staggered
# cycles, which run under the op's staggered-flush hint: session 23).
set -euo pipefail
cd "$(dirname "$0")/.."
values="$1"; batches="$2"; rounds="${3:-2}"
bench_args="${SWEEP_BENCH_ARGS---no-stagger}"
OUT="${OUT:-./results}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for round in $(seq 1 "$rounds"); do
  for k in $values; do
    for dims in nano4b super120b; do
      mkdir -p "$OUT/$dims"
      if [[ $k == auto ]]; then unset REPLAYSSM_STEP_HEADS_PER_CTA; else export REPLAYSSM_STEP_HEADS_PER_CTA=$k; fi
      # shellcheck disable=SC2086
      timeout 120 python3 bench/bench_mamba2.py --dims "$dims" --batches $batches $bench_args > "$OUT/$dims/k${k}_$round.md" 2>&1 ||
        echo "k=$k $dims round $round failed: see $OUT/$dims/k${k}_$round.md"
    done
  done
done
echo "tables in $OUT/<dims>/"
