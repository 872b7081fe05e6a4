"""Where a staggered step's time goes, with and without the fold split: GPU time per step of the step
kernel and of the order pass (torch.profiler), and the graph replay time per step, for the last step of
a staggered cycle (bf16 and fp8 copies). Session 24, run 3: the order pass is ~3 us of kernel time,
which is why the split needs 3 waves of the hint's launch to pay. The graph time here is under the
profiler, which adds a cost per kernel: compare it between settings with care (the sweep's unprofiled
mean steps are the measure).

    PYTHONPATH=. python3 scripts/staggered_step_kernels.py "8 16 32"
"""

import os
import sys

sys.path[0:0] = [os.getcwd(), os.path.join(os.getcwd(), "bench")]

import torch  # noqa: E402

from bench_mamba2 import ReplayPool, Setup, make_inputs  # noqa: E402
from replayssm_cuda import ops  # noqa: E402
from timing import DIMS, graph_kernel_times  # noqa: E402


def main():
    batches = [int(b) for b in sys.argv[1].split()]
    print("| dims | batch | copy | fold split | step_kernel us | order pass us | graph us/step |")
    print("|---|---|---|---|---|---|---|")
    for dname, (H, P, N, G) in DIMS.items():
        for batch in batches:
            s = Setup(H, P, N, G, batch, 16)
            for label, rc in [("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)]:
                pool = ReplayPool(s, rc, staggered_flush=True)
                phase = torch.zeros_like(pool.cursors)
                ops.stagger_cursors([], phase, s.L, backend="cuda")
                start = (phase + s.L - 1) % s.L            # the cycle's last step
                inputs = make_inputs(s, pool.k)
                for split in ("on", "off"):
                    os.environ.pop("REPLAYSSM_STEP_FOLD_SPLIT", None)
                    if split == "off":
                        os.environ["REPLAYSSM_STEP_FOLD_SPLIT"] = "0"
                    kt = graph_kernel_times(lambda: pool.record_steps(inputs),
                                            before_replay=lambda: pool.cursors.copy_(start))
                    step, order = kt.get("step_kernel", 0) / pool.k, kt.get("step_row_order_kernel", 0) / pool.k
                    print(f"| {dname} | {batch} | {label} | {split} | {step * 1e6:.1f} | {order * 1e6:.1f} | "
                          f"{kt['(replay)'] / pool.k * 1e6:.1f} |", flush=True)
                os.environ.pop("REPLAYSSM_STEP_FOLD_SPLIT", None)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
