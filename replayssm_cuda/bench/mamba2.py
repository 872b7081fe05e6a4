"""Mamba-2 benchmarks: the conventional update against the ReplaySSM step cycle (lock-step and staggered),
the conventional T-token snapshot step against verify(T) + commit, and the host cost of an eager call.

Byte models (bytes of one step or round of the whole batch; H heads, G groups, P x N state, L buffer
length, w = a row's cursor before the step; a = activation bytes, s = state or checkpoint bytes, r = the
bytes of what a replay reads: the read copy, or the checkpoint when there is none):
    inputs / outputs   x, z, out: 3 H P a;  B, C: 2 G N a;  dt: H a                   per row and token
    conventional       read + write the state: 2 H P N s
    replay step        read the read copy (or checkpoint): H P N r (+ its fp8 scales: 4 H P);
                       read w buffer entries and append one: (w + 1) (H P a + G N a + 4 H)
    fold step          read + write the checkpoint, write the read copy (+ fp8 scales):
                       H P N (2 s + r) + 4 H P [fp8];  read w entries: w (H P a + G N a + 4 H)
    cycle              L steps, w = 0 .. L-1, the fold at w = L - 1 (max_draft_tokens = 1): the mean of
                       the L step models. Lock-step, every row folds in the same step; staggered, row r's
                       slot starts at w = slot % L (stagger_cursors, as Mamba2Cache(staggered_flush=True)
                       gives) so about batch / L rows fold in each step, and the steps pass the op's
                       staggered_flush hint as the cache does. A whole cycle moves the same bytes either way.
    step of a cycle    (the per-step rows) the mean over its rows of the per-row model at each row's w
    snapshots (T)      read the state once, write T snapshots: (1 + T) H P N s;  T tokens of inputs / outputs
    verify (T)         read the state (read copy or checkpoint) once: H P N r;  T tokens of inputs / outputs
    verify + commit    no byte model (the fold rate follows the random acceptance): time and tokens/s only
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import timing
from .dims import DimsTable
from .registry import Bench, Case, Family, Measurement, register

MODELS = {"nano4b": {"H": 96, "P": 80, "N": 128, "G": 8},
          "super120b": {"H": 128, "P": 64, "N": 128, "G": 8}}
DIMS = {name: (m["H"], m["P"], m["N"], m["G"]) for name, m in MODELS.items()}   # name -> (H, P, N, G)
DIMS_TABLE = DimsTable(fields=("H", "P", "N", "G"), models=MODELS, tp_fields=("H", "G"),
                       check=lambda v: None if v["H"] % v["G"] == 0 else f"G={v['G']} must divide H={v['H']}")
# Full width and the tensor-parallel shards engines run: super120b at TP 4 / 8, nano4b at TP 2 / 4.
DEFAULT_DIMS = ("nano4b", "nano4b@tp2", "nano4b@tp4", "super120b", "super120b@tp4", "super120b@tp8")

STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ACTIVATION_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
COPIES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}


def dtype_bytes(dtype) -> int:
    return torch.finfo(dtype).bits // 8


@dataclass
class Setup:
    """One benchmark shape: dims, batch rows, buffer length L, activation dtype, T tokens a round."""
    H: int
    P: int
    N: int
    G: int
    batch: int
    L: int = 16
    act: torch.dtype = torch.bfloat16
    T: int = 1

    @classmethod
    def of(cls, dims, batch: int, L: int, act=torch.bfloat16, T: int = 1) -> "Setup":
        return cls(dims.H, dims.P, dims.N, dims.G, batch, L, act, T)

    @property
    def state_elems(self) -> int:
        return self.H * self.P * self.N

    def io_bytes(self) -> int:
        a = dtype_bytes(self.act)
        return self.batch * self.T * (3 * self.H * self.P * a + 2 * self.G * self.N * a + self.H * a)

    def entry_bytes(self) -> int:
        a = dtype_bytes(self.act)
        return self.batch * (self.H * self.P * a + self.G * self.N * a + 4 * self.H)

    def groups(self, bytes_per_row: int) -> int:
        """Slot groups to rotate over so the state touched is well over L2 (at least 2 groups)."""
        return timing.cold_groups(self.batch, bytes_per_row)

    def tokens_per_round(self) -> float:
        """Tokens a speculative round keeps per batch, num_accepted uniform in [1, T]: batch (T + 1) / 2."""
        return self.batch * (self.T + 1) / 2


# ---- byte models (see the module doc) ---------------------------------------------------------------

def update_bytes(s: Setup, state_bytes: int) -> int:
    return s.batch * 2 * s.state_elems * state_bytes + s.io_bytes()


def step_bytes(s: Setup, w: int, checkpoint_bytes: int, copy_bytes: int | None = None, fp8: bool = False) -> int:
    """One step with every row at cursor w (copy_bytes None: no read copy)."""
    fold = w + 1 >= s.L
    read = checkpoint_bytes if copy_bytes is None else copy_bytes
    ck_rw = 2 * checkpoint_bytes   # a fold reads and writes the checkpoint
    per_elem = (ck_rw + read) if fold and copy_bytes is not None else ck_rw if fold else read
    scales = 4 * s.batch * s.H * s.P if fp8 else 0   # a fold writes them, a replay step reads them
    entries = w if fold else w + 1
    return s.batch * s.state_elems * per_elem + scales + entries * s.entry_bytes() + s.io_bytes()


def rows_step_bytes(s: Setup, ws, checkpoint_bytes: int, copy_bytes: int | None = None, fp8: bool = False) -> float:
    """One step whose rows sit at the cursors ws: the mean over rows of the per-row model."""
    ws = list(ws)
    return sum(step_bytes(s, w, checkpoint_bytes, copy_bytes, fp8) for w in ws) / len(ws)


def cycle_bytes(s: Setup, checkpoint_bytes: int, copy_bytes: int | None = None, fp8: bool = False) -> float:
    """Mean bytes per step of a whole L-step cycle (lock-step or staggered: the same bytes)."""
    return rows_step_bytes(s, range(s.L), checkpoint_bytes, copy_bytes, fp8)


def snapshot_bytes(s: Setup, state_bytes: int = 4) -> int:
    return s.batch * (1 + s.T) * s.state_elems * state_bytes + s.io_bytes()


def verify_bytes(s: Setup, read_bytes: int) -> int:
    return s.batch * s.state_elems * read_bytes + s.io_bytes()


# ---- GPU set-ups ------------------------------------------------------------------------------------

def weights(s):
    """A (negative), D and dt_bias for the s.H heads of a benchmark setup."""
    A = -(0.5 + torch.rand(s.H, device="cuda"))
    return A, torch.randn(s.H, device="cuda"), 0.1 * torch.randn(s.H, device="cuda")


def make_inputs(s: Setup, count: int, tokens: int | None = None):
    """Distinct random (x, dt, B, C, z) for each of `count` steps (tokens None: (batch, ...)) or rounds of
    `tokens` tokens ((batch, tokens, ...)); never zeros."""
    lead = (s.batch,) if tokens is None else (s.batch, tokens)
    out = []
    for _ in range(count):
        x = torch.randn(*lead, s.H, s.P, device="cuda").to(s.act)
        dt = (0.5 * torch.randn(*lead, s.H, device="cuda")).to(s.act)
        B = torch.randn(*lead, s.G, s.N, device="cuda").to(s.act)
        C = torch.randn(*lead, s.G, s.N, device="cuda").to(s.act)
        z = torch.randn(*lead, s.H, s.P, device="cuda").to(s.act)
        out.append((x, dt, B, C, z))
    return out


def _slot_groups(s: Setup, k: int):
    return [torch.arange(g * s.batch, (g + 1) * s.batch, device="cuda", dtype=torch.int32) for g in range(k)]


def _seed(rounding: bool):
    return torch.tensor([1, 0], dtype=torch.int64, device="cuda") if rounding else None


def conventional_steps(s: Setup, state_dtype=torch.float32, rounding=False):
    """The conventional update over a rotating pool (`rounding`: stochastic rounding of a 16-bit state,
    its offset launch included): (record, the steps one record launches, the bytes one step moves).
    record() launches one mamba2_update per slot group."""
    s_bytes = dtype_bytes(state_dtype)
    k = s.groups(s.state_elems * s_bytes)
    state = (torch.randn(k * s.batch, s.H, s.P, s.N, device="cuda") * 0.1).to(state_dtype)
    seed = _seed(rounding)
    A, D, dt_bias = weights(s)
    inputs = make_inputs(s, k)
    slots = _slot_groups(s, k)
    out = torch.empty(s.batch, s.H, s.P, device="cuda", dtype=s.act)

    def steps():
        for g in range(k):
            x, dt, B, C, z = inputs[g]
            torch.ops.replayssm.mamba2_update(state, x, dt, A, B, C, out, D, z, dt_bias, True, slots[g], -1, seed)

    return steps, k, update_bytes(s, s_bytes)


class ReplayPool:
    """A rotating pool of replay caches for one setup: k slot groups of `batch` slots, random checkpoints
    (fp32 unless given; `rounding`: stochastic rounding of a 16-bit one), an optional read copy, full
    random buffers, cursors at 0 (stagger() spreads them), and the step launch (`staggered_flush`: the
    op's hint that the slots fold at different steps, as Mamba2Cache(staggered_flush=True) passes it)."""

    def __init__(self, s: Setup, read_copy_dtype=None, checkpoint_dtype=torch.float32, rounding=False,
                 staggered_flush=False):
        from .. import ops
        self.s, self.rc_dtype, self.staggered_flush = s, read_copy_dtype, staggered_flush
        self.c_bytes = dtype_bytes(checkpoint_dtype)
        self.r_bytes = None if read_copy_dtype is None else dtype_bytes(read_copy_dtype)
        self.fp8 = read_copy_dtype == torch.float8_e4m3fn
        self.k = k = s.groups(s.state_elems * self.c_bytes)
        S = k * s.batch
        self.ck = (torch.randn(S, s.H, s.P, s.N, device="cuda") * 0.1).to(checkpoint_dtype)
        self.seed = _seed(rounding)
        self.rc = self.rs = None
        if read_copy_dtype is not None:
            self.rc = torch.empty(S, s.H, s.P, s.N, device="cuda", dtype=read_copy_dtype)
            self.rs = torch.empty(S, s.H, s.P, device="cuda") if self.fp8 else None
            ops.make_read_copy(self.ck, self.rc, self.rs, backend="cuda")
        self.x_buf = torch.randn(S, s.H, s.L, s.P, device="cuda").to(s.act)
        self.B_buf = torch.randn(S, s.G, s.L, s.N, device="cuda").to(s.act)
        self.dt_buf = torch.rand(S, s.H, s.L, device="cuda") * 0.1
        self.cursors = torch.zeros(S, dtype=torch.int32, device="cuda")
        self.A, self.D, self.dt_bias = weights(s)
        self.slots = _slot_groups(s, k)
        self.out = torch.empty(s.batch, s.H, s.P, device="cuda", dtype=s.act)

    def stagger(self, cursors=None):
        """Set the cursors (or `cursors`) to slot % L, by the op the cache uses (the buffers stay as they are)."""
        from .. import ops
        ops.stagger_cursors([], self.cursors if cursors is None else cursors, self.s.L, backend="cuda")

    def record_steps(self, inputs):
        """One mamba2_step per input set, slot group i % k for the i-th."""
        for i, (x, dt, B, C, z) in enumerate(inputs):
            torch.ops.replayssm.mamba2_step(self.ck, self.rc, self.rs, self.x_buf, self.B_buf, self.dt_buf,
                                            self.cursors, x, dt, self.A, B, C, self.out, self.D, z, self.dt_bias,
                                            True, 1, self.slots[i % self.k], -1, self.seed, self.staggered_flush)

    def step_bytes(self, w: int) -> int:
        """Bytes one step at cursor w moves for the whole batch (the byte model in the module doc)."""
        return step_bytes(self.s, w, self.c_bytes, self.r_bytes, self.fp8)


# ---- measurements -----------------------------------------------------------------------------------

def measure_update(s: Setup, state_dtype=torch.float32, rounding=False) -> Measurement:
    """Seconds per step of mamba2_update and the bytes it moves per step."""
    record, k, nbytes = conventional_steps(s, state_dtype, rounding)
    seconds, kernels = timing.timed(record, k)
    return Measurement(seconds, nbytes, kernels=kernels)


def measure_cycle(s: Setup, read_copy_dtype, checkpoint_dtype=torch.float32, rounding=False,
                  staggered=False) -> Measurement:
    """Seconds per step of mamba2_step over whole L-step cycles: a graph steps every slot group L times,
    and replays go on from where the previous one left the cursors. Lock-step: every cursor starts at 0,
    so all rows fold in the same step; staggered: the cursors start at slot % L and the steps pass the
    staggered_flush hint, so about batch / L rows fold in every step."""
    pool = ReplayPool(s, read_copy_dtype, checkpoint_dtype, rounding, staggered_flush=staggered)
    if staggered:
        pool.stagger()
    per_graph = pool.k * s.L
    inputs = make_inputs(s, per_graph)
    seconds, kernels = timing.timed(lambda: pool.record_steps(inputs), per_graph)
    return Measurement(seconds, cycle_bytes(s, pool.c_bytes, pool.r_bytes, pool.fp8), kernels=kernels)


def measure_phase(s: Setup, read_copy_dtype, w: int, checkpoint_dtype=torch.float32, rounding=False) -> Measurement:
    """Seconds per step of mamba2_step with every cursor at w (reset before every replay): w < L - 1 is a
    replay step, w = L - 1 the step in which every row folds."""
    pool = ReplayPool(s, read_copy_dtype, checkpoint_dtype, rounding)
    inputs = make_inputs(s, pool.k)
    seconds, kernels = timing.timed(lambda: pool.record_steps(inputs), pool.k,
                                    before_replay=lambda: pool.cursors.fill_(w))
    return Measurement(seconds, pool.step_bytes(w), kernels=kernels)


def measure_cycle_steps(s: Setup, read_copy_dtype, staggered: bool, checkpoint_dtype=torch.float32,
                        rounding=False) -> Measurement:
    """Each of the L steps of a cycle timed on its own, every row's cursor set before each replay to where
    that step finds it (lock-step: all rows at w = c in step c; staggered: slot s at (s % L + c) % L, with
    the op's hint): the mean step (µs, bytes) and the slowest step (extra columns)."""
    pool = ReplayPool(s, read_copy_dtype, checkpoint_dtype, rounding, staggered_flush=staggered)
    phase = torch.zeros_like(pool.cursors)
    if staggered:
        pool.stagger(phase)
    inputs = make_inputs(s, pool.k)
    slot_phase = phase.cpu()                                   # every slot of the pool is stepped once
    steps = []
    for c in range(s.L):
        start = (phase + c) % s.L
        t = timing.time_graph(lambda: pool.record_steps(inputs), before_replay=lambda: pool.cursors.copy_(start)) / pool.k
        ws = ((slot_phase + c) % s.L).tolist()
        steps.append((t, rows_step_bytes(s, ws, pool.c_bytes, pool.r_bytes, pool.fp8)))
    mean = sum(t for t, _ in steps) / len(steps)
    slowest = max(t for t, _ in steps)
    return Measurement(mean, sum(b for _, b in steps) / len(steps),
                       extra={"slowest µs": slowest * 1e6, "slowest/mean": slowest / mean})


def measure_snapshots(s: Setup) -> Measurement:
    """Seconds per round of mamba2_update_snapshots (fp32 state, T tokens, one snapshot per token) and the
    bytes it moves per round."""
    row_bytes = (1 + s.T) * s.state_elems * 4
    k = s.groups(row_bytes)
    state = torch.randn(k * s.batch, s.H, s.P, s.N, device="cuda") * 0.1
    A, D, dt_bias = weights(s)
    inputs = make_inputs(s, k, tokens=s.T)
    slots = _slot_groups(s, k)
    # One snapshot buffer per group, poisoned: the kernel must overwrite every element it reports.
    snaps = [torch.full((s.batch, s.T, s.H, s.P, s.N), float("nan"), device="cuda") for _ in range(k)]
    out = torch.empty(s.batch, s.T, s.H, s.P, device="cuda", dtype=s.act)

    def rounds():
        for g in range(k):
            x, dt, B, C, z = inputs[g]
            torch.ops.replayssm.mamba2_update_snapshots(state, x, dt, A, B, C, out, snaps[g], D, z, dt_bias, True,
                                                        slots[g], -1)

    seconds, kernels = timing.timed(rounds, k)
    if torch.isnan(snaps[0][0, -1, 0, 0, 0]).item():
        raise RuntimeError("mamba2_update_snapshots left its output unwritten")
    return Measurement(seconds, snapshot_bytes(s), extra={"tokens/s": s.tokens_per_round() / seconds}, kernels=kernels)


def measure_verify_commit(s: Setup, read_copy_dtype, breakdown=False) -> Measurement:
    """Seconds per lock-step round of verify(T) + commit(num_accepted) on an fp32 checkpoint, num_accepted
    uniform in [1, T] per row, drawn on the device before every replay (outside the timed region). With
    breakdown, also verify alone and commit alone: the same rounds with one op captured, timed after the
    whole rounds so the cursors are spread as in them (commit alone moves them as it does there: every
    slot's verified count is set to T before each replay, as the verify of a round leaves it)."""
    from .. import ops
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
    inputs = make_inputs(s, k, tokens=s.T)
    slots = _slot_groups(s, k)
    accepted = [torch.ones(s.batch, dtype=torch.int32, device="cuda") for _ in range(k)]
    out = torch.empty(s.batch, s.T, s.H, s.P, device="cuda", dtype=s.act)
    verified = torch.zeros_like(cursors)
    cache = (ck, rc, rs, x_buf, B_buf, dt_buf, cursors, verified)

    def verifies():
        for g in range(k):
            x, dt, B, C, z = inputs[g]
            ops.mamba2_verify(*cache, x, dt, A, B, C, out, D, z, dt_bias, True, slots[g], -1, backend="cuda")

    def commits():
        for g in range(k):
            ops.mamba2_commit(*cache, accepted[g], A, s.T, slots[g], -1, backend="cuda")

    def rounds():
        for g in range(k):
            x, dt, B, C, z = inputs[g]
            ops.mamba2_verify(*cache, x, dt, A, B, C, out, D, z, dt_bias, True, slots[g], -1, backend="cuda")
            ops.mamba2_commit(*cache, accepted[g], A, s.T, slots[g], -1, backend="cuda")

    def draw_acceptance():
        for acc in accepted:
            acc.random_(1, s.T + 1)

    def draw_verified_acceptance():
        draw_acceptance()
        verified.fill_(s.T)

    whole, kernels = timing.timed(rounds, k, before_replay=draw_acceptance)
    extra = {"tokens/s": s.tokens_per_round() / whole}
    if breakdown:
        commit_only = timing.time_graph(commits, before_replay=draw_verified_acceptance) / k
        verify_only = timing.time_graph(verifies) / k
        read_bytes = 4 if read_copy_dtype is None else dtype_bytes(read_copy_dtype)
        extra.update({"verify µs": verify_only * 1e6,
                      "verify GB/s": verify_bytes(s, read_bytes) / verify_only / 1e9,
                      "commit µs": commit_only * 1e6})
    return Measurement(whole, None, extra=extra, kernels=kernels)


# ---- eager host cost --------------------------------------------------------------------------------

class _EagerCalls:
    """The tensors of the eager calls at one (setup, read copy), made on first use: a conventional state,
    a replay cache of `batch` slots (fp32 checkpoint, buffers of L entries, cursors at 0), T-token verify
    inputs, and a Mamba2Cache of the same configuration (made when its row runs)."""

    def __init__(self, s: Setup, read_copy_dtype):
        from .. import ops
        act, b, dev = s.act, s.batch, "cuda"
        self.s, self.rc_dtype, self.ops = s, read_copy_dtype, ops
        self.A, self.D, self.dt_bias = weights(s)
        self.slots = torch.arange(b, device=dev, dtype=torch.int32)
        self.state = torch.randn(b, s.H, s.P, s.N, device=dev) * 0.1
        self.x1, self.dt1, self.B1, self.C1, self.z1 = make_inputs(s, 1)[0]
        self.out1 = torch.empty(b, s.H, s.P, device=dev, dtype=act)
        ck = torch.randn(b, s.H, s.P, s.N, device=dev) * 0.1
        rc = rs = None
        if read_copy_dtype is not None:
            rc = torch.empty(b, s.H, s.P, s.N, device=dev, dtype=read_copy_dtype)
            rs = torch.empty(b, s.H, s.P, device=dev) if read_copy_dtype == torch.float8_e4m3fn else None
            ops.make_read_copy(ck, rc, rs, backend="cuda")
        self.cache = (ck, rc, rs, torch.randn(b, s.H, s.L, s.P, device=dev).to(act),
                      torch.randn(b, s.G, s.L, s.N, device=dev).to(act), torch.rand(b, s.H, s.L, device=dev) * 0.1)
        self.cursors = torch.zeros(b, dtype=torch.int32, device=dev)
        self.verified = torch.zeros_like(self.cursors)
        self.stepped = torch.zeros_like(self.cursors)   # the step moves its cursors (and folds every L calls)
        self.xT, self.dtT, self.BT, self.CT, self.zT = make_inputs(s, 1, tokens=s.T)[0]
        self.outT = torch.empty(b, s.T, s.H, s.P, device=dev, dtype=act)
        self.a, self.b = torch.zeros(1, device=dev), torch.ones(1, device=dev)
        self.layer_out = torch.empty_like(self.x1)
        self._layer = None

    def layer(self):
        """The Mamba2Cache (backend="cuda") whose step() the Mamba2Cache.step row times."""
        if self._layer is None:
            from .. import Mamba2Cache, Mamba2Weights
            s = self.s
            self._layer = Mamba2Cache(s.batch, s.H, s.P, s.N, s.G,
                                      Mamba2Weights(A=self.A, D=self.D, dt_bias=self.dt_bias),
                                      buffer_len=s.L, read_copy_dtype=self.rc_dtype, activation_dtype=s.act,
                                      device="cuda", backend="cuda")
        return self._layer

    def call(self, row: str):
        """The callable that enqueues one call of a row (OVERHEAD_ROWS)."""
        if row == "Mamba2Cache.step":
            return functools.partial(self.layer().step, self.x1, self.dt1, self.B1, self.C1, self.z1,
                                     slots=self.slots, out=self.layer_out)
        return self._calls()[row]

    def _calls(self):
        rep, ops = torch.ops.replayssm, self.ops
        ck, rc, rs, x_buf, B_buf, dt_buf = self.cache
        A, D, dtb, slots = self.A, self.D, self.dt_bias, self.slots
        x, dt, B, C, z, out = self.x1, self.dt1, self.B1, self.C1, self.z1, self.out1
        return {
            "torch add_ (1 element)": lambda: self.a.add_(self.b),
            "torch.ops mamba2_update": lambda: rep.mamba2_update(self.state, x, dt, A, B, C, out, D, z, dtb, True,
                                                                 slots, -1, None),
            "torch.ops mamba2_step": lambda: rep.mamba2_step(ck, rc, rs, x_buf, B_buf, dt_buf, self.stepped, x, dt, A,
                                                             B, C, out, D, z, dtb, True, 1, slots, -1, None, False),
            "ops.mamba2_step": lambda: ops.mamba2_step(ck, rc, rs, x_buf, B_buf, dt_buf, self.stepped, x, dt, A, B, C,
                                                       out, D, z, dtb, True, 1, slots, -1, None, backend="cuda"),
            "torch.ops mamba2_verify": lambda: rep.mamba2_verify(ck, rc, rs, x_buf, B_buf, dt_buf, self.cursors,
                                                                 self.verified, self.xT, self.dtT, A, self.BT, self.CT, self.outT, D,
                                                                 self.zT, dtb, True, slots, -1),
            "torch.ops mamba2_flush": lambda: rep.mamba2_flush(ck, rc, rs, x_buf, B_buf, dt_buf, self.cursors, A,
                                                               slots, -1, None),
        }


OVERHEAD_ROWS = ("torch add_ (1 element)", "torch.ops mamba2_update", "torch.ops mamba2_step", "ops.mamba2_step",
                 "Mamba2Cache.step", "torch.ops mamba2_verify", "torch.ops mamba2_flush")
OVERHEAD_BASELINE = OVERHEAD_ROWS[1]   # our conventional update, as in the other tables
COPY_FREE_ROWS = OVERHEAD_ROWS[:2]   # rows that do not read a cache: once per (dims, batch)


_eager_held = {}   # the one _EagerCalls alive: (setup, copy) -> it


def measure_host(s: Setup, copy: str, row: str, calls: int, loops: int) -> Measurement:
    """Host seconds per eager call of a row (timing.host_us_per_call); the tensors of the last (setup,
    copy) are kept for the next row and dropped when another one comes."""
    key = (repr(s), copy)
    if key not in _eager_held:
        _eager_held.clear()
        _eager_held[key] = _EagerCalls(s, COPIES[copy])
    call = _eager_held[key].call(row)
    return Measurement(timing.host_us_per_call(call, calls, loops) * 1e-6)


# ---- plans ------------------------------------------------------------------------------------------

def copy_limit(checkpoint_dtype, copy_dtype, P: int, N: int, act) -> str | None:
    """Why this build has no replay kernel for a read copy of this kind, or None: the capabilities table
    when the package has it, else the ops module's rule (asked with meta tensors, so no GPU is needed)."""
    if copy_dtype is None:
        return None
    import replayssm_cuda
    from .. import ops
    name = {v: k for k, v in STATE_DTYPES.items()}.get(checkpoint_dtype, str(checkpoint_dtype))
    copy_name = str(copy_dtype).replace("torch.", "")
    caps = getattr(replayssm_cuda, "capabilities", None)
    pairs = (caps() or {}).get("mamba2", {}).get("checkpoint_read_copy") if caps is not None else None
    if pairs:
        if [name, copy_name] not in [list(p) for p in pairs]:
            return f"no replay kernel for a {copy_name} read copy of a {name} checkpoint"
        return None
    rule = getattr(ops, "mamba2_kernel_limit", None)
    if rule is None:
        return None
    meta = functools.partial(torch.empty, device="meta")
    return rule(meta(0, 1, P, N, dtype=checkpoint_dtype), meta(0, 1, P, N, dtype=copy_dtype), meta(0, dtype=act))


CYCLE_ROWS = {"update": "update", "lockstep": "lock-step cycle", "staggered": "staggered cycle", "step": None,
              "fold": "fold step", "lockstep-steps": "lock-step steps", "staggered-steps": "staggered steps"}
DEFAULT_CYCLE_ROWS = ("update", "lockstep", "staggered")


def plan_cycle(args, dims_list):
    act = ACTIVATION_DTYPES[args.activation_dtype]
    rounding = args.stochastic_rounding
    kinds = [k for k in CYCLE_ROWS if k in (args.rows or DEFAULT_CYCLE_ROWS) and k != "update"]
    cases, notes = [], []
    for ck_name in args.checkpoint_dtype:
        ck = STATE_DTYPES[ck_name]
        for d in dims_list:
            for batch in args.batches:
                s = Setup.of(d, batch, args.buffer_len, act)
                common = {"checkpoint": ck_name, "L": s.L, "activations": args.activation_dtype,
                          "rounding": "stochastic" if rounding else "nearest"}
                base = {"dims": d.label, "batch": batch, "row": "update", "copy": "-", **common}
                cases.append(Case(base, functools.partial(measure_update, s, ck, rounding), baseline=base,
                                  meta={"dims": d.text()}))
                for copy in args.copies:
                    rc = COPIES[copy]
                    limit = copy_limit(ck, rc, s.P, s.N, act)
                    if limit is not None:
                        note = f"{copy} copy with a {ck_name} checkpoint skipped: {limit}"
                        notes += [note] if note not in notes else []
                        continue
                    for kind in kinds:
                        label = CYCLE_ROWS[kind] or f"step w={s.L // 2}"
                        if kind == "lockstep" or kind == "staggered":
                            fn = functools.partial(measure_cycle, s, rc, ck, rounding, kind == "staggered")
                        elif kind == "step":
                            fn = functools.partial(measure_phase, s, rc, s.L // 2, ck, rounding)
                        elif kind == "fold":
                            fn = functools.partial(measure_phase, s, rc, s.L - 1, ck, rounding)
                        else:
                            fn = functools.partial(measure_cycle_steps, s, rc, kind == "staggered-steps", ck, rounding)
                        extras = ("slowest µs", "slowest/mean") if kind.endswith("-steps") else ()
                        cfg = {"dims": d.label, "batch": batch, "row": label, "copy": copy, **common}
                        cases.append(Case(cfg, fn, baseline=base, extras=extras, meta={"dims": d.text()}))
    return cases, notes


def plan_spec(args, dims_list):
    act = ACTIVATION_DTYPES[args.activation_dtype]
    cases, notes = [], []
    for d in dims_list:
        for batch in args.batches:
            s = Setup.of(d, batch, args.buffer_len, act, T=args.tokens)
            common = {"T": s.T, "L": s.L, "activations": args.activation_dtype}
            base = {"dims": d.label, "batch": batch, "row": "snapshots (conventional)", "copy": "-", **common}
            cases.append(Case(base, functools.partial(measure_snapshots, s), baseline=base, extras=("tokens/s",),
                              meta={"dims": d.text()}))
            for copy in args.copies:
                rc = COPIES[copy]
                limit = copy_limit(torch.float32, rc, s.P, s.N, act)
                if limit is not None:
                    note = f"{copy} copy skipped: {limit}"
                    notes += [note] if note not in notes else []
                    continue
                extras = ("tokens/s",) + (("verify µs", "verify GB/s", "commit µs") if args.breakdown else ())
                cfg = {"dims": d.label, "batch": batch, "row": "verify + commit", "copy": copy, **common}
                cases.append(Case(cfg, functools.partial(measure_verify_commit, s, rc, args.breakdown), baseline=base,
                                  extras=extras, meta={"dims": d.text()}))
    return cases, notes


def plan_overhead(args, dims_list):
    act = ACTIVATION_DTYPES[args.activation_dtype]
    cases = []
    for d in dims_list:
        for batch in args.batches:
            s = Setup.of(d, batch, args.buffer_len, act, T=args.tokens)
            common = {"L": s.L, "T": s.T}
            base = {"dims": d.label, "batch": batch, "row": OVERHEAD_BASELINE, "copy": "-", **common}
            for copy in args.copies:
                for row in OVERHEAD_ROWS:
                    if row in COPY_FREE_ROWS and copy != args.copies[0]:
                        continue
                    cfg = {"dims": d.label, "batch": batch, "row": row,
                           "copy": "-" if row in COPY_FREE_ROWS else copy, **common}
                    cases.append(Case(cfg, functools.partial(measure_host, s, copy, row, args.calls, args.loops),
                                      baseline=base, meta={"dims": d.text()}))
    return cases, []


# ---- command-line options ---------------------------------------------------------------------------

def _add_activation(parser):
    parser.add_argument("--activation-dtype", choices=list(ACTIVATION_DTYPES), default="bfloat16", metavar="DTYPE",
                        help=f"x, z, B, C, dt and out: {', '.join(ACTIVATION_DTYPES)} (default bfloat16)")


def _cycle_arguments(parser):
    _add_activation(parser)
    parser.add_argument("--checkpoint-dtype", nargs="+", choices=list(STATE_DTYPES), default=["float32"],
                        metavar="DTYPE", help=f"checkpoint dtype of the replay rows and state dtype of the update: "
                                              f"{', '.join(STATE_DTYPES)} (default float32)")
    parser.add_argument("--rows", nargs="+", choices=list(CYCLE_ROWS), default=None, metavar="ROW",
                        help=f"rows per (dims, batch, copy), of {', '.join(CYCLE_ROWS)}: lockstep / staggered = whole L-step cycles (mean "
                             "step); step = every row at w = L/2; fold = every row folds; lockstep-steps / "
                             "staggered-steps = each step of a cycle timed alone (mean and slowest). The update "
                             "(the baseline) is always measured. Default: update lockstep staggered")
    parser.add_argument("--stochastic-rounding", action="store_true",
                        help="stochastic rounding of a bfloat16 / float16 checkpoint's folds and of the update")


def _spec_arguments(parser):
    _add_activation(parser)
    parser.add_argument("--tokens", type=int, default=4, help="draft tokens T verified per round (default 4)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time verify alone and commit alone (extra columns)")


def _overhead_arguments(parser):
    _add_activation(parser)
    parser.add_argument("--tokens", type=int, default=4, help="draft tokens T of the verify call (default 4)")
    parser.add_argument("--calls", type=int, default=200, help="calls enqueued per timed loop (default 200)")
    parser.add_argument("--loops", type=int, default=21, help="timed loops; the median is reported (default 21)")


def check_tokens(args) -> None:
    """--tokens (draft tokens T) within what the kernels and the buffer take (the spec, overhead and layers
    benchmarks of every family)."""
    if not 1 <= args.tokens <= min(16, args.buffer_len):
        raise ValueError(f"--tokens must be in [1, min(16, --buffer-len={args.buffer_len})], got {args.tokens}")


def check_args(bench_name: str, args) -> None:
    """Cross-option checks (ValueError naming the option)."""
    if bench_name == "cycle" and args.stochastic_rounding:
        bad = [c for c in args.checkpoint_dtype if c == "float32"]
        if bad:
            raise ValueError("--stochastic-rounding needs --checkpoint-dtype bfloat16 or float16, got float32")
    if bench_name in ("spec", "overhead"):
        check_tokens(args)
    if bench_name == "overhead" and (args.calls < 1 or args.loops < 1):
        raise ValueError(f"--calls and --loops must be >= 1, got {args.calls} and {args.loops}")


CYCLE_DOC = ("µs per step: the conventional update (the baseline: our mamba2_update, state read and written "
             "every step) and the ReplaySSM step (mamba2_step, read copy none / bf16 / fp8) over whole L-step "
             "cycles, lock-step (all rows fold in the same step) and staggered (rows fold in different steps, "
             "as under continuous batching: the serving case). Byte models: python -m replayssm_cuda bench "
             "mamba2 cycle --help.")
SPEC_DOC = ("µs per speculative round of T draft tokens: the conventional snapshot step (the baseline: "
            "mamba2_update_snapshots, the state read once and T snapshots written) against the ReplaySSM "
            "verify(T) + commit(num_accepted), num_accepted uniform in [1, T]; fp32 state / checkpoint. "
            "verify + commit has no byte model (its fold rate follows the acceptance): tokens/s = batch (T + 1) "
            "/ 2 per round.")
OVERHEAD_DOC = ("Host µs per eager call (not GPU time): the wall time of back-to-back calls with no "
                "synchronisation between them, median over loops. The baseline is our conventional update "
                "through torch.ops; the torch add row (an in-place add of two 1-element tensors, the cheapest "
                "dispatcher call that launches a kernel) is the floor. fp32 checkpoint, cursors at 0 (the "
                "step's move and fold every L calls). The host CPU sets these figures as much as the code does.")

FAMILY = register(Family("mamba2", "Mamba-2 (H heads of P x N state, G groups of B / C)", DIMS_TABLE))
FAMILY.add(Bench("cycle", "update vs replay step cycles (lock-step and staggered)", CYCLE_DOC + "\n\n" + __doc__,
                 plan_cycle, _cycle_arguments, default_dims=DEFAULT_DIMS,
                 needs_ops=("mamba2_update", "mamba2_step", "make_read_copy", "stagger_cursors"),
                 check=functools.partial(check_args, "cycle")))
FAMILY.add(Bench("spec", "conventional T-token snapshots vs verify(T) + commit", SPEC_DOC + "\n\n" + __doc__,
                 plan_spec, _spec_arguments, default_dims=DEFAULT_DIMS,
                 needs_ops=("mamba2_update_snapshots", "mamba2_verify", "mamba2_commit", "make_read_copy"),
                 check=functools.partial(check_args, "spec")))
FAMILY.add(Bench("overhead", "host µs per eager call at batch 1", OVERHEAD_DOC, plan_overhead, _overhead_arguments,
                 default_dims=("nano4b", "super120b@tp4"), default_batches=(1,), default_copies=("none",),
                 needs_ops=("mamba2_update", "mamba2_step"), check=functools.partial(check_args, "overhead")))
