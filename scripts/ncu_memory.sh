#!/usr/bin/env bash
# Nsight Compute's memory, occupancy and scheduler sections for four kernels of scripts/profile_mamba2.py
# (GPU machine, after the in-place build): the fp8 replay step (step launch 2), the no-copy replay step
# (0), the fp8-copy fold step (5) and the conventional update, one launch each, nano4b batch 256 unless
# REPLAYSSM_PROFILE_DIMS / REPLAYSSM_PROFILE_BATCH say otherwise. Writes $OUT/ncu_<kernel>.txt and prints
# the DRAM lines. Session 37 used it to ask whether the fp8 step's DRAM rate (68% of peak against the
# update's 84%) comes from its request mix (L2 sectors per request, hit rate, bytes read against the
# byte model) or from the SM side (eligible warps, bank conflicts): bench/results/h200_2026-12-04_mamba2_session37.md.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-./results}"
mkdir -p "$OUT"
metrics=dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum
metrics+=,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_requests_srcunit_tex_op_write.sum
metrics+=,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sector_hit_rate.pct,dram__sectors_read.sum
metrics+=,smsp__inst_executed_op_global_ld.sum,smsp__inst_executed_op_global_st.sum,l1tex__m_xbar2l1tex_read_bytes.sum
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum
sections=()
for s in SpeedOfLight MemoryWorkloadAnalysis MemoryWorkloadAnalysis_Tables Occupancy LaunchStats SchedulerStats WarpStateStats; do
  sections+=(--section "$s")
done
for kind in step_fp8:step_kernel:2 step_nocopy:step_kernel:0 fold_fp8:step_kernel:5 update:update:0; do
  IFS=: read -r name regex skip <<< "$kind"
  timeout 150 ncu --profile-from-start off --clock-control none "${sections[@]}" --metrics "$metrics" \
    -k "regex:$regex" --launch-skip "$skip" --launch-count 1 python3 scripts/profile_mamba2.py > "$OUT/ncu_$name.txt" 2>&1
  echo "$name: rc $?"
  grep -E "DRAM Throughput|Duration|dram__bytes_read.sum |L2 Hit Rate" "$OUT/ncu_$name.txt" | head -4
done
