"""Gated DeltaNet benchmarks: the conventional update (and flash-linear-attention's fused_recurrent, where
fla is installed) against the ReplaySSM step cycle (lock-step and staggered), and the conventional T-token
snapshot update against verify(T) + commit.

Byte models: the bytes one step or round of the whole batch moves, taken from the kernels (update.cu,
snapshots.cu, step_kernel.cuh, fold.cuh, verify_kernel.cuh). Per (row, v-head): H q/k heads, HV v-heads,
G = HV / H v-heads a k-head (a k-head's keys are read from memory once for its G v-heads, so K a / G a
v-head), V x K state, L buffer length, w = the row's cursor before the step; a = activation bytes,
s = state or checkpoint bytes, r = what a replay reads (the read copy, or the checkpoint when there is
none), U = what a folded entry brings besides its key (its value, V a, with a read copy: every u is
recomputed from the checkpoint; its stored u, 4 V, without one), c = the log decays a token has per
v-head: 1 for GDN, K for KDA (bench kda: the kernels' kVectorGate, the gate input a and g_buf's entries
per key channel). The weights (A_log, dt_bias: a few KB a layer, every row's) are not counted.
    token (in / out)   q, k: 2 K a / G;  v, out: 2 V a;  the gate inputs a: c a, b: a           per token
    conventional       read + write the state: 2 V K s
    replay step        read the tile V K r (+ its fp8 scales 4 V) and the window w (4 V + 4 c + K a / G)
                       (u, g, keys); append the entry: 4 V + V a + 4 c + 4 + K a / G (u, v, g, beta, key)
    fold step          the tile as the replay reads it (with a read copy: read and not used, V K r; without
                       one it is the checkpoint tile, counted once), the checkpoint read and written
                       2 V K s, the window w (U + 4 c + 4 + K a / G) (entries, g, beta, keys), the read copy
                       written V K r (+ 4 V fp8 scales); no entry appended (the cursor goes to 0)
    cycle              L steps, w = 0 .. L-1, the fold at w = L - 1 (max_draft_tokens = 1): the mean of the
                       L step models. Lock-step, every row folds in the same step; staggered, row r's slot
                       starts at w = slot % L (stagger_cursors, as GDNCache(staggered_flush=True) gives), so
                       about batch / L rows fold in each step and the steps pass the op's staggered_flush
                       hint as the cache does. A whole cycle moves the same bytes either way.
    step of a cycle    (the per-step rows) the mean over its rows of the per-row model at each row's w
    fla fused_recurrent  the conventional model (its fp32 state read from initial_state, the final state
                       written to a new tensor)
    snapshots (T)      read the state once, write T snapshots: (1 + T) V K s;  T tokens
    verify (T)         read the tile V K r (+ fp8 scales 4 V) and the window w (4 V + 4 c + K a / G); append
                       T entries T (4 V + V a + 4 c + 4 + K a / G);  T tokens
    verify + commit    no byte model (the fold rate follows the random acceptance): time and tokens/s only
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass

import torch

from . import timing
from .dims import DimsTable
from .mamba2 import ACTIVATION_DTYPES, COPIES, STATE_DTYPES, check_tokens, dtype_bytes
from .registry import Bench, Case, Family, Measurement, register

# The GDN layers the GPU tests name qwen4b and qwen122b (tests/gpu/test_gdn_cuda.py).
MODELS = {"qwen4b": {"H": 16, "HV": 32, "K": 128, "V": 128},
          "qwen122b": {"H": 16, "HV": 64, "K": 128, "V": 128}}
DIMS_TABLE = DimsTable(fields=("H", "HV", "K", "V"), models=MODELS, tp_fields=("H", "HV"),
                       check=lambda v: None if v["HV"] % v["H"] == 0 else
                       f"H={v['H']} must divide HV={v['HV']} (the v-heads of a q/k head)")
# Full width and the shard of one of 4 tensor-parallel GPUs (H = 4, HV = 16).
DEFAULT_DIMS = ("qwen4b", "qwen122b", "qwen122b@tp4")
DEFAULT_BATCHES = (1, 8, 64, 256, 512)
# Where the set-ups allocate: the GPU (the CPU tests run them on the checked reference, which takes the same
# arguments, to check every call against the ops' schemas and checks without a GPU).
DEVICE = "cuda"


# The delta-rule families these set-ups run: GDN (the decay per v-head) and KDA (bench/kda.py: the decay per
# v-head and key channel, so the gate input a, dt_bias and g_buf have a trailing K dim).
FAMILIES = ("gdn", "kda")


def gate_shape(family: str, K: int) -> tuple:
    """The trailing shape of a v-head's gate input a, dt_bias and log decay g: () GDN, (K,) KDA."""
    return (K,) if family == "kda" else ()


