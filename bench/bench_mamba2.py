"""Mamba-2 decode benchmark on one GPU: our conventional update vs the ReplaySSM step.

Method (docs/DESIGN.md section 13): every timed region is a CUDA-graph replay; state pools rotate over enough
slot groups that each step touches slots the previous steps did not (well over 4 x 60 MB of state,
so L2 is cold); replay figures cover whole L-step cycles, fold steps included; medians of repeated
replays, each queued behind a spinning kernel so that the host's launch is not timed (timing.HOLD_US).
The device-to-device copy bandwidth is measured in the same run, the same way, and every figure is also
given as a fraction of it.

Byte model (per batch row; H heads, G groups, P x N state, L buffer length, w = cursor before the step):
    inputs / outputs   x, z, out: 3 H P a;  B, C: 2 G N a;  dt: H a            (a = activation bytes)
    conventional       read + write the state: 2 H P N s                      (s = checkpoint bytes)
    replay step        read the read copy (or checkpoint): H P N r (+ its fp8 scales: 4 H P [fp8]);
                       read w buffer entries and append one: (w + 1) (H P a + G N a + 4 H)
    fold step          read + write the checkpoint, write the read copy (+ fp8 scales):
                       H P N (2 s + r) + 4 H P [fp8];  read w entries: w (H P a + G N a + 4 H)
A cycle is L steps: w = 0 .. L-1 with the fold at w = L - max_draft_tokens (here L - 1). With a staggered
flush (stagger_cursors), row r's slot is at w = (slot % L + c) % L in step c of a cycle: each step folds
about batch / L rows, and the bytes of a step are the mean of the per-row model over its rows.

    python bench/bench_mamba2.py                       # full table
    python bench/bench_mamba2.py --batches 256 --dims nano4b
    python bench/bench_mamba2.py --no-stagger          # without the per-step lock-step / staggered rows
    python bench/bench_mamba2.py --stochastic-rounding # only: bf16 / fp16 checkpoints, round-to-nearest
                                                       # vs stochastic rounding (same byte model, s = 2)
    python bench/bench_mamba2.py --update-only         # only the conventional update rows
    python bench/bench_mamba2.py --update-only --update-stages 0 2 4
                                                       # one update row per REPLAYSSM_UPDATE_STAGES value
                                                       # (0: the launcher's choice)
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import torch

from timing import DIMS, cold_groups, measure_copy_bandwidth, time_graph, weights  # bench/, the script's folder

from replayssm_cuda import ops



@dataclass
class Setup:
    H: int
    P: int
    N: int
    G: int
    batch: int
    L: int
    act: torch.dtype = torch.bfloat16

    @property
    def state_elems(self):
        return self.H * self.P * self.N

    def io_bytes(self):
        a = torch.finfo(self.act).bits // 8
        return self.batch * (3 * self.H * self.P * a + 2 * self.G * self.N * a + self.H * a)

    def entry_bytes(self):
        a = torch.finfo(self.act).bits // 8
        return self.batch * (self.H * self.P * a + self.G * self.N * a + 4 * self.H)

    def groups(self, bytes_per_slot):
        """Slot groups to rotate over so the state touched is well over L2 (at least 2 groups)."""
        return cold_groups(self.batch, bytes_per_slot)


def make_inputs(s: Setup, steps: int):
    """Distinct random inputs for every step of a graph (never zeros)."""
    out = []
    for _ in range(steps):
        x = torch.randn(s.batch, s.H, s.P, device="cuda").to(s.act)
        dt = (0.5 * torch.randn(s.batch, s.H, device="cuda")).to(s.act)
        B = torch.randn(s.batch, s.G, s.N, device="cuda").to(s.act)
        C = torch.randn(s.batch, s.G, s.N, device="cuda").to(s.act)
        z = torch.randn(s.batch, s.H, s.P, device="cuda").to(s.act)
        out.append((x, dt, B, C, z))
    return out


def conventional_steps(s: Setup, state_dtype=torch.float32, rounding=False):
    """The conventional update over a rotating pool (fp32 state unless given; `rounding`: stochastic
    rounding of a 16-bit state, its offset launch included): (record, the steps one record launches, the
    bytes one step moves). record() launches one mamba2_update per slot group."""
    s_bytes = torch.finfo(state_dtype).bits // 8
    k = s.groups(s.state_elems * s_bytes)
    state = (torch.randn(k * s.batch, s.H, s.P, s.N, device="cuda") * 0.1).to(state_dtype)
    seed = torch.tensor([1, 0], dtype=torch.int64, device="cuda") if rounding else None
    A, D, dt_bias = weights(s)
    inputs = make_inputs(s, k)
    slots = [torch.arange(g * s.batch, (g + 1) * s.batch, device="cuda", dtype=torch.int32) for g in range(k)]
    out = torch.empty(s.batch, s.H, s.P, device="cuda", dtype=s.act)

    def steps():
        for g in range(k):
            x, dt, B, C, z = inputs[g]
            torch.ops.replayssm.mamba2_update(state, x, dt, A, B, C, out, D, z, dt_bias, True, slots[g], -1, seed)

    return steps, k, s.batch * 2 * s.state_elems * s_bytes + s.io_bytes()


def bench_conventional(s: Setup, state_dtype=torch.float32, rounding=False):
    """Seconds per step of mamba2_update (arguments as conventional_steps) and the bytes it moves per step."""
    steps, k, nbytes = conventional_steps(s, state_dtype, rounding)
    return time_graph(steps) / k, nbytes


class ReplayPool:
    """A rotating pool of replay caches (fp32 checkpoint unless given, optional read copy; `rounding`:
    stochastic rounding of a 16-bit checkpoint) for one setup: k slot groups of `batch` slots, random
    checkpoints and full random buffers, and the step launch (`staggered_flush`: the op's hint that the
    slots fold at different steps, as Mamba2Cache(staggered_flush=True) passes it)."""

    def __init__(self, s: Setup, read_copy_dtype, checkpoint_dtype=torch.float32, rounding=False,
                 staggered_flush=False):
        self.s, self.rc_dtype, self.staggered_flush = s, read_copy_dtype, staggered_flush
        self.c_bytes = torch.finfo(checkpoint_dtype).bits // 8
        self.r_bytes = self.c_bytes if read_copy_dtype is None else torch.finfo(read_copy_dtype).bits // 8
        self.k = k = s.groups(s.state_elems * self.c_bytes)
        S = k * s.batch
        self.ck = (torch.randn(S, s.H, s.P, s.N, device="cuda") * 0.1).to(checkpoint_dtype)
        self.seed = torch.tensor([1, 0], dtype=torch.int64, device="cuda") if rounding else None
        self.rc = self.rs = None
        if read_copy_dtype is not None:
            self.rc = torch.empty(S, s.H, s.P, s.N, device="cuda", dtype=read_copy_dtype)
            fp8 = read_copy_dtype == torch.float8_e4m3fn
            self.rs = torch.empty(S, s.H, s.P, device="cuda") if fp8 else None
            ops.make_read_copy(self.ck, self.rc, self.rs, backend="cuda")
        self.x_buf = torch.randn(S, s.H, s.L, s.P, device="cuda").to(s.act)
        self.B_buf = torch.randn(S, s.G, s.L, s.N, device="cuda").to(s.act)
        self.dt_buf = torch.rand(S, s.H, s.L, device="cuda") * 0.1
        self.cursors = torch.zeros(S, dtype=torch.int32, device="cuda")
        self.A, self.D, self.dt_bias = weights(s)
        self.slots = [torch.arange(g * s.batch, (g + 1) * s.batch, device="cuda", dtype=torch.int32)
                      for g in range(k)]
        self.out = torch.empty(s.batch, s.H, s.P, device="cuda", dtype=s.act)

    def record_steps(self, inputs):
        """One mamba2_step per input set, slot group i % k for the i-th."""
        for i, (x, dt, B, C, z) in enumerate(inputs):
            torch.ops.replayssm.mamba2_step(self.ck, self.rc, self.rs, self.x_buf, self.B_buf, self.dt_buf,
                                            self.cursors, x, dt, self.A, B, C, self.out, self.D, z, self.dt_bias,
                                            True, 1, self.slots[i % self.k], -1, self.seed, self.staggered_flush)

    def step_bytes(self, w):
        """Bytes one step at cursor w moves for the whole batch (the byte model in the module doc)."""
        s, fold = self.s, w + 1 >= self.s.L
        fp8 = self.rc_dtype == torch.float8_e4m3fn
        ck_rw = 2 * self.c_bytes   # a fold reads and writes the checkpoint
        per_elem = (ck_rw + self.r_bytes) if fold and self.rc is not None else ck_rw if fold else self.r_bytes
        scales = 4 * s.batch * s.H * s.P if fp8 else 0   # a fold writes them, a replay step reads them
        entries = w if fold else w + 1
        return s.batch * s.state_elems * per_elem + scales + entries * s.entry_bytes() + s.io_bytes()


def bench_replay(s: Setup, read_copy_dtype, phase=None, checkpoint_dtype=torch.float32, rounding=False):
    """Seconds per step of mamba2_step (fp32 checkpoint unless given; `rounding`: stochastic rounding of
    a 16-bit one) over whole L-step cycles (phase None), or of steps at one cursor position (phase = w,
    cursors reset before every replay). Returns (s, bytes)."""
    pool = ReplayPool(s, read_copy_dtype, checkpoint_dtype, rounding)
    per_graph = pool.k * (s.L if phase is None else 1)
    inputs = make_inputs(s, per_graph)
    reset = None if phase is None else (lambda: pool.cursors.fill_(phase))
    t = time_graph(lambda: pool.record_steps(inputs), before_replay=reset) / per_graph
    ws = range(s.L) if phase is None else [phase]
    return t, sum(pool.step_bytes(w) for w in ws) / len(ws)


def bench_cycle_steps(s: Setup, read_copy_dtype, staggered: bool):
    """Seconds and bytes of each of the L steps of a cycle, every row's cursor set before each replay to
    where that step finds it: lock-step, all rows at w = c for step c (they all fold at c = L - 1); or
    staggered, slot s at (s % L + c) % L, the phases stagger_cursors (Mamba2Cache(staggered_flush=True))
    gives, so about batch / L rows fold at every step; the staggered steps pass the op's staggered_flush
    hint, as the cache does. Returns [(seconds, bytes)] for c = 0 .. L-1."""
    pool = ReplayPool(s, read_copy_dtype, staggered_flush=staggered)
    phase = torch.zeros_like(pool.cursors)
    if staggered:
        ops.stagger_cursors([], phase, s.L, backend="cuda")      # slot % L, by the op the cache uses
    inputs = make_inputs(s, pool.k)
    slot_phase = phase.cpu()                                   # every slot of the pool is stepped once
    result = []
    for c in range(s.L):
        start = (phase + c) % s.L
        t = time_graph(lambda: pool.record_steps(inputs), before_replay=lambda: pool.cursors.copy_(start)) / pool.k
        ws = ((slot_phase + c) % s.L).tolist()
        nbytes = sum(pool.step_bytes(w) for w in ws) / len(ws)   # mean over rows of the per-row model
        result.append((t, nbytes))
    return result


def replay_rows(s: Setup, stagger: bool):
    """The replay rows of the main table for one setup: [(label, seconds, bytes)]."""
    rows = []
    for label, rc in [("replay cycle, no copy", None), ("replay cycle, bf16 copy", torch.bfloat16),
                      ("replay cycle, fp8 copy", torch.float8_e4m3fn)]:
        t, b = bench_replay(s, rc)
        rows.append((label, t, b))
    # The two kinds of step a cycle is made of, per source: where a cycle's time goes.
    for rc_label, rc in [("no copy", None), ("bf16 copy", torch.bfloat16), ("fp8 copy", torch.float8_e4m3fn)]:
        t, b = bench_replay(s, rc, phase=s.L // 2)
        rows.append((f"replay step at w={s.L // 2} (no fold), {rc_label}", t, b))
        t, b = bench_replay(s, rc, phase=s.L - 1)
        rows.append((f"fold step (all rows), {rc_label}", t, b))
    if stagger:
        for rc_label, rc in [("no copy", None), ("bf16 copy", torch.bfloat16), ("fp8 copy", torch.float8_e4m3fn)]:
            for kind, staggered in [("lock-step", False), ("staggered", True)]:
                steps = bench_cycle_steps(s, rc, staggered)
                mean = sum(t for t, _ in steps) / len(steps)
                t_max, b_max = max(steps)
                rows.append((f"{kind} cycle, {rc_label}: mean step", mean, sum(b for _, b in steps) / len(steps)))
                rows.append((f"{kind} cycle, {rc_label}: slowest step = {t_max / mean:.2f}x mean", t_max, b_max))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", nargs="*", default=list(DIMS))
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 8, 32, 64, 128, 256, 512])
    parser.add_argument("--buffer-len", type=int, default=16)
    parser.add_argument("--stagger", action=argparse.BooleanOptionalAction, default=True,
                        help="time every step of lock-step and staggered-flush cycles (slowest vs mean)")
    parser.add_argument("--stochastic-rounding", action="store_true",
                        help="instead of the main table: the cost of stochastic rounding of bf16 / fp16 checkpoints")
    parser.add_argument("--update-only", action="store_true",
                        help="only the conventional update rows (no replay rows)")
    parser.add_argument("--update-stages", nargs="*", type=int, default=[],
                        help="time the update once per value of REPLAYSSM_UPDATE_STAGES (0: the launcher's choice); "
                             "each row is labelled with it")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_mamba2: needs a CUDA GPU", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    name = torch.cuda.get_device_name()
    bw = measure_copy_bandwidth()
    if args.stochastic_rounding:
        return rounding_table(args, name, bw)
    print(f"# {name}; device-to-device copy: {bw / 1e12:.2f} TB/s (read + write); L = {args.buffer_len}; "
          f"bf16 activations, z gate, D, dt_bias, softplus; fp32 checkpoint; CUDA-graph replay, cold L2, medians")
    print("| dims | batch | kernel | us/step | GB/s | % copy BW | speedup vs conventional |")
    print("|---|---|---|---|---|---|---|")
    for dname in args.dims:
        H, P, N, G = DIMS[dname]
        for batch in args.batches:
            s = Setup(H, P, N, G, batch, args.buffer_len)
            t_conv, b_conv = bench_conventional(s)
            rows = [("conventional update", t_conv, b_conv)]
            for stages in args.update_stages:
                if stages > 0:
                    os.environ["REPLAYSSM_UPDATE_STAGES"] = str(stages)   # read by the launcher at capture
                else:
                    os.environ.pop("REPLAYSSM_UPDATE_STAGES", None)
                t, b = bench_conventional(s)
                rows.append((f"conventional update, stages = {stages or 'auto'}", t, b))
            if args.update_stages:
                os.environ.pop("REPLAYSSM_UPDATE_STAGES", None)
            if not args.update_only:
                rows += replay_rows(s, args.stagger)
            for label, t, b in rows:
                print(f"| {dname} | {batch} | {label} | {t * 1e6:.1f} | {b / t / 1e9:.0f} | "
                      f"{100 * b / t / bw:.1f} | {t_conv / t:.2f}x |", flush=True)
            torch.cuda.empty_cache()
    return 0


def rounding_table(args, name, bw) -> int:
    """Round-to-nearest vs stochastic rounding of 16-bit checkpoints, side by side: the conventional
    update (which rounds every step), the whole replay cycle and the fold step (which round once per
    cycle). Same byte model as the main table with 2-byte checkpoints; the SR rows include the launch
    that advances the offset (update, step)."""
    print(f"# {name}; device-to-device copy: {bw / 1e12:.2f} TB/s; L = {args.buffer_len}; bf16 activations; "
          f"no read copy; CUDA-graph replay, cold L2, medians; SR = stochastic rounding (Philox4x32-10)")
    print("| dims | batch | checkpoint | kernel | RNE us | SR us | SR cost | SR % copy BW |")
    print("|---|---|---|---|---|---|---|---|")
    for dname in args.dims:
        H, P, N, G = DIMS[dname]
        for batch in args.batches:
            s = Setup(H, P, N, G, batch, args.buffer_len)
            for ck in (torch.bfloat16, torch.float16):
                cases = [("conventional update", lambda r: bench_conventional(s, ck, r)),
                         ("replay cycle", lambda r: bench_replay(s, None, None, ck, r)),
                         ("fold step (all rows)", lambda r: bench_replay(s, None, s.L - 1, ck, r))]
                for label, run in cases:
                    t_rne, _ = run(False)
                    t_sr, b = run(True)
                    print(f"| {dname} | {batch} | {str(ck).replace('torch.', '')} | {label} | {t_rne * 1e6:.1f} | "
                          f"{t_sr * 1e6:.1f} | {100 * (t_sr / t_rne - 1):+.1f}% | {100 * b / t_sr / bw:.1f} |",
                          flush=True)
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
