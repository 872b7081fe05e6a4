"""Heads per CTA of the replay step, swept in one process: for each dims set, batch and value of
REPLAYSSM_STEP_HEADS_PER_CTA ("auto": the launcher's choice), the replay step at w = L / 2 and the whole
L-step cycle (CUDA-graph replay, cold L2, medians: bench_mamba2's method and byte model), with one read
copy kind (--copy none / bf16 / fp8). Prints the CTA grid's waves for each value (resident CTAs from
--ctas-per-sm, the kernel's occupancy) so that a launch rule can be read off the table.

    PYTHONPATH=. python3 scripts/step_heads_sweep.py --dims nano4b --batches 64 128 --knobs auto 4 12

Runs from the repository root. Session 26 used it for the no-copy rule in choose_heads_per_cta."""

import argparse
import os
import sys

sys.path[0:0] = [os.getcwd(), os.path.join(os.getcwd(), "bench")]

import torch  # noqa: E402

from bench_mamba2 import Setup, bench_replay  # noqa: E402
from timing import DIMS, measure_copy_bandwidth  # noqa: E402

COPIES = {"none": None, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
KNOB = "REPLAYSSM_STEP_HEADS_PER_CTA"


def divisor_at_most(n: int, k: int) -> int:
    """The knob's reading: the largest divisor of n that is <= k."""
    return next(d for d in range(min(k, n), 0, -1) if n % d == 0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", nargs="*", default=["nano4b", "super120b"])
    ap.add_argument("--batches", nargs="*", type=int, default=[64, 128])
    ap.add_argument("--knobs", nargs="*", default=["auto", "4", "64"])
    ap.add_argument("--copy", choices=list(COPIES), default="none")
    ap.add_argument("--ctas-per-sm", nargs="*", type=int, default=[2, 3],
                    help="resident CTAs per SM of the step kernel, one per --dims entry (waves column only)")
    ap.add_argument("--buffer-len", type=int, default=16)
    args = ap.parse_args()
    rc = COPIES[args.copy]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = measure_copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}; copy {bw / 1e12:.3f} TB/s; L = {args.buffer_len}; copy: {args.copy}")
    print("| dims | batch | heads/CTA | waves | step us | step % copy | cycle us/step | cycle % copy |")
    print("|---|---|---|---|---|---|---|---|")
    for i, dname in enumerate(args.dims):
        H, P, N, G = DIMS[dname]
        resident = sms * args.ctas_per_sm[min(i, len(args.ctas_per_sm) - 1)]
        for batch in args.batches:
            s = Setup(H, P, N, G, batch, args.buffer_len)
            for knob in args.knobs:
                if knob == "auto":
                    os.environ.pop(KNOB, None)
                    waves = "-"
                else:
                    os.environ[KNOB] = knob
                    d = divisor_at_most(H // G, int(knob))
                    waves = f"{batch * (H // d) / resident:.2f}"
                t_step, b_step = bench_replay(s, rc, phase=s.L // 2)
                t_cycle, b_cycle = bench_replay(s, rc)
                print(f"| {dname} | {batch} | {knob} | {waves} | {t_step * 1e6:.1f} | {100 * b_step / t_step / bw:.1f} | "
                      f"{t_cycle * 1e6:.1f} | {100 * b_cycle / t_cycle / bw:.1f} |", flush=True)
    os.environ.pop(KNOB, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
