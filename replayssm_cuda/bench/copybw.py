"""The device copy bandwidth: the ceiling every other table's "% copy" divides by (a 1 GiB device-to-device
copy, measured at the start of every run), and here the same at the sizes the kernels move per launch.

Each row times launches of one size the benchmarks' way: a CUDA graph of k launches on k different buffers
(k so that the graph touches well over L2), the GPU held busy before the start event, the median replay.
"copy" is a device-to-device copy (bytes = read + written), "read-only sum" a float32 sum (bytes = read).
If a copy of the bytes a batch-64 kernel moves reaches less than the 1 GiB copy, part of what that kernel
misses is every launch's start and end, not its own.
"""

from __future__ import annotations

import functools

import torch

from . import timing
from .registry import Bench, Case, Measurement

DEFAULT_MIB = (32, 64, 128, 256, 512, 1024)


def _buffers(nbytes: int):
    k = max(2, -(-timing.COLD_FACTOR * timing.device_l2_bytes() // nbytes))   # rotate over well over L2 in all
    return k, [torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_() for _ in range(k)]


def measure_copy(nbytes: int) -> Measurement:
    k, srcs = _buffers(nbytes)
    dsts = [torch.empty_like(s) for s in srcs]

    def copies():
        for d, s in zip(dsts, srcs):
            d.copy_(s)

    seconds, kernels = timing.timed(copies, k)
    return Measurement(seconds, 2 * nbytes, kernels=kernels)


def measure_sum(nbytes: int) -> Measurement:
    k, srcs = _buffers(nbytes)
    outs = [torch.empty((), dtype=torch.float32, device="cuda") for _ in range(k)]

    def sums():
        for o, s in zip(outs, srcs):
            torch.sum(s, dim=0, out=o)

    seconds, kernels = timing.timed(sums, k)
    return Measurement(seconds, nbytes, kernels=kernels)


def plan_copy(args, _dims):
    cases = []
    for mib in args.mib:
        nbytes = mib * 2**20
        cases.append(Case({"MiB": mib, "row": "copy"}, functools.partial(measure_copy, nbytes), overridable=False))
        cases.append(Case({"MiB": mib, "row": "read-only sum"}, functools.partial(measure_sum, nbytes),
                          overridable=False))
    return cases, []


def _copy_arguments(parser):
    parser.add_argument("--mib", nargs="+", type=int, default=list(DEFAULT_MIB),
                        help=f"MiB read per launch (default {' '.join(map(str, DEFAULT_MIB))})")


COPY = Bench("copy", "device copy bandwidth: the ceiling, and copies / reads at the sizes kernels move",
             "µs per launch of a device-to-device copy and of a read-only float32 sum of each size; GB/s is "
             "bytes read + written (copy) or read (sum) per second.\n\n" + __doc__,
             plan_copy, _copy_arguments, options=(), needs_ops=())