@dataclass
class Setup:
    """One benchmark shape: dims, batch rows, buffer length L, activation dtype, T tokens a round, and the
    family whose ops it calls (torch.ops.replayssm.<family>_step, ...)."""
    H: int
    HV: int
    K: int
    V: int
    batch: int
    L: int = 16
    act: torch.dtype = torch.bfloat16
    T: int = 1
    family: str = "gdn"

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {self.family!r}")

    @classmethod
    def of(cls, dims, batch: int, L: int, act=torch.bfloat16, T: int = 1, family: str = "gdn") -> "Setup":
        return cls(dims.H, dims.HV, dims.K, dims.V, batch, L, act, T, family)

    @property
    def gate(self) -> tuple:
        """gate_shape of this family and K."""
        return gate_shape(self.family, self.K)

    @property
    def gate_channels(self) -> int:
        """Log decays a v-head has per token (c in the module doc): 1 GDN, K KDA."""
        return math.prod(self.gate)

    def op(self, name: str):
        """torch.ops.replayssm.<family>_<name>."""
        return getattr(torch.ops.replayssm, f"{self.family}_{name}")

    @property
    def state_elems(self) -> int:
        """Elements of one row's state (all v-heads)."""
        return self.HV * self.V * self.K

    def io_bytes(self) -> int:
        """The T tokens of the batch: q, k (H K each), v and out (HV V each), a (HV c) and b (HV)."""
        a = dtype_bytes(self.act)
        return self.batch * self.T * (2 * self.H * self.K * a
                                      + self.HV * (2 * self.V * a + (self.gate_channels + 1) * a))

    def window_bytes(self, w: int) -> int:
        """What a replay reads of w buffer entries of the batch: u (4 V), g (4 c), the k-head's keys."""
        return self.batch * w * (self.HV * (4 * self.V + 4 * self.gate_channels)
                                 + self.H * self.K * dtype_bytes(self.act))

    def entry_bytes(self) -> int:
        """One appended entry of the batch: u (4 V), v (V a), g (4 c) and beta (4), the k-head's key."""
        a = dtype_bytes(self.act)
        return self.batch * (self.HV * (4 * self.V + self.V * a + 4 * self.gate_channels + 4) + self.H * self.K * a)

    def groups(self, bytes_per_row: int) -> int:
        """Slot groups to rotate over so the bytes touched are well over L2 (at least 2 groups)."""
        return timing.cold_groups(self.batch, bytes_per_row)

    def tokens_per_round(self) -> float:
        """Tokens a speculative round keeps per batch, num_accepted uniform in [1, T]: batch (T + 1) / 2."""
        return self.batch * (self.T + 1) / 2


# ---- byte models (see the module doc) ---------------------------------------------------------------

def update_bytes(s: Setup, state_bytes: int) -> int:
    return s.batch * 2 * s.state_elems * state_bytes + s.io_bytes()


def step_bytes(s: Setup, w: int, checkpoint_bytes: int, copy_bytes: int | None = None, fp8: bool = False) -> int:
    """One step with every row at cursor w (copy_bytes None: no read copy); max_draft_tokens = 1."""
    if w + 1 < s.L:   # a replay
        read = checkpoint_bytes if copy_bytes is None else copy_bytes
        scales = 4 * s.batch * s.HV * s.V if fp8 else 0
        return s.batch * s.state_elems * read + scales + s.window_bytes(w) + s.entry_bytes() + s.io_bytes()
    # The fold: the checkpoint read and written; with a read copy, the copy's tile the step reads before it
    # knows it folds (not used) and the copy written. Entries bring their value (u is recomputed from the
    # checkpoint) with a read copy, their stored u without one.
    a = dtype_bytes(s.act)
    per_elem = 2 * checkpoint_bytes + (0 if copy_bytes is None else 2 * copy_bytes)
    scales = 4 * s.batch * s.HV * s.V if fp8 else 0       # written with the copy
    entry = s.V * a if copy_bytes is not None else 4 * s.V
    window = s.batch * w * (s.HV * (entry + 4 * s.gate_channels + 4) + s.H * s.K * a)
    return s.batch * s.state_elems * per_elem + scales + window + s.io_bytes()


def rows_step_bytes(s: Setup, ws, checkpoint_bytes: int, copy_bytes: int | None = None, fp8: bool = False) -> float:
    """One step whose rows sit at the cursors ws: the mean over rows of the per-row model."""
    ws = list(ws)
    return sum(step_bytes(s, w, checkpoint_bytes, copy_bytes, fp8) for w in ws) / len(ws)


def cycle_bytes(s: Setup, checkpoint_bytes: int, copy_bytes: int | None = None, fp8: bool = False) -> float:
    """Mean bytes per step of a whole L-step cycle (lock-step or staggered: the same bytes)."""
    return rows_step_bytes(s, range(s.L), checkpoint_bytes, copy_bytes, fp8)


def snapshot_bytes(s: Setup, state_bytes: int = 4) -> int:
    return s.batch * (1 + s.T) * s.state_elems * state_bytes + s.io_bytes()


