"""One environment knob of the replay step swept in one process: for each dims set, batch, read copy and
value of --knob ("unset": the launcher's rule), the replay step at w = L / 2, the fold step (every row
folds) and the whole L-step cycle (CUDA-graph replay, cold L2, medians: bench_mamba2's method and byte
model), with the conventional update of the same batch beside them (the cycle's baseline).

    PYTHONPATH=. python3 scripts/step_knob_sweep.py --knob REPLAYSSM_STEP_GROUPS_PER_CTA --values unset 1 2 \
        --dims nano4b --batches 256 512 --copies none fp8

Runs from the repository root. Session 30 used it for the two-group CTAs (choose_two_group_ctas); it
replaces session 27's tf32_replay_sweep.py (`--knob REPLAYSSM_STEP_TF32_REPLAY --values 0 1 --copies none`)."""

import argparse
import os
import sys

sys.path[0:0] = [os.getcwd(), os.path.join(os.getcwd(), "bench")]

import torch  # noqa: E402

from bench_mamba2 import Setup, bench_conventional, bench_replay  # noqa: E402
from timing import DIMS, measure_copy_bandwidth  # noqa: E402

COPIES = {"none": None, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def set_knob(name: str, value: str) -> list:
    """Sets --knob to `value` ("unset" removes it), or, for a value of the form NAME=v[,NAME2=v2...], leaves
    --knob unset and sets those variables instead (so that one process compares two knobs' launches);
    returns the other variables it set, for clear_knobs."""
    os.environ.pop(name, None)
    if value == "unset":
        return []
    if "=" not in value:
        os.environ[name] = value
        return []
    others = dict(pair.split("=", 1) for pair in value.split(","))
    os.environ.update(others)
    return list(others)


def clear_knobs(name: str, others: list) -> None:
    for var in [name, *others]:
        os.environ.pop(var, None)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", nargs="*", default=["nano4b", "super120b"])
    ap.add_argument("--batches", nargs="*", type=int, default=[64, 128, 256, 512])
    ap.add_argument("--copies", nargs="*", choices=list(COPIES), default=["none", "fp8"])
    ap.add_argument("--knob", required=True, help="the environment variable")
    ap.add_argument("--values", nargs="*", default=["unset"],
                    help='values of --knob; "unset": the launcher\'s rule; NAME=v[,NAME2=v2]: other variables instead')
    ap.add_argument("--buffer-len", type=int, default=16)
    ap.add_argument("--no-fold", action="store_true", help="skip the fold step's row")
    ap.add_argument("--update-per-value", action="store_true",
                    help="time the update again under each value (for a knob the update reads too, e.g. REPLAYSSM_PDL)")
    args = ap.parse_args()
    bw = measure_copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}; copy {bw / 1e12:.3f} TB/s; L = {args.buffer_len}")
    print(f"| dims | batch | copy | {args.knob} | step us | step % copy | fold us | fold / update | cycle us/step | "
          "update us | update / cycle |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for dname in args.dims:
        H, P, N, G = DIMS[dname]
        for batch in args.batches:
            s = Setup(H, P, N, G, batch, args.buffer_len)
            t_update = None if args.update_per_value else bench_conventional(s)[0]
            for copy in args.copies:
                rc = COPIES[copy]
                for knob in args.values:
                    others = set_knob(args.knob, knob)
                    if args.update_per_value:
                        t_update, _ = bench_conventional(s)
                    t_step, b_step = bench_replay(s, rc, phase=s.L // 2)
                    t_fold = float("nan") if args.no_fold else bench_replay(s, rc, phase=s.L - 1)[0]
                    t_cycle, _ = bench_replay(s, rc)
                    print(f"| {dname} | {batch} | {copy} | {knob} | {t_step * 1e6:.1f} | "
                          f"{100 * b_step / t_step / bw:.1f} | {t_fold * 1e6:.1f} | {t_fold / t_update:.3f} | "
                          f"{t_cycle * 1e6:.1f} | {t_update * 1e6:.1f} | {t_update / t_cycle:.2f} |", flush=True)
                    clear_knobs(args.knob, others)
    return 0


if __name__ == "__main__":
    sys.exit(main())
