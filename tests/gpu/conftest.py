"""tests/gpu: the compiled CUDA ops against the reference. Skipped as a whole, with the reason, when
there is no GPU or the extension was not built."""

from pathlib import Path

import pytest
import torch

from replayssm_cuda import _extension

_HERE = Path(__file__).parent.resolve()


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return f"tests/gpu need a CUDA GPU (torch {torch.__version__}, CUDA {torch.version.cuda or 'none'})"
    if not _extension.is_compiled():
        return f"tests/gpu need the compiled extension: {_extension.load_error()}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(skip)
