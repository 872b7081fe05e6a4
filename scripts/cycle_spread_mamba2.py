"""Does a batch-512 whole-cycle benchmark row vary inside one process? (PERF_NOTES, session 16)

The fp8-copy "replay cycle" rows of bench/bench_mamba2.py at batch 512 varied by up to 15% between
processes of one tree in sessions 14-15, while the step-by-step rows agreed within 1%. This times the
same whole cycle three times in one process (a fresh slot pool each time), next to the step at w = 8 and
the fold step, and their (15 steps + fold) / 16 estimate of the cycle. GPU only:
    PYTHONPATH=$PWD python3 scripts/cycle_spread_mamba2.py
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import torch  # noqa: E402

from bench_mamba2 import Setup, bench_replay  # noqa: E402
from timing import DIMS, measure_copy_bandwidth  # noqa: E402


def main():
    print(f"copy {measure_copy_bandwidth() / 1e12:.2f} TB/s")
    for name in ("nano4b", "super120b"):
        H, P, N, G = DIMS[name]
        s = Setup(H, P, N, G, batch=512, L=16)
        for rep in range(3):
            cycle, _ = bench_replay(s, torch.float8_e4m3fn)
            step, _ = bench_replay(s, torch.float8_e4m3fn, phase=s.L // 2)
            fold, _ = bench_replay(s, torch.float8_e4m3fn, phase=s.L - 1)
            estimate = ((s.L - 1) * step + fold) / s.L
            print(f"{name} b512 pool {rep}: cycle {cycle * 1e6:.1f} us, step {step * 1e6:.1f}, fold {fold * 1e6:.1f}, "
                  f"(15 steps + fold) / 16 {estimate * 1e6:.1f}", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
