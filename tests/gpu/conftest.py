"""tests/gpu: the compiled CUDA ops against the reference. Skipped as a whole, with the reason, when
there is no GPU or the extension was not built."""

import contextlib
from pathlib import Path

import pytest
import torch

import replayssm_cuda
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


@pytest.fixture
def set_overrides():
    """set_overrides(**fields) sets launch overrides (replayssm_cuda.launch_overrides; None unsets a field)
    from there to the end of the test, where the ones in force before come back."""
    with contextlib.ExitStack() as stack:
        yield lambda **fields: stack.enter_context(replayssm_cuda.launch_overrides(**fields))
