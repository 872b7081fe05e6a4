"""Host cost of eager launches: microseconds of CPU time per call of the compiled ops, at batch 1.

At batch 1 a decode step's kernel runs for a few microseconds, so what the host spends per call (the
dispatcher, argument checks, the launcher's runtime queries, the launch itself) decides whether an
eager (not graph-captured) decode loop keeps the GPU busy. This measures that host time and not the
GPU's: `calls` calls are enqueued back to back with no synchronisation between them (the GPU runs behind
the host; 200 launches stay well inside the runtime's launch queue), the wall time of the loop divided
by `calls`, median over `repeats` loops after a warm-up. The GPU is synchronised only between loops,
outside the timed region.

Rows: the torch.ops.replayssm ops (the C++ path: checks, params, launcher, launch) and, for the step,
the Python wrapper replayssm_cuda.ops.mamba2_step(backend="cuda") on top of it; the baseline is an
in-place torch add of two 1-element tensors (the cheapest dispatcher call that launches a kernel), in
the same run. The flush row times the fold kernel's launcher (mamba2_flush, at cursor 0 after the
first call: the launch costs the same). No byte model: nothing here is bandwidth.

    python bench/bench_launch_overhead.py                      # nano4b dims, batch 1, L = 16, T = 4
    python bench/bench_launch_overhead.py --dims nano4b super120b --batches 1 8 --calls 200 --repeats 21
    REPLAYSSM_BENCHES=launch_overhead bench/run_all.sh         # same arguments as the other benchmarks

Run it on two builds (e.g. before and after a launcher change) on the same machine to compare them; the
host CPU's speed sets these figures as much as the code does.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from timing import DIMS, weights  # bench/, the script's folder

from replayssm_cuda import _extension, ops


def host_us_per_call(call, calls: int, repeats: int, warmup: int = 20) -> float:
    """Median over `repeats` loops of the host wall time of `calls` back-to-back calls, in us per call."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        per_call.append((time.perf_counter() - start) / calls)
        torch.cuda.synchronize()
    return statistics.median(per_call) * 1e6


def make_cases(H, P, N, G, batch, L, T, act=torch.bfloat16):
    """(label, op name, callable) of every launch timed; each callable enqueues one call."""
    dev = "cuda"
    A, D, dt_bias = weights(SimpleNamespace(H=H))
    slots = torch.arange(batch, device=dev, dtype=torch.int32)

    # Conventional update: fp32 state, no stochastic rounding.
    state = torch.randn(batch, H, P, N, device=dev) * 0.1
    x1 = torch.randn(batch, H, P, device=dev).to(act)
    dt1 = (0.5 * torch.randn(batch, H, device=dev)).to(act)
    B1 = torch.randn(batch, G, N, device=dev).to(act)
    C1 = torch.randn(batch, G, N, device=dev).to(act)
    z1 = torch.randn(batch, H, P, device=dev).to(act)
    out1 = torch.empty(batch, H, P, device=dev, dtype=act)

    # Replay cache: fp32 checkpoint, no read copy, buffer of L entries, cursors at 0.
    ck = torch.randn(batch, H, P, N, device=dev) * 0.1
    x_buf = torch.randn(batch, H, L, P, device=dev).to(act)
    B_buf = torch.randn(batch, G, L, N, device=dev).to(act)
    dt_buf = torch.rand(batch, H, L, device=dev) * 0.1
    cursors = torch.zeros(batch, dtype=torch.int32, device=dev)
    stepped = torch.zeros_like(cursors)  # the step's own cursors: it moves them (and folds every L steps)

    # Verify of T drafts (reads the cursors, never moves them: every call is the same launch).
    xT = torch.randn(batch, T, H, P, device=dev).to(act)
    dtT = (0.5 * torch.randn(batch, T, H, device=dev)).to(act)
    BT = torch.randn(batch, T, G, N, device=dev).to(act)
    CT = torch.randn(batch, T, G, N, device=dev).to(act)
    zT = torch.randn(batch, T, H, P, device=dev).to(act)
    outT = torch.empty(batch, T, H, P, device=dev, dtype=act)

    a = torch.zeros(1, device=dev)
    b = torch.ones(1, device=dev)
    rep = torch.ops.replayssm

    return [
        ("baseline: torch add_ of 1-element tensors", None, lambda: a.add_(b)),
        ("mamba2_update (torch.ops)", "mamba2_update",
         lambda: rep.mamba2_update(state, x1, dt1, A, B1, C1, out1, D, z1, dt_bias, True, slots, -1, None)),
        ("mamba2_step (torch.ops)", "mamba2_step",
         lambda: rep.mamba2_step(ck, None, None, x_buf, B_buf, dt_buf, stepped, x1, dt1, A, B1, C1, out1, D, z1,
                                 dt_bias, True, 1, slots, -1, None)),
        ("mamba2_step (replayssm_cuda.ops, backend='cuda')", "mamba2_step",
         lambda: ops.mamba2_step(ck, None, None, x_buf, B_buf, dt_buf, stepped, x1, dt1, A, B1, C1, out1, D, z1,
                                 dt_bias, True, 1, slots, -1, None, backend="cuda")),
        (f"mamba2_verify T={T} (torch.ops)", "mamba2_verify",
         lambda: rep.mamba2_verify(ck, None, None, x_buf, B_buf, dt_buf, cursors, xT, dtT, A, BT, CT, outT, D, zT,
                                   dt_bias, True, slots, -1)),
        ("mamba2_flush, the fold kernel (torch.ops)", "mamba2_flush",
         lambda: rep.mamba2_flush(ck, None, None, x_buf, B_buf, dt_buf, cursors, A, slots, -1, None)),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", nargs="*", default=["nano4b"], choices=list(DIMS))
    parser.add_argument("--batches", nargs="*", type=int, default=[1])
    parser.add_argument("--buffer-len", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=4, help="draft tokens of the verify call (T)")
    parser.add_argument("--calls", type=int, default=200, help="calls enqueued per timed loop")
    parser.add_argument("--repeats", type=int, default=21, help="timed loops; the median is reported")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_launch_overhead: skipped: needs a CUDA GPU")
        return 0
    if not _extension.is_compiled():
        print(f"bench_launch_overhead: skipped: {_extension.load_error()}")
        return 0
    torch.manual_seed(0)
    cmd = " ".join(["python bench/bench_launch_overhead.py", "--dims", *args.dims,
                    "--batches", *map(str, args.batches), f"--buffer-len {args.buffer_len}",
                    f"--tokens {args.tokens}", f"--calls {args.calls}", f"--repeats {args.repeats}"])
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; L = {args.buffer_len}; bf16 activations, "
          f"fp32 state / checkpoint, no read copy; host wall time of {args.calls} back-to-back eager calls, "
          f"median of {args.repeats}")
    print(f"# {cmd}")
    print("| dims | batch | call | host us/call | x baseline |")
    print("|---|---|---|---|---|")
    for dname in args.dims:
        H, P, N, G = DIMS[dname]
        for batch in args.batches:
            baseline = None
            for label, op, call in make_cases(H, P, N, G, batch, args.buffer_len, args.tokens):
                if op is not None and not _extension.has_op(op):
                    print(f"| {dname} | {batch} | {label} | skipped: {ops.why_not_compiled(op)} | |")
                    continue
                us = host_us_per_call(call, args.calls, args.repeats)
                baseline = us if baseline is None else baseline
                print(f"| {dname} | {batch} | {label} | {us:.2f} | {us / baseline:.1f}x |", flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
