"""Host microseconds of the Python argument checks of `ops.mamba2_step` alone (CPU tensors, no GPU).

Every eager call of a `replayssm_cuda.ops` function (and of the cache methods built on them) validates
its arguments in Python before the compiled op runs; this times that validation by replacing the
dispatch (`ops._run`) with a no-op, nano4b dims, batch 1, L = 16. Median over 21 loops of 1000 calls.
Run it on two checkouts alternately to compare them (the machine's load moves it by tens of percent),
from a directory outside both, so that PYTHONPATH picks the package:

    cd /tmp && PYTHONPATH=/path/to/checkout python /path/to/checkout/scripts/time_python_checks.py
"""

import statistics
import time

import torch

from replayssm_cuda import ops


def main() -> None:
    H, P, N, G, L, slots, batch = 96, 80, 128, 8, 16, 4, 1
    act = torch.bfloat16
    cache = (torch.zeros(slots, H, P, N), None, None, torch.zeros(slots, H, L, P, dtype=act),
             torch.zeros(slots, G, L, N, dtype=act), torch.zeros(slots, H, L), torch.zeros(slots, dtype=torch.int32))
    x = torch.zeros(batch, H, P, dtype=act)
    B = torch.zeros(batch, G, N, dtype=act)
    args = (*cache, x, torch.zeros(batch, H, dtype=act), torch.zeros(H), B, torch.zeros_like(B), torch.zeros_like(x),
            torch.zeros(H), torch.zeros_like(x), torch.zeros(H), True, 1, None, -1, None)
    ops._run = lambda *a, **k: None  # the checks only

    def call():
        ops.mamba2_step(*args, backend="reference")

    for _ in range(200):
        call()
    per_call = []
    for _ in range(21):
        start = time.perf_counter()
        for _ in range(1000):
            call()
        per_call.append((time.perf_counter() - start) / 1000 * 1e6)
    print(f"{ops.__file__}: ops.mamba2_step argument checks {statistics.median(per_call):.1f} us per call "
          f"(median of 21 x 1000)")


if __name__ == "__main__":
    main()
