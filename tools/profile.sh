#!/usr/bin/env bash
# Nsight Compute on the Mamba-2 kernels (GPU machine, after the in-place build of tools/gpu_check.sh):
#   bash tools/profile.sh [source|memory|dram]
# The launches come from tools/profile_mamba2.py: one conventional update, the replay steps at w = 8 of
# L = 16 without a read copy, with a bf16 and with an fp8 copy (step launches 0-2), then the fold steps in
# the same order (3-5); nano4b at batch 256 (REPLAYSSM_PROFILE_DIMS=super120b, REPLAYSSM_PROFILE_BATCH pick
# others). NCU_SCRIPT names another launcher for source and dram, e.g. verify and commit:
#   NCU_SCRIPT=tools/profile_mamba2_spec.py NCU_KERNEL=verify_kernel NCU_SKIP=0 NCU_COUNT=1 bash tools/profile.sh
# Launch overrides pass through the environment (REPLAYSSM_STEP_HEADS_PER_CTA=4 bash tools/profile.sh dram).
# Clocks are not locked (--clock-control none: the rate a benchmark sees); caches are flushed per launch.
#
# source (default): the full section set with per-instruction source counters for the launches of the
#   kernels matching NCU_KERNEL (default step_kernel) picked by NCU_SKIP / NCU_COUNT (default 1 / 2: the
#   bf16- and fp8-copy replay steps). Writes to $OUT (default ./results): ncu_step.ncu-rep,
#   ncu_step_details.txt (sections), ncu_step_sass.csv (per SASS instruction: samples and stall reasons)
#   with its summary ncu_step_sass_top.txt (tools/ncu_sass_top.py), and ncu_step_cudasass.csv (per CUDA
#   source line, the build has -lineinfo: tools/ncu_source_lines.py).
# memory: the memory, occupancy and scheduler sections of four launches, one each: the fp8-copy replay
#   step, the no-copy replay step, the fp8-copy fold step and the update; whether a kernel off the DRAM
#   peak is held by its request mix (sectors per request, L2 hit rate, bytes against the byte model) or by
#   the SM side (eligible warps, bank conflicts). Writes $OUT/ncu_<name>.txt and prints the DRAM lines.
# dram: for every launch of the kernels matching NCU_KERNEL (default step_kernel|update_kernel): time, DRAM
#   bytes read and written, DRAM % of peak, L2 bytes, active warps and issue rate, to set against the
#   benchmark's byte model (which counts what a kernel must move, not what it does).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-./results}"
script="${NCU_SCRIPT:-tools/profile_mamba2.py}"
mode="${1:-source}"

case "$mode" in
  source)
    mkdir -p "$OUT"
    ncu --profile-from-start off --clock-control none --set full --import-source no \
      -k "regex:${NCU_KERNEL:-step_kernel}" --launch-skip "${NCU_SKIP:-1}" --launch-count "${NCU_COUNT:-2}" \
      -f -o "$OUT/ncu_step" python3 "$script" > "$OUT/ncu_step_log.txt" 2>&1
    ncu -i "$OUT/ncu_step.ncu-rep" --page details > "$OUT/ncu_step_details.txt"
    ncu -i "$OUT/ncu_step.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_step_sass.csv"
    python3 tools/ncu_sass_top.py "$OUT/ncu_step_sass.csv" > "$OUT/ncu_step_sass_top.txt"
    ncu -i "$OUT/ncu_step.ncu-rep" --page source --csv --print-source cuda,sass > "$OUT/ncu_step_cudasass.csv"
    ;;
  memory)
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
    status=0
    for kind in step_fp8:step_kernel:2 step_nocopy:step_kernel:0 fold_fp8:step_kernel:5 update:update:0; do
      IFS=: read -r name regex skip <<< "$kind"
      rc=0
      timeout 150 ncu --profile-from-start off --clock-control none "${sections[@]}" --metrics "$metrics" \
        -k "regex:$regex" --launch-skip "$skip" --launch-count 1 python3 tools/profile_mamba2.py \
        > "$OUT/ncu_$name.txt" 2>&1 || rc=$?
      echo "$name: rc $rc"
      [[ $rc == 0 ]] || status=$rc
      grep -E "DRAM Throughput|Duration|dram__bytes_read.sum |L2 Hit Rate" "$OUT/ncu_$name.txt" | head -4 || true
    done
    exit "$status"
    ;;
  dram)
    metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
    metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active
    metrics+=,sm__inst_executed.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum
    ncu --profile-from-start off --clock-control none -k "regex:${NCU_KERNEL:-step_kernel|update_kernel}" \
      --metrics "$metrics" python3 "$script" 2>&1 |
      grep -E "^  [a-zA-Z].*\(|gpu__time|dram__|lts__|warps_active|inst_executed|issue_active"
    ;;
  *)
    echo "usage: bash tools/profile.sh [source|memory|dram] (see the comment at the top)" >&2
    exit 2
    ;;
esac
