"""The fp32 checkpoint's replay step without a read copy on tensor cores (2 x tf32) against CUDA cores,
in one process: for each dims set and batch, REPLAYSSM_STEP_TF32_REPLAY = 0 / 1 alternating, the replay
step at w = L / 2, the fold step (every row folds) and the whole L-step cycle, with the conventional
fp32 update of the same setup as the baseline (CUDA-graph replay, cold L2, medians: bench_mamba2's
method and byte model). The launcher's rule (step_tf32_replay in csrc/kernels/mamba2_tile.cuh) is read
off this table.

    PYTHONPATH=. python3 scripts/tf32_replay_sweep.py --dims nano4b super120b --batches 1 8 32 64

Runs from the repository root."""

import argparse
import os
import sys

sys.path[0:0] = [os.getcwd(), os.path.join(os.getcwd(), "bench")]

from bench_mamba2 import Setup, bench_conventional, bench_replay  # noqa: E402
from timing import DIMS, measure_copy_bandwidth  # noqa: E402

import torch  # noqa: E402

KNOB = "REPLAYSSM_STEP_TF32_REPLAY"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", nargs="*", default=["nano4b", "super120b"])
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--buffer-len", type=int, default=16)
    args = ap.parse_args()
    bw = measure_copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}; copy {bw / 1e12:.3f} TB/s; L = {args.buffer_len}; fp32 checkpoint, no copy")
    print("| dims | batch | update us | tf32 | step us | step % copy | fold us | cycle us/step | cycle vs update |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dname in args.dims:
        H, P, N, G = DIMS[dname]
        for batch in args.batches:
            s = Setup(H, P, N, G, batch, args.buffer_len)
            t_update, _ = bench_conventional(s)
            for knob in ("0", "1"):
                os.environ[KNOB] = knob
                t_step, b_step = bench_replay(s, None, phase=s.L // 2)
                t_fold, _ = bench_replay(s, None, phase=s.L - 1)
                t_cycle, _ = bench_replay(s, None)
                print(f"| {dname} | {batch} | {t_update * 1e6:.2f} | {knob} | {t_step * 1e6:.2f} | "
                      f"{100 * b_step / t_step / bw:.1f} | {t_fold * 1e6:.2f} | {t_cycle * 1e6:.2f} | "
                      f"{t_update / t_cycle:.3f}x |", flush=True)
    os.environ.pop(KNOB, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
