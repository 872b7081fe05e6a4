#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over every compiled op on a small config (GPU machine,
# after the in-place build of tools/gpu_check.sh). Exits non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool"
  compute-sanitizer --tool "$tool" --error-exitcode 1 python3 tools/sanitize_ops.py
done
