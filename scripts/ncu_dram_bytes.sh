#!/usr/bin/env bash
# What each launch of scripts/profile_mamba2.py really moves (GPU machine, after the in-place build):
# DRAM bytes read and written, time, DRAM throughput, L2 bytes and active warps of the conventional
# update and the six replay / fold steps (nano4b, batch 256 by default; the script's environment picks
# others), from Nsight Compute's counters, to set against the benchmark's byte model (which counts what
# a kernel must move, not what it does). The launcher's knobs pass through the environment, e.g.
#   REPLAYSSM_STEP_HEADS_PER_CTA=4 bash scripts/ncu_dram_bytes.sh
# Session 32: the fp8-copy step at nano4b batch 256 read 312 MB (its model: ~306 MB) in 103 us, 64% of
# DRAM peak: not bound by DRAM.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,lts__t_bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active
# Issue: executed IPC per SM and the issue slots' busy fraction (ncu's Compute Workload Analysis
# metrics; added after session 32's run): whether a kernel off the DRAM peak is instruction-bound.
metrics+=,sm__inst_executed.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum
ncu --profile-from-start off --clock-control none -k "regex:${NCU_KERNEL:-step_kernel|update_kernel}" --metrics "$metrics" \
  python3 "${NCU_SCRIPT:-scripts/profile_mamba2.py}" 2>&1 |
  grep -E "^  [a-zA-Z].*\(|gpu__time|dram__|lts__|warps_active|inst_executed|issue_active"
