"""What one wave of step CTAs costs: the no-copy replay step at w = 8 (CUDA-graph replay per step, cold
L2) at batches that make exactly 1, 2, 3, 4 ... waves of whole-group CTAs, plus the batch-64 target row,
for each heads-per-CTA value given (REPLAYSSM_STEP_HEADS_PER_CTA; "auto" is the launcher's choice).
Fitting time = a + waves x b says whether a wave costs its streaming time (b ~ the wave's bytes at the
copy rate: the loss is at the kernel's start and end) or more (each wave pays its own start-up: what a
persistent grid would take back). Also prints each launch's GPU kernel time (torch.profiler), so that
the gap between back-to-back kernels shows, and the step timed without the benchmark's GPU hold
(bench/timing.py HOLD_US = 0: the method before session 25, which counted the host's graph launch).

    PYTHONPATH=. python3 scripts/wave_probe.py [--dims nano4b super120b] [--knobs auto 16] [--copy none]
    PYTHONPATH=. python3 scripts/wave_probe.py --slots-chain --batches 1 64   # with / without `slots`

Runs from the repository root; the tree it runs in comes first on the path (scripts/ab_bench.sh)."""

import argparse
import os
import sys

sys.path[0:0] = [os.getcwd(), os.path.join(os.getcwd(), "bench")]

import torch  # noqa: E402

from bench_mamba2 import ReplayPool, Setup, conventional_steps, make_inputs  # noqa: E402
import timing  # noqa: E402
from timing import DIMS, graph_kernel_times, measure_copy_bandwidth, time_graph, weights  # noqa: E402

