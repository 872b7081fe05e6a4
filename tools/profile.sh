#!/usr/bin/env bash
# Nsight Compute on one call of every compiled op (GPU machine, after the in-place build of
# tools/gpu_check.sh):
#   bash tools/profile.sh [table|memory|source] [tools/profile_ops.py options]
# The calls come from tools/profile_ops.py (its docstring lists them): nano4b's Mamba-2 layer, qwen4b's
# GDN layer and kimi's KDA layer at batch 256, the steps once replaying and once folding, the replay ops without a read copy
# and with an fp8 one, each op's second call. Its options pick others: --batch 64, --mamba2 super120b,
# --gdn qwen122b, --kda tiny, --copies none,bf16,fp8, --only 'gdn_(verify|commit)'. Every op opens an NVTX range
# named after it in the domain replayssm: ncu profiles only the kernels inside one (not the launcher's
# cursor fills) and the table takes each kernel's op from it. Clocks are not locked (--clock-control
# none: the rate a benchmark sees); caches are flushed before every launch (--cache-control all). Launch
# overrides pass through the environment (REPLAYSSM_STEP_HEADS_PER_CTA=4 bash tools/profile.sh).
# Writes to $OUT (default ./results).
#
# table (default): per kernel: op, call, kernel, grid and block, time, DRAM bytes read + written, DRAM %
#   of peak and GB/s, issue % (cycles in which a scheduler issued: near 100 the kernel is bound by its
#   instructions, not its bytes) and instructions per thread, achieved occupancy, registers per thread,
#   shared memory per CTA. Printed and
#   written to ncu_ops_table.txt, beside the report ncu_ops.ncu-rep (with the SpeedOfLight, Occupancy and
#   LaunchStats sections: `ncu -i results/ncu_ops.ncu-rep --page details`) and its two CSV exports.
# memory: the table, with the memory, scheduler and warp-state sections and the L2 request counters in
#   the report, their text in ncu_ops_details.txt: whether a kernel off the DRAM peak is held by its
#   request mix (sectors per request, L2 hit rate, bytes against the byte model) or by the SM side
#   (eligible warps, bank conflicts).
# source: the full section set with per-instruction source counters for the calls --only selects
#   (default: the Mamba-2 step replaying with an fp8 copy): ncu_step.ncu-rep, ncu_step_details.txt,
#   ncu_step_sass.csv (per SASS instruction: samples and stall reasons) with its summary
#   ncu_step_sass_top.txt (tools/ncu_sass_top.py), and ncu_step_cudasass.csv (per CUDA source line, the
#   build has -lineinfo: tools/ncu_source_lines.py). NCU_KERNEL=regex narrows it to matching kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-./results}"
mode=table
if [[ $# -gt 0 && $1 != -* ]]; then
  mode=$1
  shift
fi
mkdir -p "$OUT"

# profile LOG NCU_OPTIONS... -- LAUNCHER_OPTIONS...: ncu on tools/profile_ops.py, only the kernels inside a
# replayssm range; the log's last lines on failure.
profile() {
  local log=$1 rc=0
  shift
  local ncu_options=()
  while [[ $1 != -- ]]; do ncu_options+=("$1"); shift; done
  shift
  ncu --profile-from-start off --clock-control none --cache-control all --nvtx --nvtx-include "regex:replayssm@.+/" \
    "${ncu_options[@]}" python3 tools/profile_ops.py "$@" > "$log" 2>&1 || rc=$?
  if [[ $rc != 0 ]]; then
    tail -n 30 "$log"
    exit "$rc"
  fi
  grep "^profile_ops" "$log" || true
}

case "$mode" in
  table|memory)
    metrics=$(python3 -c "import sys; sys.path.insert(0, 'tools'); import profile_ops; print(','.join(profile_ops.METRICS))")
    sections=(SpeedOfLight Occupancy LaunchStats)
    if [[ $mode == memory ]]; then
      sections+=(MemoryWorkloadAnalysis MemoryWorkloadAnalysis_Tables SchedulerStats WarpStateStats)
      metrics+=,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum
      metrics+=,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_requests_srcunit_tex_op_write.sum
      metrics+=,lts__t_sector_hit_rate.pct,smsp__inst_executed_op_global_ld.sum,smsp__inst_executed_op_global_st.sum
    fi
    profile "$OUT/ncu_ops_log.txt" "${sections[@]/#/--section=}" --metrics "$metrics" -f -o "$OUT/ncu_ops" \
      -- --calls-out "$OUT/ncu_ops_calls.tsv" "$@"
    ncu -i "$OUT/ncu_ops.ncu-rep" --page raw --csv --print-units base > "$OUT/ncu_ops_raw.csv"
    # Each kernel's op: its innermost replayssm range, read from the report with ncu's ncu_report module
    # (profile_ops.py --report-ranges); where that module is missing, ncu's own renaming export.
    if ! python3 tools/profile_ops.py --report-ranges "$OUT/ncu_ops.ncu-rep" > "$OUT/ncu_ops_nvtx.csv"; then
      echo "profile.sh: no ncu_report module: the op names from ncu --print-nvtx-rename kernel" >&2
      ncu -i "$OUT/ncu_ops.ncu-rep" --page raw --csv --print-units base --print-nvtx-rename kernel \
        > "$OUT/ncu_ops_nvtx.csv"
    fi
    if [[ $mode == memory ]]; then
      ncu -i "$OUT/ncu_ops.ncu-rep" --page details > "$OUT/ncu_ops_details.txt"
    fi
    python3 tools/profile_ops.py --table "$OUT/ncu_ops_raw.csv" "$OUT/ncu_ops_nvtx.csv" \
      --calls "$OUT/ncu_ops_calls.tsv" | tee "$OUT/ncu_ops_table.txt"
    ;;
  source)
    [[ $# -gt 0 ]] || set -- --only "mamba2_step replay.*fp8"
    profile "$OUT/ncu_step_log.txt" --set full --import-source no ${NCU_KERNEL:+-k "regex:$NCU_KERNEL"} \
      -f -o "$OUT/ncu_step" -- "$@"
    ncu -i "$OUT/ncu_step.ncu-rep" --page details > "$OUT/ncu_step_details.txt"
    ncu -i "$OUT/ncu_step.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_step_sass.csv"
    python3 tools/ncu_sass_top.py "$OUT/ncu_step_sass.csv" > "$OUT/ncu_step_sass_top.txt"
    ncu -i "$OUT/ncu_step.ncu-rep" --page source --csv --print-source cuda,sass > "$OUT/ncu_step_cudasass.csv"
    ;;
  *)
    echo "usage: bash tools/profile.sh [table|memory|source] [tools/profile_ops.py options] (see the comment at the top)" >&2
    exit 2
    ;;
esac
