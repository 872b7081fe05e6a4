"""Loads the compiled module ``replayssm_cuda._C`` (when it was built) and says what it holds.

Importing ``_C`` registers CUDA kernels for the ``torch.ops.replayssm.*`` ops it compiled; the ops
themselves (schemas, the reference as CPU and fallback kernel, fake kernels) come from
``replayssm_cuda._library`` on every install. Without ``_C`` (a CPU-only torch at install time, no
nvcc) this module still imports, ``capabilities()`` lists no compiled op and ``load_error()`` says why.
A _C built for another torch minor version or CUDA major version is not loaded: importing raises an
ImportError that names both.
"""

from __future__ import annotations

import copy

import torch  # loads libtorch before _C, which links against it

try:  # setup.py's record of what the install built (absent in a source tree never installed)
    from . import _build
except ImportError:
    _build = None


def torch_mismatch(built_torch, built_cuda, torch_version, torch_cuda) -> str | None:
    """Why a _C built against torch `built_torch` with CUDA `built_cuda` must not be loaded under torch
    `torch_version` with CUDA `torch_cuda`, or None. _C links against libtorch's C++ ABI, which changes
    between minor versions (loading it under another one fails on a missing symbol at best, crashes at
    worst), and against one CUDA major version's runtime."""
    if built_torch is None:
        return None
    def minor(version):
        return tuple(str(version).split("+")[0].split(".")[:2])
    def major(version):
        return str(version).split(".")[0] if version else None
    if minor(built_torch) == minor(torch_version) and major(built_cuda) == major(torch_cuda):
        return None
    return (f"replayssm_cuda's compiled kernels (replayssm_cuda._C) were built against torch {built_torch} with "
            f"CUDA {built_cuda}, but torch {torch_version} with CUDA {torch_cuda} is installed: install the "
            f"replayssm-cuda build for this torch (its version's local tag names both, e.g. +cu130.torch2.11) or "
            f"rebuild it (`pip install --no-build-isolation .`)")


if _build is not None and _build.EXTENSION:
    _MISMATCH = torch_mismatch(getattr(_build, "TORCH", None), getattr(_build, "CUDA", None), torch.__version__,
                               torch.version.cuda)
    if _MISMATCH is not None:
        raise ImportError(_MISMATCH)

try:
    from . import _C
except ImportError as exc:
    _C = None
    if isinstance(exc, ModuleNotFoundError) or "cannot import name '_C'" in str(exc):
        why = _build.REASON if _build is not None and not _build.EXTENSION else "pure-Python install"
        _LOAD_ERROR = (f"replayssm_cuda._C was not built ({why}; build it with a CUDA torch and nvcc: "
                       "`pip install --no-build-isolation .`)")
    else:  # built, but does not load: usually a build for another torch or CUDA
        _LOAD_ERROR = f"replayssm_cuda._C failed to load: {exc}"
except OSError as exc:  # a shared library it needs is missing
    _C = None
    _LOAD_ERROR = f"replayssm_cuda._C failed to load: {exc}"
else:
    _LOAD_ERROR = None

_CACHE_OPS = ("make_read_copy", "load", "reset", "stagger_cursors", "copy_slots", "fill_slots_table",
              "copy_slots_table")

# The pure-Python build's answer, with the op lists cut to what _C registered: the limits of the
# Mamba-2, GDN, KDA and cache kernels, in the format of _C.capabilities(), for builds of _C that do not report
# them (and for none at all, where every op list is empty). "shapes" are the checkpoint's last two dims:
# (head_dim, state_dim) for Mamba-2, (head_v_dim, head_k_dim) for GDN and KDA (GDN's kernels).
_REPLAY_PAIRS = [["float32", None], ["float32", "bfloat16"], ["float32", "float16"], ["float32", "float8_e4m3fn"],
                 ["bfloat16", None], ["bfloat16", "float8_e4m3fn"], ["float16", None], ["float16", "float8_e4m3fn"]]