def verify_bytes(s: Setup, w: float, read_bytes: int, fp8: bool = False) -> float:
    """verify(T) with every row at cursor w (a mean cursor may be given: the model is linear in w)."""
    scales = 4 * s.batch * s.HV * s.V if fp8 else 0
    return (s.batch * s.state_elems * read_bytes + scales + s.window_bytes(1) * w + s.T * s.entry_bytes()
            + s.io_bytes())


# ---- GPU set-ups ------------------------------------------------------------------------------------

def weights(s):
    """A_log (HV,) and dt_bias (HV, *s.gate) of the s.HV v-heads (exp(A_log) in [0.05, 0.5], as the GPU
    tests' layers)."""
    A_log = torch.log(0.05 + 0.45 * torch.rand(s.HV, device=DEVICE))
    return A_log, 0.5 * torch.randn(s.HV, *s.gate, device=DEVICE)


def make_inputs(s: Setup, count: int, tokens: int | None = None):
    """Distinct random (q, k, v, a, b) for each of `count` steps (tokens None: (batch, ...)) or rounds of
    `tokens` tokens ((batch, tokens, ...)), in the activation dtype; a is (..., HV, *s.gate)."""
    lead = (s.batch,) if tokens is None else (s.batch, tokens)
    out = []
    for _ in range(count):
        q = torch.randn(*lead, s.H, s.K, device=DEVICE).to(s.act)
        k = torch.randn(*lead, s.H, s.K, device=DEVICE).to(s.act)
        v = torch.randn(*lead, s.HV, s.V, device=DEVICE).to(s.act)
        a = torch.randn(*lead, s.HV, *s.gate, device=DEVICE).to(s.act)
        b = torch.randn(*lead, s.HV, device=DEVICE).to(s.act)
        out.append((q, k, v, a, b))
    return out


def _slot_groups(s: Setup, k: int):
    return [torch.arange(g * s.batch, (g + 1) * s.batch, device=DEVICE, dtype=torch.int32) for g in range(k)]


def conventional_steps(s: Setup, state_dtype=torch.float32):
    """<family>_update over a rotating pool: (record, the steps one record launches, the bytes one step
    moves). record() launches one update per slot group."""
    s_bytes = dtype_bytes(state_dtype)
    k = s.groups(s.state_elems * s_bytes)
    state = (torch.randn(k * s.batch, s.HV, s.V, s.K, device=DEVICE) * 0.1).to(state_dtype)
    A_log, dt_bias = weights(s)
    inputs = make_inputs(s, k)
    slots = _slot_groups(s, k)
    out = torch.empty(s.batch, s.HV, s.V, device=DEVICE, dtype=s.act)
    update = s.op("update")

    def steps():
        for g in range(k):
            q, kk, v, a, b = inputs[g]
            update(state, q, kk, v, a, b, A_log, dt_bias, out, None, True, slots[g], -1)

    return steps, k, update_bytes(s, s_bytes)


class ReplayPool:
    """A rotating pool of GDN (or KDA: s.family) replay caches for one setup: k slot groups of `batch`
    slots, random checkpoints (fp32 unless given), an optional read copy (make_read_copy's of the
    checkpoint), full buffers of plausible entries (log decays g < 0, per key channel for KDA, beta in
    (0, 1)), cursors at 0 (stagger() spreads them), and the step launch (`staggered_flush`: the op's hint
    that the slots fold at different steps, as GDNCache(staggered_flush=True) passes it).

    The groups are counted on what a replay step reads of a row (the read copy, or the checkpoint), the
    bytes every step touches: counted on the checkpoint, an fp8 copy would rotate over only a quarter of
    the bytes, about one L2."""

    def __init__(self, s: Setup, read_copy_dtype=None, checkpoint_dtype=torch.float32, staggered_flush=False):
        from .. import ops
        self.s, self.rc_dtype, self.staggered_flush = s, read_copy_dtype, staggered_flush
        self.c_bytes = dtype_bytes(checkpoint_dtype)
        self.r_bytes = None if read_copy_dtype is None else dtype_bytes(read_copy_dtype)
        self.fp8 = read_copy_dtype == torch.float8_e4m3fn
        self.k = k = s.groups(s.state_elems * (self.c_bytes if self.r_bytes is None else self.r_bytes))
        S = k * s.batch
        self.ck = (torch.randn(S, s.HV, s.V, s.K, device=DEVICE) * 0.1).to(checkpoint_dtype)
        self.rc = self.rs = None
        if read_copy_dtype is not None:
            self.rc = torch.empty(S, s.HV, s.V, s.K, device=DEVICE, dtype=read_copy_dtype)
            self.rs = torch.empty(S, s.HV, s.V, device=DEVICE) if self.fp8 else None
            ops.make_read_copy(self.ck, self.rc, self.rs, backend="cuda")
        self.k_buf = torch.randn(S, s.H, s.L, s.K, device=DEVICE).to(s.act)
        self.v_buf = torch.randn(S, s.HV, s.L, s.V, device=DEVICE).to(s.act)
        self.g_buf = -(0.02 + 0.5 * torch.rand(S, s.HV, s.L, *s.gate, device=DEVICE))
        self.beta_buf = torch.rand(S, s.HV, s.L, device=DEVICE)
        self.u_buf = torch.randn(S, s.HV, s.L, s.V, device=DEVICE) * 0.1
        self.cursors = torch.zeros(S, dtype=torch.int32, device=DEVICE)
        self.verified = torch.zeros(S, dtype=torch.int32, device=DEVICE)
        self.A_log, self.dt_bias = weights(s)
        self.slots = _slot_groups(s, k)

    @property
    def cache(self) -> tuple:
        """The cache arguments of step and flush."""
        return (self.ck, self.rc, self.rs, self.k_buf, self.v_buf, self.g_buf, self.beta_buf, self.u_buf, self.cursors)

    @property
    def spec_cache(self) -> tuple:
        """The cache arguments of verify and commit."""
        return (*self.cache, self.verified)

    def stagger(self, cursors=None):
        """Set the cursors (or `cursors`) to slot % L, by the op the cache uses (the buffers stay as they are)."""
        from .. import ops
        ops.stagger_cursors([], self.cursors if cursors is None else cursors, self.s.L, backend="cuda")

    def record_steps(self, inputs, out):
        """One step (<family>_step) per input set, slot group i % k for the i-th."""
        step = self.s.op("step")
        for i, (q, k, v, a, b) in enumerate(inputs):
            step(*self.cache, q, k, v, a, b, self.A_log, self.dt_bias, out, None, True, 1, self.slots[i % self.k], -1,
                 self.staggered_flush)

    def step_bytes(self, w: int) -> int:
        """Bytes one step at cursor w moves for the whole batch (the byte model in the module doc)."""
        return step_bytes(self.s, w, self.c_bytes, self.r_bytes, self.fp8)


