#!/usr/bin/env bash
# Nsight Compute on one kernel family (GPU machine, after the in-place build of scripts/gpu_check.sh).
# By default the replay step: scripts/profile_mamba2.py launches one conventional update, three
# non-fold steps (no copy, bf16 copy, fp8 copy) and three fold steps (no copy, bf16 copy, fp8 copy);
# nano4b, batch 256. Profiles the launches of kernels matching NCU_KERNEL (default step_kernel) picked by
# NCU_SKIP / NCU_COUNT (default: the bf16 and the fp8 step; 3-5 are the folds), full set with
# per-instruction source counters. NCU_SCRIPT picks another launcher, e.g. verify on super120b:
#   NCU_SCRIPT=scripts/profile_mamba2_spec.py NCU_KERNEL=verify_kernel NCU_SKIP=0 NCU_COUNT=1 bash scripts/ncu_step.sh
# Writes the report plus its text pages to $OUT: ncu_step_details.txt (sections), ncu_step_sass.csv
# (per-SASS-instruction samples and stall reasons, for finding the instructions a warp waits on) and
# its summary ncu_step_sass_top.txt (scripts/ncu_sass_top.py: the most-sampled instructions per launch), and
# ncu_step_cudasass.csv (the same per CUDA source line: scripts/ncu_source_lines.py, --by samples for the waits).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-./results}"
mkdir -p "$OUT"
ncu --profile-from-start off --clock-control none --set full --import-source no \
  -k "regex:${NCU_KERNEL:-step_kernel}" --launch-skip "${NCU_SKIP:-1}" --launch-count "${NCU_COUNT:-2}" \
  -f -o "$OUT/ncu_step" python3 "${NCU_SCRIPT:-scripts/profile_mamba2.py}" > "$OUT/ncu_step_log.txt" 2>&1
ncu -i "$OUT/ncu_step.ncu-rep" --page details > "$OUT/ncu_step_details.txt"
ncu -i "$OUT/ncu_step.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_step_sass.csv"
python3 scripts/ncu_sass_top.py "$OUT/ncu_step_sass.csv" > "$OUT/ncu_step_sass_top.txt"
# CUDA lines with their SASS (the build has -lineinfo): scripts/ncu_source_lines.py sums it per line.
ncu -i "$OUT/ncu_step.ncu-rep" --page source --csv --print-source cuda,sass > "$OUT/ncu_step_cudasass.csv"
