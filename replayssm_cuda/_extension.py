"""Loads the compiled module ``replayssm_cuda._C`` (when it was built) and says what it holds.

Importing ``_C`` registers the ``torch.ops.replayssm.*`` schemas and their CUDA kernels. Without it (a
CPU-only torch at install time, no nvcc, or a build for another torch) this module still imports and
every query answers "not compiled"; ``load_error()`` says why.
"""

from __future__ import annotations

import torch  # noqa: F401  (loads libtorch before _C, which links against it)

try:
    from . import _C
except ImportError as exc:
    _C = None
    if isinstance(exc, ModuleNotFoundError) or "cannot import name '_C'" in str(exc):
        _LOAD_ERROR = ("replayssm_cuda._C was not built (pure-Python install: build with a CUDA torch and nvcc, "
                       "`pip install --no-build-isolation .`)")
    else:  # built, but does not load: usually a build for another torch or CUDA
        _LOAD_ERROR = f"replayssm_cuda._C failed to load: {exc}"
except OSError as exc:  # a shared library it needs is missing
    _C = None
    _LOAD_ERROR = f"replayssm_cuda._C failed to load: {exc}"
else:
    _LOAD_ERROR = None

_COMPILED_OPS: tuple[str, ...] = tuple(_C.compiled_ops()) if _C is not None else ()


def is_compiled() -> bool:
    """True when replayssm_cuda._C imported (torch.ops.replayssm.* are registered)."""
    return _C is not None


def load_error() -> str | None:
    """Why the compiled extension is not available; None when it is."""
    return _LOAD_ERROR


def build_info() -> dict | None:
    """{version, cuda_version (CUDART_VERSION, e.g. "13000"), archs (e.g. "90a;100a"), compiled_ops},
    or None without the compiled extension."""
    if _C is None:
        return None
    return {**_C.build_info(), "compiled_ops": list(_COMPILED_OPS)}


def compiled_ops() -> list[str]:
    """Names of the torch.ops.replayssm ops that have a CUDA kernel in this build."""
    return list(_COMPILED_OPS)


def has_op(name: str) -> bool:
    """True when op `name` has a compiled CUDA kernel. Says nothing about whether a GPU is present."""
    return name in _COMPILED_OPS