# ---- flash-linear-attention -------------------------------------------------------------------------

FLA_ROWS = {"vk": "fla fused_recurrent [V,K]", "kv": "fla fused_recurrent [K,V]"}


@dataclass(frozen=True)
class Fla:
    """What the installed fla offers: its fused_recurrent_gated_delta_rule, its version, the keyword of its
    [V, K] state layout (None: no such option) and whether it takes the gates' raw inputs (A_log,
    dt_bias, the sigmoid of beta in the kernel, as ours does)."""
    fn: object
    version: str
    v_first_keyword: str | None
    gates_in_kernel: bool


@functools.lru_cache(maxsize=None)
def load_fla() -> Fla | str:
    """The installed flash-linear-attention (fla-core) as an Fla, or why it cannot be used (a text)."""
    try:
        import fla
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as exc:  # not installed, or triton / its driver failing at import (e.g. no GPU)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    params = inspect.signature(fused_recurrent_gated_delta_rule).parameters
    v_first = next((kw for kw in ("state_v_first", "transpose_state_layout") if kw in params), None)
    gates = all(kw in params for kw in ("use_gate_in_kernel", "A_log", "dt_bias", "use_beta_sigmoid_in_kernel"))
    return Fla(fused_recurrent_gated_delta_rule, str(getattr(fla, "__version__", "unknown")), v_first, gates)


def measure_fla(s: Setup, v_first: bool) -> Measurement:
    """Seconds per step of fla's fused_recurrent_gated_delta_rule at T = 1 over a rotating pool: fp32
    states in its [V, K] (v_first) or default [K, V] layout, given as initial_state (each group's slots
    are contiguous), the final state written to the new tensor it returns (out of place, no slot
    indices: every group's is kept until the measurement ends, so each group writes memory of its own, as
    an in-place update does, not lines the previous group left in L2); q and k L2-normalised in the
    kernel. Where fla takes the gates' raw inputs, as ours does, g and beta are computed in its kernel;
    else beforehand, outside the timed graph."""
    import torch.nn.functional as F
    fla = load_fla()
    if isinstance(fla, str):
        raise RuntimeError(f"flash-linear-attention is not usable here: {fla}")
    if v_first and fla.v_first_keyword is None:
        raise RuntimeError(f"fla {fla.version}'s fused_recurrent_gated_delta_rule has no [V, K] state option")
    k = s.groups(s.state_elems * 4)
    layout = (s.V, s.K) if v_first else (s.K, s.V)
    state = torch.randn(k * s.batch, s.HV, *layout, device=DEVICE) * 0.1
    A_log, dt_bias = weights(s)
    inputs = []
    for q, kk, v, a, b in make_inputs(s, k):
        if fla.gates_in_kernel:
            gates = {"g": a[:, None], "beta": b[:, None], "use_gate_in_kernel": True, "A_log": A_log,
                     "dt_bias": dt_bias, "use_beta_sigmoid_in_kernel": True}
        else:
            g = -torch.exp(A_log) * F.softplus(a.float() + dt_bias)
            gates = {"g": g[:, None], "beta": torch.sigmoid(b.float())[:, None]}
        inputs.append((q[:, None], kk[:, None], v[:, None], gates))
    layout_kw = {fla.v_first_keyword: True} if v_first else {}
    finals = []

    def steps():
        finals.clear()
        for g in range(k):
            q, kk, v, gates = inputs[g]
            _, final = fla.fn(q, kk, v, initial_state=state[g * s.batch:(g + 1) * s.batch], output_final_state=True,
                              use_qk_l2norm_in_kernel=True, **gates, **layout_kw)
            finals.append(final)

    seconds, kernels = timing.timed(steps, k)
    return Measurement(seconds, update_bytes(s, 4), kernels=kernels)


