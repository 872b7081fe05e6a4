#!/usr/bin/env bash
# Quick start, part 1: set up and run the main job (the GPU when there is one, else the CPU reference).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
"$REPLAYSSM_PYTHON" -m replayssm_cuda info
"$REPLAYSSM_PYTHON" -m replayssm_cuda demo
