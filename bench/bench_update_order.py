"""The conventional update at a small batch right after other work in the same process.

The full benchmark measures the batch-64 update at 86-89% of copy bandwidth, but 11-13% slower when a
batch-256 or batch-512 update ran just before it in the same process (session 19, run 5). This script
measures that one row three times in a fresh process after one kind of preceding work, so that the cause
can be narrowed down (session 20, runs 3-4: a 6 GiB allocation or 3 s of device copies before it do not
slow it; a 5 s sleep after the large update removes the slow-down):

    for w in none update512 update512-keep update512-sleep update256 alloc alloc-keep copies copies-sleep; do
        python3 bench/bench_update_order.py $w
    done

Each line: the work before, then the batch-64 update's microseconds per step (CUDA-graph replay, cold
L2, median of the replays, as bench_mamba2.py times it) for the three measurements in order.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mamba2 import Setup, bench_conventional  # noqa: E402  (bench/, the script's folder)
from timing import DIMS  # noqa: E402

BEFORE = ("none", "update512", "update512-keep", "update512-sleep", "update256", "alloc", "alloc-keep",
          "copies", "copies-sleep")


def update_us(dims: str, batch: int) -> float:
    H, P, N, G = DIMS[dims]
    return bench_conventional(Setup(H, P, N, G, batch, 16))[0] * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("before", nargs="?", default="none", choices=BEFORE,
                        help="the work run before the three batch-64 measurements (default: none)")
    parser.add_argument("--dims", default="super120b", choices=list(DIMS))
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_update_order: needs a CUDA GPU", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    w = args.before
    if w.startswith("update"):          # a large update, as the full benchmark's earlier batches run it
        update_us(args.dims, 512 if w.startswith("update512") else 256)
        if w != "update512-keep":
            torch.cuda.empty_cache()
        if w.endswith("-sleep"):
            time.sleep(5)
    elif w.startswith("alloc"):         # 6 GiB allocated, written and freed: placement of later allocations
        x = torch.empty(6 * 2**30 // 4, device="cuda")
        x.fill_(1.0)
        torch.cuda.synchronize()
        del x
        if w == "alloc":
            torch.cuda.empty_cache()
    elif w.startswith("copies"):        # 3 s of 1 GiB device copies: sustained load, heat, clocks
        a = torch.empty(2**30 // 4, device="cuda")
        b = torch.empty_like(a)
        start = time.time()
        while time.time() - start < 3:
            for _ in range(50):
                b.copy_(a)
            torch.cuda.synchronize()
        del a, b
        torch.cuda.empty_cache()
        if w.endswith("-sleep"):
            time.sleep(5)
    times = [update_us(args.dims, args.batch) for _ in range(3)]
    print(f"{args.dims} batch {args.batch} update after {w:16s}: " + " / ".join(f"{t:.1f}" for t in times) + " us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
