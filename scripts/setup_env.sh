#!/usr/bin/env bash
# Sourced by scripts/demo.sh and scripts/test.sh: makes ./.venv (once), installs torch, the build and
# test tools, the kernels' CUTLASS/CuTe headers (nvidia-cutlass, without its dependencies) and this
# package (building replayssm_cuda._C when torch has CUDA and a CUDA toolkit is found), then prints the
# install's one line: what it built, or why it built the pure-Python package.
# Installs already done are skipped: the package is built again only when setup.py, pyproject.toml,
# csrc/, the build knobs, torch or nvidia-cutlass changed (a stamp in the environment), so a second
# call starts in seconds.
#   REPLAYSSM_VENV          where the environment lives (default: .venv in the repository)
#   REPLAYSSM_TORCH         the torch requirement to install when torch is missing (default torch==2.13.0)
#   REPLAYSSM_CUDA_ARCHS    the archs to compile (default: this machine's GPU where it is an sm_90 or
#                           sm_100, else setup.py's default, 90a;100a)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${REPLAYSSM_VENV:-$repo/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
fi
py="$venv/bin/python"

# The kernels' CUTLASS/CuTe headers: only the headers are needed, so without the package's dependencies
# (cuda-python, scipy, ...). setup.py says the same when they are missing.
cutlass_requirement="nvidia-cutlass==4.2.0.0"

# What is there, without importing torch: torch's and nvidia-cutlass's versions, where replayssm_cuda
# lives, missing modules.
probe() {
  "$py" - "$repo" <<'EOF'
import importlib.metadata, importlib.util, sys
missing = [m for m in ("numpy", "ninja", "pybind11", "pytest") if importlib.util.find_spec(m) is None]
def version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "none"
spec = importlib.util.find_spec("replayssm_cuda")
here = spec is not None and spec.origin is not None and spec.origin.startswith(sys.argv[1] + "/")
print(version("torch"), version("nvidia-cutlass"), "installed" if here else "absent", *missing)
EOF
}
read -r torch_version cutlass_version package missing <<<"$(probe) "
if [ "$torch_version" = none ]; then
  "$py" -m pip install -q "${REPLAYSSM_TORCH:-torch==2.13.0}"
  read -r torch_version cutlass_version package missing <<<"$(probe) "
fi
if [ "nvidia-cutlass==$cutlass_version" != "$cutlass_requirement" ]; then
  "$py" -m pip install -q --no-deps "$cutlass_requirement"
  cutlass_version="${cutlass_requirement#*==}"
fi
if [ -n "${missing// /}" ]; then
  # shellcheck disable=SC2086  # one word per module
  "$py" -m pip install -q $missing
fi

# The quick start builds for this machine's GPU only (sm_90a on a Hopper, sm_100a on a Blackwell), as
# torch's extensions do, unless REPLAYSSM_CUDA_ARCHS says otherwise: half the build of both. A wheel
# (pip wheel .) builds both by default.
if [ -z "${REPLAYSSM_CUDA_ARCHS:-}" ] && command -v nvidia-smi >/dev/null 2>&1; then
  case "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')" in
    9.0) export REPLAYSSM_CUDA_ARCHS=90a ;;
    10.0) export REPLAYSSM_CUDA_ARCHS=100a ;;
  esac
fi

stamp="$venv/.replayssm-install"
key="$( { echo "$repo $torch_version $cutlass_version ${REPLAYSSM_CUDA_ARCHS:-} ${REPLAYSSM_SHAPES:-} ${REPLAYSSM_CTA_TIMELINE:-}" \
               "${CUDA_HOME:-} ${CUDA_PATH:-}"
          cat "$repo/setup.py" "$repo/pyproject.toml"
          find "$repo/csrc" -type f -print0 | LC_ALL=C sort -z | xargs -0 cat; } | sha256sum | cut -d' ' -f1)"
if [ "$package" != installed ] || [ "$(cat "$stamp" 2>/dev/null)" != "$key" ]; then
  # pip shows setup.py's line only with -v: the line is printed again below from its record.
  MAX_JOBS="${MAX_JOBS:-8}" "$py" -m pip install -q --no-build-isolation -e "$repo"
  echo "$key" > "$stamp"
fi
"$py" -c 'import runpy, sys; b = runpy.run_path(sys.argv[1]); print("replayssm-cuda", b["VERSION"] + ":", b["SUMMARY"])' \
  "$repo/replayssm_cuda/_build.py" >&2
export REPLAYSSM_PYTHON="$py"
