"""What the copy-bandwidth ceiling is at the sizes the batch-64 kernels move: device-to-device copies and
a read-only kernel (a float32 sum) of several sizes, timed the benchmarks' way (CUDA-graph replay of k
launches on k different buffers, so L2 is cold; the GPU held busy before the start event; medians), as
TB/s and as a fraction of the 1 GiB copy that bench/bench_mamba2.py divides by. The no-copy step at batch
64 moves ~251 MB (nano4b) / ~283 MB (super120b) in one launch, almost all of it read; the update twice
that, half read, half written. If a copy of those bytes reaches less than the 1 GiB copy, part of what
the step and the update miss at batch 64 is every launch's start and end, not theirs alone.

    PYTHONPATH=. python3 scripts/copy_size_probe.py [--mib 32 64 128 256 512 1024]

Runs from the repository root (session 26 wrote it; session 27's list item 1)."""

import argparse
import os
import sys

sys.path[0:0] = [os.getcwd(), os.path.join(os.getcwd(), "bench")]

import torch  # noqa: E402

from timing import COLD_FACTOR, L2_BYTES, measure_copy_bandwidth, time_graph  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", nargs="*", type=int, default=[32, 64, 128, 256, 512, 1024],
                    help="bytes each launch reads (the copy writes as many again), in MiB")
    args = ap.parse_args()
    ceiling = measure_copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}; 1 GiB copy (bench_mamba2's ceiling): {ceiling / 1e12:.3f} TB/s")
    print("| MiB read per launch | launches per graph | copy us | copy TB/s (read + write) | % of ceiling | "
          "read-only sum us | sum TB/s (read) | % of ceiling |")
    print("|---|---|---|---|---|---|---|---|")
    for mib in args.mib:
        nbytes = mib * 2**20
        k = max(2, -(-COLD_FACTOR * L2_BYTES // nbytes))  # buffers to rotate over: well over L2 in all
        srcs = [torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_() for _ in range(k)]
        dsts = [torch.empty_like(s) for s in srcs]
        outs = [torch.empty((), dtype=torch.float32, device="cuda") for _ in range(k)]

        def copies():
            for d, s in zip(dsts, srcs):
                d.copy_(s)

        def sums():
            for o, s in zip(outs, srcs):
                torch.sum(s, dim=0, out=o)

        t_copy = time_graph(copies) / k
        t_sum = time_graph(sums) / k
        bw_copy, bw_sum = 2 * nbytes / t_copy, nbytes / t_sum
        print(f"| {mib} | {k} | {t_copy * 1e6:.1f} | {bw_copy / 1e12:.3f} | {100 * bw_copy / ceiling:.1f} | "
              f"{t_sum * 1e6:.1f} | {bw_sum / 1e12:.3f} | {100 * bw_sum / ceiling:.1f} |", flush=True)
        del srcs, dsts, outs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