_FALLBACK_CAPABILITIES = {
    "mamba2": {
        "ops": [],
        "shapes": [[64, 64], [64, 128], [80, 64], [80, 128], [128, 64], [128, 128]],
        "activation_dtypes": ["bfloat16", "float16"],
        "update_checkpoint_dtypes": ["float32", "bfloat16", "float16"],
        "checkpoint_read_copy": _REPLAY_PAIRS,
        "max_buffer_len": 64,
        "max_draft_tokens": 16,
    },
    "gdn": {
        "ops": [],
        "shapes": [[64, 64], [128, 64], [64, 128], [128, 128]],
        "activation_dtypes": ["bfloat16", "float16"],
        "update_checkpoint_dtypes": ["float32", "bfloat16", "float16"],
        "checkpoint_read_copy": _REPLAY_PAIRS,
        "max_buffer_len": 64,
        "max_draft_tokens": 16,
        "fold_max_buffer_len": [],
    },
    "kda": {
        "ops": [],
        "shapes": [[64, 64], [128, 64], [64, 128], [128, 128]],
        "activation_dtypes": ["bfloat16", "float16"],
        "update_checkpoint_dtypes": ["float32", "bfloat16", "float16"],
        "checkpoint_read_copy": _REPLAY_PAIRS,
        "max_buffer_len": 64,
        "max_draft_tokens": 16,
        # [V, K, checkpoint dtype, L]: the fold takes at most L entries there (its per-channel decays).
        "fold_max_buffer_len": [[128, 128, "float32", 63]],
    },
    "cache": {"ops": [], "checkpoint_dtypes": ["float32", "bfloat16", "float16"],
              "read_copy_dtypes": ["bfloat16", "float16", "float8_e4m3fn"], "read_copy_max_cols": 256,
              "copy_slots_max_pairs": 3072},
}


def _fallback_capabilities(compiled) -> dict:
    caps = copy.deepcopy(_FALLBACK_CAPABILITIES)
    for family in ("mamba2", "gdn", "kda"):
        caps[family]["ops"] = [op for op in compiled if op.startswith(family + "_")]
    caps["cache"]["ops"] = [op for op in compiled if op in _CACHE_OPS]
    return caps


if _C is not None and hasattr(_C, "capabilities"):
    _CAPABILITIES: dict = _C.capabilities()
    _COMPILED_OPS: tuple[str, ...] = tuple(op for entry in _CAPABILITIES.values() for op in entry.get("ops", ()))
else:
    _COMPILED_OPS = tuple(_C.compiled_ops()) if _C is not None else ()
    _CAPABILITIES = _fallback_capabilities(_COMPILED_OPS)


def is_compiled() -> bool:
    """True when replayssm_cuda._C imported (some torch.ops.replayssm.* have CUDA kernels)."""
    return _C is not None


def load_error() -> str | None:
    """Why the compiled extension is not available; None when it is."""
    return _LOAD_ERROR


def capabilities() -> dict:
    """What this build compiled, per family: {"mamba2", "gdn" and "kda": {"ops", "shapes" (the
    checkpoint's two last dims: [P, N] for Mamba-2, [V, K] for GDN and KDA), "activation_dtypes",
    "update_checkpoint_dtypes", "checkpoint_read_copy", "max_buffer_len", "max_draft_tokens"}, "cache":
    {"ops", "checkpoint_dtypes" (make_read_copy's and load's), "read_copy_dtypes", "read_copy_max_cols",
    "copy_slots_max_pairs"}}; "gdn" and "kda" add "fold_max_buffer_len", [V, K, checkpoint dtype, L] rows
    where commit, flush and materialize take at most L < max_buffer_len entries. KDA runs GDN's kernels
    (the decay per key channel): the same shapes and dtypes, its own op list and fold limits. Every "ops"
    list is empty without the compiled extension. A fresh copy on each call."""
    return copy.deepcopy(_CAPABILITIES)


def install_summary() -> str:
    """setup.py's line about this install: the version with its local tag and what it built, or why
    it built the pure-Python package."""
    if _build is None:
        return "no record (a source tree that was never installed)"
    return f"replayssm-cuda {_build.VERSION}: {_build.SUMMARY}"


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
