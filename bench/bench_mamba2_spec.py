"""Mamba-2 speculative decoding benchmark on one GPU: the conventional T-token snapshot step (what engines
run today) vs the ReplaySSM verify(T) + commit, in lock-step rounds.

    (a) conventional   mamba2_update_snapshots: T tokens per row from the state, one state snapshot per
                       token written (the engine keeps the accepted snapshot and reads it next round, so
                       no further copy), outputs for all T tokens.
    (b) replay         Mamba2Cache-style verify(T) then commit(num_accepted) per round (backend="cuda"),
                       num_accepted random in [1, T] per row, drawn on the device before every graph
                       replay (outside the timed region). Rows are skipped, with the reason, when this
                       build has no compiled mamba2_verify / mamba2_commit: the reference is never timed.

Method (docs/DESIGN.md section 13): every timed region is a CUDA-graph replay of one round per slot group;
state pools (and the snapshot buffers of (a)) rotate over enough groups that the bytes touched between
two visits of a group are well over 4 x 60 MB of L2; medians of repeated replays. The device-to-device
copy bandwidth is measured in the same run and every (a) figure is also given as a fraction of it.

Byte model of (a), per batch row (H heads, G groups, P x N state, s = state bytes, a = activation bytes):
    state       read once, T snapshots written:  (1 + T) H P N s
    inputs      x, z, out: 3 T H P a;  B, C: 2 T G N a;  dt: T H a
Tokens per round: both schemes keep the same num_accepted tokens per row (mean (T + 1) / 2), so
tokens/s = batch * (T + 1) / 2 / (seconds per round) and (b)/(a) is the ratio of round times.

    python bench/bench_mamba2_spec.py                       # full table
    python bench/bench_mamba2_spec.py --batches 256 512 --dims nano4b
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch

from timing import (DIMS, cold_groups, graph_kernel_times, measure_copy_bandwidth,  # bench/, the script's folder
                    time_graph, weights)

from replayssm_cuda import _extension, ops

REPLAY_OPS = ("mamba2_verify", "mamba2_commit")


@dataclass
class Setup:
    H: int
    P: int
    N: int
    G: int
    batch: int
    T: int
    L: int
    act: torch.dtype = torch.bfloat16

    @property
    def state_elems(self):
        return self.H * self.P * self.N

    def io_bytes(self):
        a = torch.finfo(self.act).bits // 8
        return self.batch * self.T * (3 * self.H * self.P * a + 2 * self.G * self.N * a + self.H * a)

    def groups(self, bytes_per_row):
        """Slot groups to rotate over so the bytes touched are well over L2 (at least 2 groups)."""
        return cold_groups(self.batch, bytes_per_row)

    def tokens_per_round(self):
        return self.batch * (self.T + 1) / 2


def make_inputs(s: Setup, rounds: int):
    """Distinct random (x, dt, B, C, z) of T tokens per row for every round of a graph (never zeros)."""
    out = []
    lead = (s.batch, s.T)
    for _ in range(rounds):
        x = torch.randn(*lead, s.H, s.P, device="cuda").to(s.act)
        dt = (0.5 * torch.randn(*lead, s.H, device="cuda")).to(s.act)
        B = torch.randn(*lead, s.G, s.N, device="cuda").to(s.act)
        C = torch.randn(*lead, s.G, s.N, device="cuda").to(s.act)
        z = torch.randn(*lead, s.H, s.P, device="cuda").to(s.act)
        out.append((x, dt, B, C, z))
    return out


def bench_snapshots(s: Setup):
    """Seconds per round of mamba2_update_snapshots (fp32 state) and the bytes it moves per round."""
    row_bytes = (1 + s.T) * s.state_elems * 4
    k = s.groups(row_bytes)
    state = torch.randn(k * s.batch, s.H, s.P, s.N, device="cuda") * 0.1
    A, D, dt_bias = weights(s)
    inputs = make_inputs(s, k)
    slots = [torch.arange(g * s.batch, (g + 1) * s.batch, device="cuda", dtype=torch.int32) for g in range(k)]
    # One snapshot buffer per group, poisoned: the kernel must overwrite every element it reports.
    snaps = [torch.full((s.batch, s.T, s.H, s.P, s.N), float("nan"), device="cuda") for _ in range(k)]
    out = torch.empty(s.batch, s.T, s.H, s.P, device="cuda", dtype=s.act)

    def rounds():
        for g in range(k):
            x, dt, B, C, z = inputs[g]
            torch.ops.replayssm.mamba2_update_snapshots(state, x, dt, A, B, C, out, snaps[g], D, z, dt_bias, True,
                                                        slots[g], -1)

    t = time_graph(rounds) / k
    if torch.isnan(snaps[0][0, -1, 0, 0, 0]).item():
        raise RuntimeError("bench_mamba2_spec: the snapshot kernel left its output unwritten")
    return t, s.batch * row_bytes + s.io_bytes()


def replay_skip_reason() -> str | None:
    missing = [name for name in REPLAY_OPS if not _extension.has_op(name)]
    if not missing:
        return None
    return f"{', '.join(missing)} not compiled in this build ({ops.why_not_compiled(missing[0])})"


def bench_verify_commit(s: Setup, read_copy_dtype, breakdown=False, trace=None):
    """Seconds per lock-step round of verify(T) + commit(num_accepted) on an fp32 checkpoint; with
    breakdown, also (verify alone, commit alone): the same rounds with one op captured, timed after the
    whole rounds so the cursors are spread as in them (commit alone moves them as it does there).
    trace: a label; prints each graph's GPU time per kernel and round (graph_kernel_times) after its
    timing, to see where a round differs from verify alone + commit alone."""
    k = s.groups(s.state_elems * 4)
    S = k * s.batch
    ck = torch.randn(S, s.H, s.P, s.N, device="cuda") * 0.1
    rc = rs = None
    if read_copy_dtype is not None:
        rc = torch.empty(S, s.H, s.P, s.N, device="cuda", dtype=read_copy_dtype)
        rs = torch.empty(S, s.H, s.P, device="cuda") if read_copy_dtype == torch.float8_e4m3fn else None
        ops.make_read_copy(ck, rc, rs, backend="cuda")
    x_buf = torch.randn(S, s.H, s.L, s.P, device="cuda").to(s.act)
    B_buf = torch.randn(S, s.G, s.L, s.N, device="cuda").to(s.act)
    dt_buf = torch.rand(S, s.H, s.L, device="cuda") * 0.1
    cursors = torch.zeros(S, dtype=torch.int32, device="cuda")
    A, D, dt_bias = weights(s)
    inputs = make_inputs(s, k)
    slots = [torch.arange(g * s.batch, (g + 1) * s.batch, device="cuda", dtype=torch.int32) for g in range(k)]
    accepted = [torch.ones(s.batch, dtype=torch.int32, device="cuda") for _ in range(k)]
    out = torch.empty(s.batch, s.T, s.H, s.P, device="cuda", dtype=s.act)
    cache = (ck, rc, rs, x_buf, B_buf, dt_buf, cursors)

    def rounds():
        for g in range(k):
            x, dt, B, C, z = inputs[g]
            ops.mamba2_verify(*cache, x, dt, A, B, C, out, D, z, dt_bias, True, slots[g], -1, backend="cuda")
            ops.mamba2_commit(*cache, accepted[g], A, s.T, slots[g], -1, backend="cuda")

    def draw_acceptance():
        for acc in accepted:
            acc.random_(1, s.T + 1)

    def show_trace(what, record, before_replay=None):
        if trace is not None:
            kernels = graph_kernel_times(record, before_replay=before_replay)
            replay = kernels.pop("(replay)")
            parts = ", ".join(f"{name} {t / k * 1e6:.1f}" for name, t in sorted(kernels.items()))
            total = sum(kernels.values())
            print(f"# trace {trace}, {what}, us per round: {parts}; kernels {total / k * 1e6:.1f}, "
                  f"replay {replay / k * 1e6:.1f}", flush=True)

    whole = time_graph(rounds, before_replay=draw_acceptance) / k
    show_trace("verify + commit", rounds, draw_acceptance)
    if not breakdown:
        return whole

    def commits():
        for g in range(k):
            ops.mamba2_commit(*cache, accepted[g], A, s.T, slots[g], -1, backend="cuda")

    def verifies():
        for g in range(k):
            x, dt, B, C, z = inputs[g]
            ops.mamba2_verify(*cache, x, dt, A, B, C, out, D, z, dt_bias, True, slots[g], -1, backend="cuda")

    commit_only = time_graph(commits, before_replay=draw_acceptance) / k
    show_trace("commit alone", commits, draw_acceptance)
    verify_only = time_graph(verifies) / k
    show_trace("verify alone", verifies)
    return whole, verify_only, commit_only


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", nargs="*", default=list(DIMS))
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 8, 32, 64, 128, 256, 512])
    parser.add_argument("--tokens", type=int, default=4, help="draft tokens verified per round (T)")
    parser.add_argument("--buffer-len", type=int, default=16, help="ReplaySSM buffer length L of (b)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time verify alone and commit alone (verify's % copy BW: its state read + inputs)")
    parser.add_argument("--trace", action="store_true",
                        help="also print each graph's GPU time per kernel (torch.profiler), as '# trace' lines")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_mamba2_spec: needs a CUDA GPU", file=sys.stderr)
        return 1
    if not _extension.has_op("mamba2_update_snapshots"):
        print(f"bench_mamba2_spec: {ops.why_not_compiled('mamba2_update_snapshots')}", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    name = torch.cuda.get_device_name()
    bw = measure_copy_bandwidth()
    skip = replay_skip_reason()
    print(f"# {name}; device-to-device copy: {bw / 1e12:.2f} TB/s (read + write); T = {args.tokens} tokens per "
          f"round, num_accepted uniform in [1, {args.tokens}]; L = {args.buffer_len} for (b); bf16 activations, "
          f"z gate, D, dt_bias, softplus; fp32 state / checkpoint; CUDA-graph replay, cold L2, medians")
    if skip is not None:
        print(f"# (b) rows skipped: {skip}")
    print("| dims | batch | scheme | us/round | GB/s | % copy BW | tokens/s | (b)/(a) |")
    print("|---|---|---|---|---|---|---|---|")
    for dname in args.dims:
        H, P, N, G = DIMS[dname]
        for batch in args.batches:
            s = Setup(H, P, N, G, batch, args.tokens, args.buffer_len)
            t_a, b_a = bench_snapshots(s)
            print(f"| {dname} | {batch} | (a) conventional T={s.T} snapshot step | {t_a * 1e6:.1f} | "
                  f"{b_a / t_a / 1e9:.0f} | {100 * b_a / t_a / bw:.1f} | {s.tokens_per_round() / t_a:.3g} | 1.00x |",
                  flush=True)
            torch.cuda.empty_cache()
            for label, rc in [("no copy", None), ("bf16 copy", torch.bfloat16)]:
                if skip is not None:
                    print(f"| {dname} | {batch} | (b) replay verify(T={s.T}) + commit, {label} | skipped | | | | |")
                    continue
                trace = f"{dname} b{batch} {label}" if args.trace else None
                t_b = bench_verify_commit(s, rc, args.breakdown, trace)
                if args.breakdown:
                    t_b, t_v, t_c = t_b
                print(f"| {dname} | {batch} | (b) replay verify(T={s.T}) + commit, {label} | {t_b * 1e6:.1f} | | | "
                      f"{s.tokens_per_round() / t_b:.3g} | {t_a / t_b:.2f}x |", flush=True)
                if args.breakdown:
                    # verify's byte model: the read state once (no fold) + the drafts' inputs and outputs
                    b_v = s.batch * s.state_elems * (4 if rc is None else torch.finfo(rc).bits // 8) + s.io_bytes()
                    print(f"| {dname} | {batch} | (b) verify alone, {label} | {t_v * 1e6:.1f} | {b_v / t_v / 1e9:.0f} | "
                          f"{100 * b_v / t_v / bw:.1f} | | |", flush=True)
                    print(f"| {dname} | {batch} | (b) commit alone, {label} | {t_c * 1e6:.1f} | | | | |", flush=True)
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
