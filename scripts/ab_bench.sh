#!/usr/bin/env bash
# A/B inside one device run: run-to-run noise at batch 512 reaches 12% on one row (session 6), more
# than most kernel changes, so a change is only measured against its base in the same run.
#   git archive --prefix=base/ -o ab_base.tar <base commit>   # here; carry it with the tree
#   bash scripts/ab_bench.sh ab_base.tar bench/bench_mamba2.py --dims nano4b --batches 256 512 --no-stagger
# Builds the base tree (after this tree's in-place build of scripts/gpu_check.sh), then runs the named
# benchmark with its arguments on base, this tree, base, this tree; each table goes to stdout and to
# $OUT/ab_{base,new}_{1,2}.md, then the medians per row go to stdout and $OUT/ab_summary.md (scripts/ab_summary.py;
# a device call brings back at most 8 files). REPLAYSSM_AB_ROUNDS changes the number of pairs (default 2). The
# benchmark runs in each tree's root: name a script the base lacks by its absolute path.
# REPLAYSSM_AB_BUILD_ONLY=1 builds (or finds) the base and stops: start it in the background before
# scripts/gpu_check.sh, with a smaller MAX_JOBS, so the builds overlap, e.g. for two bases:
#   (MAX_JOBS=6 REPLAYSSM_AB_BUILD_ONLY=1 bash scripts/ab_bench.sh ab_a.tar; ... ab_b.tar) &
set -euo pipefail
cd "$(dirname "$0")/.."
tarball="$1"; shift
OUT="${OUT:-./results}"
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
here="$PWD"
# One build of a base per machine: later calls with the same tarball reuse it.
work="/tmp/ab_base_$(md5sum "$tarball" | cut -c1-12)"
base="$work/base"
if [[ ! -f "$work/built" ]]; then
  rm -rf "$work" && mkdir -p "$work"
  tar -xf "$tarball" -C "$work"
  if [[ -d .whl ]]; then cp -r .whl "$base/"; fi
  echo "== build base ($tarball)"
  (cd "$base" && python3 setup.py build_ext --inplace > "$OUT/ab_base_build.log" 2>&1) || {
    tail -30 "$OUT/ab_base_build.log"; exit 1; }
  touch "$work/built"
fi
echo "base tree: $base"
if [[ "${REPLAYSSM_AB_BUILD_ONLY:-0}" == 1 ]]; then exit 0; fi
for round in $(seq 1 "${REPLAYSSM_AB_ROUNDS:-2}"); do
  for side in base new; do
    root="$here"; [[ $side == base ]] && root="$base"
    echo "== $side, round $round"
    # Each run stops after REPLAYSSM_AB_TIMEOUT seconds (default 240), so that a hang leaves time for the rest.
    (cd "$root" && PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" timeout "${REPLAYSSM_AB_TIMEOUT:-240}" python3 "$@") 2>&1 |
      tee "$OUT/ab_${side}_${round}.md"
  done
done
echo "== medians of the rounds (also in $OUT/ab_summary.md)"
python3 "$here/scripts/ab_summary.py" "$OUT"
