"""Batch 1 without a copy, where the replay step is latency-bound: the conventional update and the
no-copy replay step at w = 8 per (H, P, N, G), as CUDA-graph replay time per step and as GPU kernel time
(torch.profiler), the bf16-copy step beside them, and the whole no-copy cycle (fold included; fastest of
3) with its ratio to the update. Beside nano4b and super120b the default shapes have the same bytes in
twice the heads of half the tile (N halved), and two other tile sizes: what a smaller tile per CTA
would buy (session 24, run 1: nothing; the step's kernel time is ~5.4-5.7 us from 16 to 40 KB tiles).

    PYTHONPATH=. python3 scripts/b1_latency_probe.py [--reference-dims-only]

Runs from the repository root; the tree it runs in comes first on the path (scripts/ab_bench.sh)."""

import os
import sys

sys.path[0:0] = [os.getcwd(), os.path.join(os.getcwd(), "bench")]

import torch  # noqa: E402

from bench_mamba2 import ReplayPool, Setup, bench_conventional, bench_replay, conventional_steps, make_inputs  # noqa: E402
from timing import graph_kernel_times, time_graph  # noqa: E402

SHAPES = [(96, 80, 128, 8), (192, 80, 64, 8), (128, 64, 128, 8), (256, 64, 64, 8), (96, 64, 128, 8), (96, 128, 128, 8)]


def kernel_us(record, k, before_replay=None):
    """GPU time of the kernels one of the graph's k steps launches, in us."""
    kt = graph_kernel_times(record, before_replay=before_replay)
    return sum(v for name, v in kt.items() if name != "(replay)") / k * 1e6


def main():
    shapes = SHAPES[::2][:2] if "--reference-dims-only" in sys.argv else SHAPES
    print(f"# {torch.cuda.get_device_name()}; batch 1, L = 16, bf16 activations, z gate; us")
    print("| H P N G | tile KB | update | step w=8 | step kernel | update kernel | bf16-copy step | no-copy cycle | cycle vs update |")
    print("|---|---|---|---|---|---|---|---|---|")
    for H, P, N, G in shapes:
        s = Setup(H, P, N, G, 1, 16)
        t_update, _ = bench_conventional(s)
        step = {}
        for rc in (None, torch.bfloat16):
            pool = ReplayPool(s, rc)
            inputs = make_inputs(s, pool.k)
            reset = lambda: pool.cursors.fill_(8)  # noqa: E731
            t = time_graph(lambda: pool.record_steps(inputs), before_replay=reset, replays=30) / pool.k
            step[rc] = (t * 1e6, kernel_us(lambda: pool.record_steps(inputs), pool.k, reset))
        cycle = min(bench_replay(s, None)[0] for _ in range(3))
        updates, k, _ = conventional_steps(s)
        print(f"| {H} {P} {N} {G} | {P * N * 4 // 1024} | {t_update * 1e6:.2f} | {step[None][0]:.2f} | {step[None][1]:.2f} | "
              f"{kernel_us(updates, k):.2f} | {step[torch.bfloat16][0]:.2f} | {cycle * 1e6:.2f} | {t_update / cycle:.3f}x |",
              flush=True)


if __name__ == "__main__":
    main()
