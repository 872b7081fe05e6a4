#!/usr/bin/env bash
# The one script for a GPU machine: build replayssm_cuda._C in place, print its build info, run the GPU
# tests, then the benchmarks when there are any. Logs go to $OUT (default ./results).
#   bash tools/gpu_check.sh [bench args]  # REPLAYSSM_BENCH=0 skips the benchmark (the args go to
#                                  # `python -m replayssm_cuda bench mamba2 cycle`); REPLAYSSM_TESTS=all adds
#                                  # the CPU tests (CI runs them anyway); REPLAYSSM_CUDA_ARCHS=90a halves the build
set -euo pipefail
cd "$(dirname "$0")/.."

export MAX_JOBS=16 PYTHONUNBUFFERED=1
OUT="${OUT:-./results}"
mkdir -p "$OUT"

# CUTLASS/CuTe headers: the nvidia-cutlass wheel carried in .whl/ (the GPU machine has no internet).
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

echo "== build"
start=$(date +%s)
python3 setup.py build_ext --inplace 2>&1 | tee "$OUT/build.log"
echo "build: $(( $(date +%s) - start )) s"

echo "== build info"
python3 -c 'import replayssm_cuda._extension as e; print(e.build_info())'

echo "== tests"
# A test failure does not stop the benchmarks (one device call should bring back everything); the
# script still exits with the tests' status.
set +e
# The CPU tests also run in CI; on the device only the GPU tests and the CLI demo (on the GPU) are
# worth its minutes unless REPLAYSSM_TESTS=all. Any other value is taken as the pytest paths to run
# (e.g. REPLAYSSM_TESTS=tests/gpu/test_mamba2_cuda.py).
case "${REPLAYSSM_TESTS:-gpu}" in
  gpu) test_paths=(tests/gpu tests/test_cli.py) ;;
  all) test_paths=(tests) ;;
  *) read -r -a test_paths <<< "$REPLAYSSM_TESTS" ;;
esac
# A kernel that hangs must not eat the device call: the tests stop after REPLAYSSM_TEST_TIMEOUT seconds
# (default 300; the whole GPU suite takes ~110 s on the H200) and the script goes on (status 124).
timeout "${REPLAYSSM_TEST_TIMEOUT:-300}" python3 -m pytest -q -rs "${test_paths[@]}" 2>&1 | tee "$OUT/tests.log"
tests_status=${PIPESTATUS[0]}
set -e

if [[ "${REPLAYSSM_BENCH:-1}" != 0 ]]; then
  echo "== benchmark"
  python3 -m replayssm_cuda bench mamba2 cycle "$@"   # e.g. --dims nano4b --batches 256
fi
exit "$tests_status"