def fla_rows(checkpoint_names) -> tuple[list, list]:
    """(the fla row kinds to plan, notes on them and on those left out) for these checkpoint dtypes."""
    fla = load_fla()
    if isinstance(fla, str):
        return [], [f"fla rows skipped: flash-linear-attention (fla-core, needs triton and einops) is not "
                    f"importable here ({fla})"]
    kinds, notes = ["vk", "kv"], [f"fla rows: flash-linear-attention {fla.version} fused_recurrent_gated_delta_rule, "
                                  f"T = 1, fp32 state, its final state a new tensor (out of place, no slots)"]
    if fla.v_first_keyword is None:
        kinds = ["kv"]
        notes.append(f"fla {fla.version} has no [V, K] state option: its [V, K] row is skipped")
    if not fla.gates_in_kernel:
        notes.append(f"fla {fla.version} takes g and beta computed: they are computed outside the timed graph")
    if any(c != "float32" for c in checkpoint_names):
        notes.append("fla rows only with a float32 state (fla's final state is fp32)")
    return kinds, notes


# ---- measurements -----------------------------------------------------------------------------------

def measure_update(s: Setup, state_dtype=torch.float32) -> Measurement:
    """Seconds per step of the update (<family>_update) and the bytes it moves per step."""
    record, k, nbytes = conventional_steps(s, state_dtype)
    seconds, kernels = timing.timed(record, k)
    return Measurement(seconds, nbytes, kernels=kernels)


def measure_cycle(s: Setup, read_copy_dtype, checkpoint_dtype=torch.float32, staggered=False) -> Measurement:
    """Seconds per step of <family>_step over whole L-step cycles: a graph steps every slot group L times, and
    replays go on from where the previous one left the cursors. Lock-step: every cursor starts at 0, so
    all rows fold in the same step; staggered: the cursors start at slot % L and the steps pass the
    staggered_flush hint, so about batch / L rows fold in every step."""
    pool = ReplayPool(s, read_copy_dtype, checkpoint_dtype, staggered_flush=staggered)
    if staggered:
        pool.stagger()
    per_graph = pool.k * s.L
    inputs = make_inputs(s, per_graph)
    out = torch.empty(s.batch, s.HV, s.V, device=DEVICE, dtype=s.act)
    seconds, kernels = timing.timed(lambda: pool.record_steps(inputs, out), per_graph)
    return Measurement(seconds, cycle_bytes(s, pool.c_bytes, pool.r_bytes, pool.fp8), kernels=kernels)


def measure_phase(s: Setup, read_copy_dtype, w: int, checkpoint_dtype=torch.float32) -> Measurement:
    """Seconds per step of <family>_step with every cursor at w (reset before every replay): w < L - 1 is a
    replay step, w = L - 1 the step in which every row folds."""
    pool = ReplayPool(s, read_copy_dtype, checkpoint_dtype)
    inputs = make_inputs(s, pool.k)
    out = torch.empty(s.batch, s.HV, s.V, device=DEVICE, dtype=s.act)
    seconds, kernels = timing.timed(lambda: pool.record_steps(inputs, out), pool.k,
                                    before_replay=lambda: pool.cursors.fill_(w))
    return Measurement(seconds, pool.step_bytes(w), kernels=kernels)


def measure_cycle_steps(s: Setup, read_copy_dtype, staggered: bool, checkpoint_dtype=torch.float32) -> Measurement:
    """Each of the L steps of a cycle timed on its own, every row's cursor set before each replay to where
    that step finds it (lock-step: all rows at w = c in step c; staggered: slot s at (s % L + c) % L, with
    the op's hint): the mean step (µs, bytes) and the slowest step (extra columns)."""
    pool = ReplayPool(s, read_copy_dtype, checkpoint_dtype, staggered_flush=staggered)
    phase = torch.zeros_like(pool.cursors)
    if staggered:
        pool.stagger(phase)
    inputs = make_inputs(s, pool.k)
    out = torch.empty(s.batch, s.HV, s.V, device=DEVICE, dtype=s.act)
    slot_phase = phase.cpu()                                   # every slot of the pool is stepped once
    steps = []
    for c in range(s.L):
        start = (phase + c) % s.L
        t = timing.time_graph(lambda: pool.record_steps(inputs, out),
                              before_replay=lambda: pool.cursors.copy_(start)) / pool.k
        ws = ((slot_phase + c) % s.L).tolist()
        steps.append((t, rows_step_bytes(s, ws, pool.c_bytes, pool.r_bytes, pool.fp8)))
    mean = sum(t for t, _ in steps) / len(steps)
    slowest = max(t for t, _ in steps)
    return Measurement(mean, sum(b for _, b in steps) / len(steps),
                       extra={"slowest µs": slowest * 1e6, "slowest/mean": slowest / mean})


