"""Launch overrides: replace a launch rule's choice (heads per CTA, ring stages, ...) for tests, benchmarks
and tuning. The rules, what each override does and the measurements behind them: docs/TUNING.md.

    with replayssm_cuda.launch_overrides(step_heads_per_cta=4):
        ...  # every Mamba-2 step launched here takes 4 heads of a group per CTA

Each field is also read once, at the first launch, from the environment variable of its name in upper
case with the prefix REPLAYSSM_ (REPLAYSSM_STEP_HEADS_PER_CTA=4). An unset field (0 or -1, or None here)
lets its rule decide. The overrides are consulted when a launch is planned, so a CUDA graph keeps the
launch chosen when it was captured.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from . import _extension


def _compiled():
    if _extension._C is None:
        raise RuntimeError(f"launch overrides need the compiled extension: {_extension.load_error()}")
    return _extension._C


def get_launch_overrides() -> dict:
    """{field: value} of the overrides in force; an unset field holds its unset value (0 or -1)."""
    return dict(_compiled().get_launch_overrides())


@contextlib.contextmanager
def launch_overrides(**fields) -> Iterator[dict]:
    """Sets the named overrides (None: unset) on top of those in force, and restores those on exit.
    Yields the overrides in force inside. ValueError names an unknown field or a bad value."""
    C = _compiled()
    previous = dict(C.get_launch_overrides())
    C.set_launch_overrides({**previous, **fields})
    try:
        yield dict(C.get_launch_overrides())
    finally:
        C.set_launch_overrides(previous)