COPIES = {"none": None, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
KNOB = "REPLAYSSM_STEP_HEADS_PER_CTA"


# CTAs per SM of the fp32-checkpoint no-copy step kernel at L = 16 (StepLayout::kCtasPerSm, from its
# shared memory: 97.8 KB at P = 80, N = 128; 75.1 KB at P = 64, N = 128).
NO_COPY_CTAS_PER_SM = {"nano4b": 2, "super120b": 3}


def step_graph(s: Setup, rc):
    """A rotating replay pool for s and the graph body that steps each of its groups once with every
    cursor at w = 8: (pool, its inputs, record, reset), reset to run before each replay."""
    pool = ReplayPool(s, rc)
    inputs = make_inputs(s, pool.k)
    return pool, inputs, (lambda: pool.record_steps(inputs)), (lambda: pool.cursors.fill_(8))


def slots_chain(dims, batches, rc) -> None:
    """The step (w = 8) and the update with `slots` (state_batch_indices, as the benchmark and engines pass
    them: a CTA loads its slot, then the slot's cursor and tiles) against the same launches without it
    (slots=None: row r is slot r of a slot-major view of the pool's group, so the cursor and the tiles
    need no load first). The difference is what the slot -> cursor chain costs a step at that batch."""
    print("| dims | batch | step, slots | step, no slots | update, slots | update, no slots |")
    print("|---|---|---|---|---|---|")
    for name in dims:
        H, P, N, G = DIMS[name]
        for batch in batches:
            s = Setup(H, P, N, G, batch, 16)
            pool, inputs, record, reset = step_graph(s, rc)
            with_slots = time_graph(record, before_replay=reset, replays=20) / pool.k

            def group(t, g):
                return None if t is None else t[g * batch:(g + 1) * batch]

            def views():  # slots=None over group g's slot-major views
                for g, (x, dt, B, C, z) in enumerate(inputs):
                    torch.ops.replayssm.mamba2_step(
                        group(pool.ck, g), group(pool.rc, g), group(pool.rs, g), group(pool.x_buf, g),
                        group(pool.B_buf, g), group(pool.dt_buf, g), group(pool.cursors, g), x, dt, pool.A, B, C,
                        pool.out, pool.D, z, pool.dt_bias, True, 1, None, -1, None, False)

            no_slots = time_graph(views, before_replay=reset, replays=20) / pool.k
            del pool
            updates, k, _ = conventional_steps(s)
            update_slots = time_graph(updates, replays=20) / k
            state = torch.randn(k * batch, H, P, N, device="cuda") * 0.1
            A, D, dt_bias = weights(s)
            uin = make_inputs(s, k)
            out = torch.empty(batch, H, P, device="cuda", dtype=s.act)

            def update_views():
                for g, (x, dt, B, C, z) in enumerate(uin):
                    torch.ops.replayssm.mamba2_update(group(state, g), x, dt, A, B, C, out, D, z, dt_bias, True,
                                                      None, -1, None)

            update_no_slots = time_graph(update_views, replays=20) / k
            del state
            print(f"| {name} | {batch} | {with_slots * 1e6:.2f} | {no_slots * 1e6:.2f} | {update_slots * 1e6:.2f} | "
                  f"{update_no_slots * 1e6:.2f} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", nargs="*", default=list(DIMS))
    parser.add_argument("--knobs", nargs="*", default=["auto", "16"])
    parser.add_argument("--copy", choices=list(COPIES), default="none")
    parser.add_argument("--ctas-per-sm", type=int, default=0,
                        help="the step kernel's CTAs per SM (default: NO_COPY_CTAS_PER_SM, right for --copy none)")
    parser.add_argument("--extra-batches", nargs="*", type=int, default=[64])
    parser.add_argument("--max-waves", type=int, default=4)
    parser.add_argument("--slots-chain", action="store_true", help="only the with / without `slots` table")
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 64], help="--slots-chain's batches")
    args = parser.parse_args()
    rc = COPIES[args.copy]
    if args.slots_chain:
        print(f"# {torch.cuda.get_device_name()}; w = 8 of L = 16, {args.copy} copy, bf16 activations, z gate; "
              f"GPU hold {timing.HOLD_US:.0f} us; us per step")
        slots_chain(args.dims, args.batches, rc)
        return 0
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy_bw = measure_copy_bandwidth()
    copy_bw_no_hold = measure_copy_bandwidth(hold_us=0.0)
    print(f"# {torch.cuda.get_device_name()}, {sms} SMs; copy {copy_bw / 1e12:.3f} TB/s ({copy_bw_no_hold / 1e12:.3f} "
          f"without the hold); step at w = 8 of L = 16, {args.copy} copy, bf16 activations, z gate; GPU hold "
          f"{timing.HOLD_US:.0f} us")
    print("| dims | knob | batch | whole-group waves | step us | step us, no hold | kernel us | GB/s | % of copy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.dims:
        H, P, N, G = DIMS[name]
        ctas_per_sm = args.ctas_per_sm or NO_COPY_CTAS_PER_SM[name]
        per_wave = sms * ctas_per_sm // G   # batch rows whose whole-group CTAs fill one wave
        batches = sorted(set([per_wave * k for k in range(1, args.max_waves + 1)] + args.extra_batches))
        for knob in args.knobs:
            if knob == "auto":
                os.environ.pop(KNOB, None)
            else:
                os.environ[KNOB] = knob
            for batch in batches:
                s = Setup(H, P, N, G, batch, 16)
                pool, _, record, reset = step_graph(s, rc)
                t = time_graph(record, before_replay=reset, replays=20) / pool.k
                t_no_hold = time_graph(record, before_replay=reset, replays=20, hold_us=0.0) / pool.k
                kt = graph_kernel_times(record, before_replay=reset)
                kernel = sum(v for k, v in kt.items() if k != "(replay)") / pool.k
                nbytes = pool.step_bytes(8)
                print(f"| {name} | {knob} | {batch} | {batch * G / (sms * ctas_per_sm):.2f} | {t * 1e6:.1f} | "
                      f"{t_no_hold * 1e6:.1f} | {kernel * 1e6:.1f} | {nbytes / t / 1e9:.0f} | "
                      f"{100 * nbytes / t / copy_bw:.1f}% |", flush=True)
                del pool
    os.environ.pop(KNOB, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