def measure_snapshots(s: Setup) -> Measurement:
    """Seconds per round of <family>_update_snapshots (fp32 state, T tokens, one snapshot per token) and the
    bytes it moves per round."""
    k = s.groups((1 + s.T) * s.state_elems * 4)
    state = torch.randn(k * s.batch, s.HV, s.V, s.K, device=DEVICE) * 0.1
    A_log, dt_bias = weights(s)
    inputs = make_inputs(s, k, tokens=s.T)
    slots = _slot_groups(s, k)
    # One snapshot buffer per group, poisoned: the kernel must overwrite every element it reports.
    snaps = [torch.full((s.batch, s.T, s.HV, s.V, s.K), float("nan"), device=DEVICE) for _ in range(k)]
    out = torch.empty(s.batch, s.T, s.HV, s.V, device=DEVICE, dtype=s.act)
    update_snapshots = s.op("update_snapshots")

    def rounds():
        for g in range(k):
            q, kk, v, a, b = inputs[g]
            update_snapshots(state, q, kk, v, a, b, A_log, dt_bias, out, snaps[g], None, True, slots[g], -1)

    seconds, kernels = timing.timed(rounds, k)
    if torch.isnan(snaps[0][0, -1, 0, 0, 0]).item():
        raise RuntimeError(f"{s.family}_update_snapshots left its output unwritten")
    return Measurement(seconds, snapshot_bytes(s), extra={"tokens/s": s.tokens_per_round() / seconds}, kernels=kernels)


def measure_verify_commit(s: Setup, read_copy_dtype, breakdown=False) -> Measurement:
    """Seconds per lock-step round of verify(T) + commit(num_accepted) on an fp32 checkpoint, num_accepted
    uniform in [1, T] per row, drawn on the device before every replay (outside the timed region). With
    breakdown, also verify alone and commit alone: the same rounds with one op captured, timed after the
    whole rounds so the cursors are spread as in them (commit alone moves them as it does there: every
    slot's verified count is set to T before each replay, as the verify of a round leaves it); verify's
    GB/s is its byte model at the mean cursor it found."""
    pool = ReplayPool(s, read_copy_dtype)
    k = pool.k
    inputs = make_inputs(s, k, tokens=s.T)
    accepted = [torch.ones(s.batch, dtype=torch.int32, device=DEVICE) for _ in range(k)]
    out = torch.empty(s.batch, s.T, s.HV, s.V, device=DEVICE, dtype=s.act)
    verify_op, commit_op = s.op("verify"), s.op("commit")

    def verify(g):
        q, kk, v, a, b = inputs[g]
        verify_op(*pool.spec_cache, q, kk, v, a, b, pool.A_log, pool.dt_bias, out, None, True, pool.slots[g], -1)

    def commit(g):
        commit_op(*pool.spec_cache, accepted[g], s.T, True, pool.slots[g], -1)

    def rounds():
        for g in range(k):
            verify(g)
            commit(g)

    def draw_acceptance():
        for acc in accepted:
            acc.random_(1, s.T + 1)

    def draw_verified_acceptance():
        draw_acceptance()
        pool.verified.fill_(s.T)

    whole, kernels = timing.timed(rounds, k, before_replay=draw_acceptance)
    extra = {"tokens/s": s.tokens_per_round() / whole}
    if breakdown:
        commit_only = timing.time_graph(lambda: [commit(g) for g in range(k)],
                                        before_replay=draw_verified_acceptance) / k
        mean_w = pool.cursors.float().mean().item()
        verify_only = timing.time_graph(lambda: [verify(g) for g in range(k)]) / k
        read_bytes = 4 if read_copy_dtype is None else dtype_bytes(read_copy_dtype)
        extra.update({"verify µs": verify_only * 1e6,
                      "verify GB/s": verify_bytes(s, mean_w, read_bytes, pool.fp8) / verify_only / 1e9,
                      "commit µs": commit_only * 1e6})
    return Measurement(whole, None, extra=extra, kernels=kernels)


# ---- plans ------------------------------------------------------------------------------------------

def _kernel_limit(d, checkpoint_dtype, copy_dtype, act, update=False, family="gdn", L=None, T=None) -> str | None:
    """Why this build has no kernel for these dims and dtypes (and, for the replay ops, this buffer length
    L; T: verify's drafts or the snapshot op's tokens), or None. The ops' own rule (ops.gdn_kernel_limit,
    which sends what it names to the reference), asked of tensors on the meta device: no GPU, nothing
    allocated. The cases it refuses are noted, never timed (the set-ups call the CUDA kernels directly)."""
    from .. import ops

    def meta(*shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device="meta")

    gate = gate_shape(family, d.K)
    checkpoint = meta(1, d.HV, d.V, d.K, dtype=checkpoint_dtype)
    weights = (meta(d.HV), meta(d.HV, *gate))
    if update:
        snapshots = None if T is None else meta(1, T, d.HV, d.V, d.K, dtype=checkpoint_dtype)
        return ops.gdn_kernel_limit(checkpoint, None, meta(1, d.H, d.K, dtype=act), weights=weights, T=T,
                                    snapshots=snapshots, family=family)
    read_copy = None if copy_dtype is None else meta(1, d.HV, d.V, d.K, dtype=copy_dtype)
    buffers = (meta(1, d.HV, L, *gate), meta(1, d.HV, L), meta(1, d.HV, L, d.V))
    return ops.gdn_kernel_limit(checkpoint, read_copy, meta(1, d.H, L, d.K, dtype=act), buffers=buffers,
                                weights=weights, T=T, family=family)


