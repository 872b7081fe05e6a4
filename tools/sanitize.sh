#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over every compiled op on small configs (GPU machine, after the
# in-place build of tools/gpu_check.sh). Exits non-zero on any finding.
#   bash tools/sanitize.sh [mamba2] [gdn] [kda]      # every family by default (tools/sanitize_ops.py)
#   SANITIZE_TOOLS=racecheck bash tools/sanitize.sh gdn
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
  echo "== compute-sanitizer --tool $tool $*"
  start=$(date +%s)
  compute-sanitizer --tool "$tool" --error-exitcode 1 python3 tools/sanitize_ops.py "$@"
  echo "$tool: $(( $(date +%s) - start )) s"
done
