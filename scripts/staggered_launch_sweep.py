"""Staggered-flush launches compared in one process: the mean step of a staggered 16-step cycle (the
op's staggered_flush hint passed, slots in the phases Mamba2Cache(staggered_flush=True) gives) for each
launch setting, settings alternating round by round, and the lock-step mean step of the launcher's own
choice for reference. The launch knobs are read at every launch (so at graph capture), which is what
lets one process compare them. Session 24 chose the fold split's rule with it (runs 1, 3, 4).

    PYTHONPATH=. python3 scripts/staggered_launch_sweep.py "auto nosplit k2" "8 16 32" [rounds] [copies]

settings: auto (the launcher's choice), nosplit (REPLAYSSM_STEP_FOLD_SPLIT=0), noorder
(REPLAYSSM_STEP_ORDER=0: no order pass, so no split either), k<n>
(REPLAYSSM_STEP_HEADS_PER_CTA=n); copies: any of "none bf16 fp8" (default all). Each cell is the
fastest round's mean step in us, the slowest round's in brackets. Runs from the repository root; the
tree it runs in comes first on the path, so scripts/ab_bench.sh can run it in a base tree too."""

import os
import statistics
import sys

sys.path[0:0] = [os.getcwd(), os.path.join(os.getcwd(), "bench")]

import torch  # noqa: E402

from bench_mamba2 import Setup, bench_cycle_steps  # noqa: E402
from timing import DIMS  # noqa: E402

COPIES = {"none": None, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def use(setting):
    """Set the launch knobs for one setting (see the module doc)."""
    os.environ.pop("REPLAYSSM_STEP_HEADS_PER_CTA", None)
    os.environ.pop("REPLAYSSM_STEP_FOLD_SPLIT", None)
    os.environ.pop("REPLAYSSM_STEP_ORDER", None)
    if setting == "noorder":
        os.environ["REPLAYSSM_STEP_ORDER"] = "0"
    elif setting == "nosplit":
        os.environ["REPLAYSSM_STEP_FOLD_SPLIT"] = "0"
    elif setting != "auto":
        os.environ["REPLAYSSM_STEP_HEADS_PER_CTA"] = setting.lstrip("k")


def mean_step(s, rc, staggered):
    return statistics.mean(t for t, _ in bench_cycle_steps(s, rc, staggered))


def main():
    settings = sys.argv[1].split()
    batches = [int(b) for b in sys.argv[2].split()]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    copies = sys.argv[4].split() if len(sys.argv) > 4 else list(COPIES)
    print(f"# {torch.cuda.get_device_name()}; L = 16; staggered mean step per setting, us (slowest round)")
    print("| dims | batch | copy | lock-step auto | " + " | ".join(f"staggered {v}" for v in settings) + " |")
    print("|---|---|---|---|" + "---|" * len(settings))
    for dname, (H, P, N, G) in DIMS.items():
        for batch in batches:
            s = Setup(H, P, N, G, batch, 16)
            for label in copies:
                use("auto")
                lock = mean_step(s, COPIES[label], False)
                times = {v: [] for v in settings}
                for r in range(rounds):
                    for v in settings if r % 2 == 0 else settings[::-1]:
                        use(v)
                        times[v].append(mean_step(s, COPIES[label], True))
                use("auto")
                cells = " | ".join(f"{min(times[v]) * 1e6:.1f} ({max(times[v]) * 1e6:.1f})" for v in settings)
                print(f"| {dname} | {batch} | {label} | {lock * 1e6:.1f} | {cells} |", flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