def _note(notes: list, text: str) -> None:
    if text not in notes:
        notes.append(text)


CYCLE_ROWS = {"update": "update", "fla": None, "lockstep": "lock-step cycle", "staggered": "staggered cycle",
              "step": None, "fold": "fold step", "lockstep-steps": "lock-step steps",
              "staggered-steps": "staggered steps"}
DEFAULT_CYCLE_ROWS = ("update", "fla", "lockstep", "staggered")


def cycle_rows(family: str) -> dict:
    """The cycle rows a family offers: fla's rows are GDN's only."""
    return CYCLE_ROWS if family == "gdn" else {k: v for k, v in CYCLE_ROWS.items() if k != "fla"}


def default_cycle_rows(family: str) -> list:
    """The rows a family's cycle plan takes without --rows: DEFAULT_CYCLE_ROWS it offers."""
    return [k for k in DEFAULT_CYCLE_ROWS if k in cycle_rows(family)]


def plan_cycle(args, dims_list, family="gdn"):
    act = ACTIVATION_DTYPES[args.activation_dtype]
    chosen = args.rows or default_cycle_rows(family)
    kinds = [k for k in CYCLE_ROWS if k in chosen and k not in ("update", "fla")]
    cases, notes = [], []
    fla_kinds = []
    if "fla" in chosen and family == "gdn":
        fla_kinds, fla_notes = fla_rows(args.checkpoint_dtype)
        notes += fla_notes
    for ck_name in args.checkpoint_dtype:
        ck = STATE_DTYPES[ck_name]
        for d in dims_list:
            limit = _kernel_limit(d, ck, None, act, update=True, family=family)
            if limit is not None:
                _note(notes, f"{d.label} with a {ck_name} state skipped: {limit}")
                continue
            for batch in args.batches:
                s = Setup.of(d, batch, args.buffer_len, act, family=family)
                common = {"checkpoint": ck_name, "L": s.L, "activations": args.activation_dtype}
                meta = {"dims": d.text()}
                base = {"dims": d.label, "batch": batch, "row": "update", "copy": "-", **common}
                cases.append(Case(base, functools.partial(measure_update, s, ck), baseline=base, meta=meta))
                if ck_name == "float32":
                    for layout in fla_kinds:
                        cfg = {"dims": d.label, "batch": batch, "row": FLA_ROWS[layout], "copy": "-", **common}
                        cases.append(Case(cfg, functools.partial(measure_fla, s, layout == "vk"), baseline=base,
                                          overridable=False, meta=dict(meta, fla=load_fla().version)))
                for copy in args.copies:
                    rc = COPIES[copy]
                    limit = _kernel_limit(d, ck, rc, act, family=family, L=s.L)
                    if limit is not None:
                        _note(notes, f"{copy} copy with a {ck_name} checkpoint skipped at {d.label}: {limit}")
                        continue
                    for kind in kinds:
                        label = CYCLE_ROWS[kind] or f"step w={s.L // 2}"
                        if kind in ("lockstep", "staggered"):
                            fn = functools.partial(measure_cycle, s, rc, ck, kind == "staggered")
                        elif kind == "step":
                            fn = functools.partial(measure_phase, s, rc, s.L // 2, ck)
                        elif kind == "fold":
                            fn = functools.partial(measure_phase, s, rc, s.L - 1, ck)
                        else:
                            fn = functools.partial(measure_cycle_steps, s, rc, kind == "staggered-steps", ck)
                        extras = ("slowest µs", "slowest/mean") if kind.endswith("-steps") else ()
                        cfg = {"dims": d.label, "batch": batch, "row": label, "copy": copy, **common}
                        cases.append(Case(cfg, fn, baseline=base, extras=extras, meta=meta))
    return cases, notes


def plan_spec(args, dims_list, family="gdn"):
    act = ACTIVATION_DTYPES[args.activation_dtype]
    cases, notes = [], []
    for d in dims_list:
        limit = _kernel_limit(d, torch.float32, None, act, update=True, family=family, T=args.tokens)
        if limit is not None:
            _note(notes, f"{d.label} skipped: {limit}")
            continue
        for batch in args.batches:
            s = Setup.of(d, batch, args.buffer_len, act, T=args.tokens, family=family)
            common = {"T": s.T, "L": s.L, "activations": args.activation_dtype}
            base = {"dims": d.label, "batch": batch, "row": "snapshots (conventional)", "copy": "-", **common}
            cases.append(Case(base, functools.partial(measure_snapshots, s), baseline=base, extras=("tokens/s",),
                              meta={"dims": d.text()}))
            for copy in args.copies:
                rc = COPIES[copy]
                limit = _kernel_limit(d, torch.float32, rc, act, family=family, L=s.L, T=s.T)
                if limit is not None:
                    _note(notes, f"{copy} copy skipped at {d.label}: {limit}")
                    continue
                extras = ("tokens/s",) + (("verify µs", "verify GB/s", "commit µs") if args.breakdown else ())
                cfg = {"dims": d.label, "batch": batch, "row": "verify + commit", "copy": copy, **common}
                cases.append(Case(cfg, functools.partial(measure_verify_commit, s, rc, args.breakdown), baseline=base,
                                  extras=extras, meta={"dims": d.text()}))
    return cases, notes


# ---- command-line options ---------------------------------------------------------------------------

def _add_activation(parser):
    parser.add_argument("--activation-dtype", choices=list(ACTIVATION_DTYPES), default="bfloat16", metavar="DTYPE",
                        help=f"q, k, v, a, b and out: {', '.join(ACTIVATION_DTYPES)} (default bfloat16)")


def _cycle_arguments(parser, family="gdn"):
    _add_activation(parser)
    parser.add_argument("--checkpoint-dtype", nargs="+", choices=list(STATE_DTYPES), default=["float32"],
                        metavar="DTYPE", help=f"checkpoint dtype of the replay rows and state dtype of the update: "
                                              f"{', '.join(STATE_DTYPES)} (default float32)")
    rows = cycle_rows(family)
    fla = ("fla = flash-linear-attention's fused_recurrent with a [V, K] and a [K, V] state (where fla imports; "
           "fp32 state); " if "fla" in rows else "")
    default = " ".join(default_cycle_rows(family))
    parser.add_argument("--rows", nargs="+", choices=list(rows), default=None, metavar="ROW",
                        help=f"rows per (dims, batch, copy), of {', '.join(rows)}: {fla}lockstep / staggered = "
                             "whole L-step cycles (mean step); step = every row at w = L/2; fold = every row "
                             "folds; lockstep-steps / staggered-steps = each step of a cycle timed alone (mean "
                             f"and slowest). The update (the baseline) is always measured. Default: {default}")


def _spec_arguments(parser):
    _add_activation(parser)
    parser.add_argument("--tokens", type=int, default=4, help="draft tokens T verified per round (default 4)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time verify alone and commit alone (extra columns)")


def check_args(bench_name: str, args) -> None:
    """Cross-option checks (ValueError naming the option)."""
    if bench_name == "spec":
        check_tokens(args)


CYCLE_DOC = ("µs per step: the conventional update (the baseline: our gdn_update, state read and written every "
             "step; and flash-linear-attention's fused_recurrent_gated_delta_rule with a [V, K] and its default "
             "[K, V] state, where fla imports) and the ReplaySSM step (gdn_step, read copy none / bf16 / fp8) over "
             "whole L-step cycles, lock-step (all rows fold in the same step) and staggered (rows fold in "
             "different steps, as under continuous batching: the serving case). Byte models: python -m "
             "replayssm_cuda bench gdn cycle --help. Explicit dims, e.g. H=16,HV=32,K=64,V=64, give the K = V "
             "= 64 variants.")
SPEC_DOC = ("µs per speculative round of T draft tokens: the conventional snapshot step (the baseline: "
            "gdn_update_snapshots, the state read once and T snapshots written) against the ReplaySSM "
            "verify(T) + commit(num_accepted), num_accepted uniform in [1, T]; fp32 state / checkpoint. "
            "verify + commit has no byte model (its fold rate follows the acceptance): tokens/s = batch (T + 1) "
            "/ 2 per round.")

FAMILY = register(Family("gdn", "Gated DeltaNet (HV v-heads of V x K state, H q/k heads)", DIMS_TABLE))
FAMILY.add(Bench("cycle", "update (and fla) vs replay step cycles (lock-step and staggered)",
                 CYCLE_DOC + "\n\n" + __doc__, plan_cycle, _cycle_arguments, default_dims=DEFAULT_DIMS,
                 default_batches=DEFAULT_BATCHES,
                 needs_ops=("gdn_update", "gdn_step", "make_read_copy", "stagger_cursors"),
                 check=functools.partial(check_args, "cycle")))
FAMILY.add(Bench("spec", "conventional T-token snapshots vs verify(T) + commit", SPEC_DOC + "\n\n" + __doc__,
                 plan_spec, _spec_arguments, default_dims=DEFAULT_DIMS, default_batches=DEFAULT_BATCHES,
                 needs_ops=("gdn_update_snapshots", "gdn_verify", "gdn_commit", "make_read_copy"),
                 check=functools.partial(check_args, "spec")))
