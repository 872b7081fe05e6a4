"""torch.ops.replayssm.* on every install: the schemas (_schemas.py) defined with torch.library, the
checked PyTorch reference as the kernel of every device without a compiled one, and fake kernels.

    CUDA                       the compiled kernel, where _C registered one (TORCH_LIBRARY_IMPL in
                               csrc/api/registration.cpp); it checks its arguments in C++
    CompositeExplicitAutograd  every other device, and CUDA for the ops _C has no kernel for:
                               _checks.OP_CHECKS[name] then the reference (host-synchronising)
    fake / Meta                nothing: every op writes its arguments in place and returns nothing, so
                               torch.compile and opcheck trace the ops as opaque mutations

A direct CUDA kernel takes precedence over the CompositeExplicitAutograd one, so when a family's
kernels land in _C they replace its reference on CUDA with no change here.
"""

from __future__ import annotations

import warnings

import torch

from . import _checks, _extension, reference  # noqa: F401  (_extension: _C's kernels first)
from ._schemas import LAYER_OPS, SCHEMAS

REFERENCE = {
    "make_read_copy": reference.make_read_copy,
    "mamba2_update": reference.mamba2_update,
    "mamba2_step": reference.mamba2_step,
    "mamba2_verify": reference.mamba2_verify,
    "mamba2_commit": reference.mamba2_commit,
    "mamba2_flush": reference.mamba2_flush,
    "mamba2_materialize": reference.mamba2_materialize,
    "mamba2_update_snapshots": reference.mamba2_update_snapshots,
    "load": reference.load,
    "reset": reference.reset,
    "stagger_cursors": reference.stagger_cursors,
    "copy_slots": reference.copy_slots,
    "fill_slots_table": reference.fill_slots_table,
    "copy_slots_table": reference.copy_slots_table,
    **{name: getattr(reference, name) for name in LAYER_OPS},
    **{f"{family}_{op}": getattr(reference, f"delta_{op}") for family in ("gdn", "kda")
       for op in ("update", "update_snapshots", "step", "verify", "commit", "flush", "materialize")},
}


def _checked_reference(name: str):
    check, ref = _checks.OP_CHECKS[name], REFERENCE[name]

    def kernel(*args):
        check(*args)
        ref(*args)

    kernel.__name__ = f"{name}_reference"
    return kernel


def _fake(*args):
    return None


def _define() -> torch.library.Library:
    try:
        lib = torch.library.Library("replayssm", "DEF")
        defined = set()
    except RuntimeError:
        # A _C built from an older tree defines the Mamba-2 and cache schemas itself (TORCH_LIBRARY):
        # add what it lacks. Its CPU kernels (an error naming the CPU tensor) stay in front of the
        # reference for torch.ops.replayssm.* on CPU tensors until it is rebuilt.
        warnings.warn("replayssm_cuda: replayssm_cuda._C defines torch.ops.replayssm itself (a build of an older "
                      "tree): rebuild it (pip install --no-build-isolation .)", RuntimeWarning, stacklevel=3)
        lib = torch.library.Library("replayssm", "FRAGMENT")
        defined = {name for name in SCHEMAS if hasattr(torch.ops.replayssm, name)}
    for name, schema in SCHEMAS.items():
        if name not in defined:
            lib.define(schema)
        lib.impl(name, _checked_reference(name), "CompositeExplicitAutograd")
        torch.library.register_fake(f"replayssm::{name}", _fake, lib=lib)
    return lib


# Kept alive for the life of the process: the definitions go with this object.
LIBRARY = _define()
