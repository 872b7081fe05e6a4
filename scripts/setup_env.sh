#!/usr/bin/env bash
# Sourced by scripts/demo.sh and scripts/test.sh: makes ./.venv (once), installs torch, the build and
# test tools, and this package (building replayssm_cuda._C when torch has CUDA and nvcc is found).
#   REPLAYSSM_VENV          where the environment lives (default: .venv in the repository)
#   REPLAYSSM_TORCH         the torch requirement to install when torch is missing (default torch==2.13.0)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${REPLAYSSM_VENV:-$repo/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip setuptools wheel
if ! "$py" -c "import torch" 2>/dev/null; then
  "$py" -m pip install -q "${REPLAYSSM_TORCH:-torch==2.13.0}"
fi
"$py" -m pip install -q numpy ninja pybind11 pytest
"$py" -m pip install -q --no-deps nvidia-cutlass==4.2.0.0  # the CUTLASS/CuTe headers the kernels include
MAX_JOBS="${MAX_JOBS:-8}" "$py" -m pip install -q --no-build-isolation -e "$repo"
export REPLAYSSM_PYTHON="$py"
