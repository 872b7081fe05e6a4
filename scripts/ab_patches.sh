#!/usr/bin/env bash
# Several experiment patches against one base in one device call: each patch gets its own tree (the base
# plus that patch), all trees build at once, optional tests run in each, then the benchmark runs in every
# tree in turn, round after round, and a median table per patch against the base goes to stdout.
#   git archive --prefix=base/ -o ab_base.tar HEAD            # here; carry it with the tree
#   bash scripts/ab_patches.sh ab_base.tar docs/experiments/a.patch docs/experiments/b.patch -- \
#        bench/bench_mamba2.py --dims nano4b --batches 64 256 512 --no-stagger
# Why: a device session has 30 minutes, a build takes 1.5-3 of them, and the replay step's speed moves
# with code changes elsewhere in its kernel (session 35), so every candidate is measured against the same
# base in the same call, not one call per patch (scripts/ab_bench.sh: one base against the in-place tree).
# Knobs: REPLAYSSM_AB_ROUNDS (default 3; 0 builds and tests only), REPLAYSSM_AB_TESTS (pytest arguments
# run in every patched tree before the benchmark, read as shell words: e.g. "tests/gpu -x -q" or
# 'tests/gpu -q -k "fold or copy"'; default none), REPLAYSSM_AB_TIMEOUT (per benchmark run, 240 s),
# REPLAYSSM_AB_BUILD (the build command, default `python3 setup.py build_ext --inplace`), MAX_JOBS (all
# builds together; default 16: with REPLAYSSM_CUDA_ARCHS=90a one tree alone builds in ~85 s on the
# H200 machine's 16 cores, so budget ~85 s per tree). A later call with the same tarball and patches
# reuses the trees and builds (a device call is at most 10 minutes: build and test in one, measure in
# the next). Per-round tables go to $AB_DIR (default /tmp/ab_patches; a device call brings back at most 8
# files from $OUT), the summary per patch to $AB_DIR and, when set, $OUT; variant k is v1, v2, ... in order.
set -euo pipefail
cd "$(dirname "$0")/.."
here="$PWD"
tarball="$1"; shift
patches=()
while [[ $# -gt 0 && "$1" != "--" ]]; do patches+=("$(realpath "$1")"); shift; done
[[ "${1:-}" == "--" ]] || { echo "usage: ab_patches.sh BASE.tar PATCH... -- BENCH_SCRIPT [ARGS]" >&2; exit 2; }
shift
[[ ${#patches[@]} -gt 0 && $# -gt 0 ]] || { echo "usage: ab_patches.sh BASE.tar PATCH... -- BENCH_SCRIPT [ARGS]" >&2; exit 2; }
export PYTHONUNBUFFERED=1
AB_DIR="${AB_DIR:-/tmp/ab_patches}"
work="$AB_DIR/trees"
sides=(base)
for k in "${!patches[@]}"; do sides+=("v$((k + 1))"); done
# The trees and their builds are kept for a later call with the same base and patches (a warm machine
# keeps /tmp): builds in one device call, tests or more rounds in the next.
key="$(cat "$(realpath "$tarball")" "${patches[@]}" | md5sum | cut -c1-16)"
if [[ -f "$AB_DIR/built" && "$(cat "$AB_DIR/key" 2>/dev/null)" == "$key" ]]; then
  echo "== trees of an earlier call: $work"
  for k in "${!patches[@]}"; do echo "v$((k + 1)) = ${patches[$k]#"$here"/}"; done
else
  rm -rf "$AB_DIR" && mkdir -p "$work"
  echo "$key" > "$AB_DIR/key"
  tar -xf "$(realpath "$tarball")" -C "$work"   # -> $work/base
  for k in "${!patches[@]}"; do
    side="v$((k + 1))"
    cp -r "$work/base" "$work/$side"
    # git apply skips a patch's leading description; outside a repository it patches the plain files.
    (cd "$work/$side" && git apply "${patches[$k]}") || { echo "$side: ${patches[$k]} does not apply" >&2; exit 1; }
    echo "$side = ${patches[$k]#"$here"/}"
  done
  jobs_each=$(( ${MAX_JOBS:-16} / ${#sides[@]} )); (( jobs_each >= 1 )) || jobs_each=1
  build="${REPLAYSSM_AB_BUILD:-python3 setup.py build_ext --inplace}"
  start=$(date +%s)
  pids=()
  for side in "${sides[@]}"; do
    (cd "$work/$side" && MAX_JOBS=$jobs_each bash -c "$build" > "$AB_DIR/build_$side.log" 2>&1) &
    pids+=($!)
  done
  failed=0
  for k in "${!pids[@]}"; do
    if ! wait "${pids[$k]}"; then echo "== build of ${sides[$k]} failed:"; tail -30 "$AB_DIR/build_${sides[$k]}.log"; failed=1; fi
  done
  (( failed == 0 )) || exit 1
  touch "$AB_DIR/built"
  echo "== builds: $(( $(date +%s) - start )) s"
fi
rm -f "$AB_DIR"/ab_*.md
if [[ -n "${REPLAYSSM_AB_TESTS:-}" ]]; then
  for side in "${sides[@]:1}"; do  # the patched trees (the base is main, tested)
    echo "== tests, $side"
    # The knob is read as shell words (bash -c), so a quoted expression such as -k "fold or copy" stays one
    # argument (plain word splitting would make three of it).
    (cd "$work/$side" && PYTHONPATH="$work/$side${PYTHONPATH:+:$PYTHONPATH}" bash -c "python3 -m pytest $REPLAYSSM_AB_TESTS" 2>&1 | tail -3) || true
  done
fi
for round in $(seq 1 "${REPLAYSSM_AB_ROUNDS:-3}"); do
  for side in "${sides[@]}"; do
    echo "== $side, round $round"
    (cd "$work/$side" && PYTHONPATH="$work/$side${PYTHONPATH:+:$PYTHONPATH}" \
       timeout "${REPLAYSSM_AB_TIMEOUT:-240}" python3 "$@") > "$AB_DIR/ab_${side}_${round}.md" 2>&1 ||
      { echo "$side round $round failed:"; tail -5 "$AB_DIR/ab_${side}_${round}.md"; }
  done
done
(( ${REPLAYSSM_AB_ROUNDS:-3} > 0 )) || exit 0
# The call's output keeps only its last 12,000 characters (session 36 lost the first patch's table that
# way), so each summary is also copied to $OUT, which comes back as files (one per patch, under 8).
for side in "${sides[@]:1}"; do
  echo "== medians of the rounds, $side against base"
  python3 "$here/scripts/ab_summary.py" "$AB_DIR" "$side" base
  [[ -z "${OUT:-}" ]] || cp "$AB_DIR/ab_summary_$side.md" "$OUT/"
done
