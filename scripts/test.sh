#!/usr/bin/env bash
# Quick start, part 2: set up and run the tests (GPU tests skip without a GPU and compiled extension).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# tests/test_real_model.py decodes transformers' own models; pinned, since it hooks into their layer
# code. Without it (e.g. offline) that test skips.
if ! "$REPLAYSSM_PYTHON" -c 'import importlib.metadata as m, sys; sys.exit(m.version("transformers") != "5.25.0")' 2>/dev/null; then
  "$REPLAYSSM_PYTHON" -m pip install -q "transformers==5.25.0" \
    || echo "scripts/test.sh: transformers not installed; tests/test_real_model.py will skip" >&2
fi
"$REPLAYSSM_PYTHON" -m pytest -q tests "$@"
