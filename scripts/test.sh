#!/usr/bin/env bash
# Quick start, part 2: set up and run the tests (GPU tests skip without a GPU and compiled extension).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
"$REPLAYSSM_PYTHON" -m pytest -q tests "$@"
