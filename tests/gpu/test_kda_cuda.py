"""Compiled Kimi Delta Attention ops (kda_update, kda_update_snapshots, kda_step, kda_commit, kda_flush,
kda_materialize: GDN's kernels with the decay per v-head and key channel) against the fp64 reference
(replayssm_cuda.reference.delta_update / delta_step / delta_verify / delta_commit / ..., which take KDA's
a (batch, [T,] HV, K), dt_bias (HV, K) and g_buf (slots, HV, L, K)), called through torch.ops.replayssm
directly. The step: fold cycles at L in {1, 2, 5, 16} (64 at K = 64), read copies, graph replay bitwise
eager, strided pools; the fold: speculative rounds (verify through replayssm_cuda.ops, the kernel where
compiled) with random accepted counts committed by kda_commit, then kda_materialize and kda_flush.

Shapes: kimi-linear (H = HV = 32, K = V = 128), K = V = 64 and the mixed (K, V) pairs with 1-3 v-heads a
k-head; odd batch sizes. Everywhere: pad and out-of-range rows get zero output and touch nothing, slots
no row names stay bit-identical, strided slot pools, a strided a (its key channels apart) and int32 /
int64 slots give the bits of the plain layout, CUDA-graph replay is bitwise eager, batch 0 launches
nothing. KDACache at buffer_len 1 (its step is the conventional update) runs the kernel.

Tolerances as tests/gpu/test_gdn_cuda.py: outputs stored in bf16 / fp16, compared norm-wise over the
valid rows (8e-3); fp32 states at fp32 rounding, 16-bit ones against the reference state as the GPU
stores it after every step.
"""

import warnings

import pytest
import torch

from replayssm_cuda import DeltaRuleWeights, KDACache, ops, reference

DEV = "cuda"

# (H, HV, K, V)
KIMI = (32, 32, 128, 128)      # Kimi Linear's KDA layers
SMALL = (2, 4, 64, 64)
KV_64_128 = (2, 6, 64, 128)    # 3 v-heads a k-head
KV_128_64 = (3, 3, 128, 64)    # one v-head a k-head
DIMS = [KIMI, SMALL, KV_64_128, KV_128_64]
DIM_IDS = ["kimi", "k64v64", "k64v128", "k128v64"]

STATE_TOL = {torch.float32: 5e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def op(name):
    # Looked up at call time: without the compiled extension the namespace has no such op (and the
    # conftest skips these tests).
    return getattr(torch.ops.replayssm, name)


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


class Layer:
    """Weights and per-token inputs of one KDA layer: dt_bias and a per v-head and key channel, so the
    channels of one head decay at rates between about e^-0.01 and e^-1 a token."""

    def __init__(self, dims, act=torch.bfloat16, seed=0, gate_dtype=None):
        self.H, self.HV, self.K, self.V = dims
        self.act = act
        self.gate_dtype = gate_dtype or act     # a, b: the activation dtype or fp32
        self.gen = torch.Generator().manual_seed(seed)
        self.A_log = torch.log(0.05 + 0.45 * torch.rand(self.HV, generator=self.gen))
        self.dt_bias = 0.5 * torch.randn(self.HV, self.K, generator=self.gen)

    def weights(self, dtype=torch.float32):
        return self.A_log.to(DEV, dtype), self.dt_bias.to(DEV, dtype)

    def tokens(self, batch, T=None):
        """(q, k, v, a, b) on the device: one token per row, or T tokens per row."""
        lead = (batch,) if T is None else (batch, T)
        g = self.gen
        q = torch.randn(*lead, self.H, self.K, generator=g)
        k = torch.randn(*lead, self.H, self.K, generator=g)
        v = torch.randn(*lead, self.HV, self.V, generator=g)
        a = torch.randn(*lead, self.HV, self.K, generator=g)
        b = torch.randn(*lead, self.HV, generator=g)
        act = [t.to(DEV, self.act) for t in (q, k, v)]
        return (*act, a.to(DEV, self.gate_dtype), b.to(DEV, self.gate_dtype))

    def states(self, num_slots, dtype):
        return (0.3 * torch.randn(num_slots, self.HV, self.V, self.K, generator=self.gen, dtype=torch.float64)).to(DEV, dtype)


def as64(*ts):
    return [t.double() for t in ts]


# ---- conventional update --------------------------------------------------------------------------

def run_update(layer, state, tok, slots, pad=-1, scale=None, l2=True, out=None):
    q, k, v, a, b = tok
    out = torch.full((q.shape[0], layer.HV, layer.V), float("nan"), dtype=layer.act, device=DEV) if out is None else out
    A_log, dt_bias = layer.weights()
    op("kda_update")(state, q, k, v, a, b, A_log, dt_bias, out, scale, l2, slots, pad)
    return out


def ref_update(layer, state64, tok, slots, pad=-1, scale=None, l2=True):
    q, k, v, a, b = as64(*tok)
    out = torch.empty(q.shape[0], layer.HV, layer.V, dtype=torch.float64, device=DEV)
    A_log, dt_bias = layer.weights(torch.float64)
    reference.delta_update(state64, q, k, v, a, b, A_log, dt_bias, out, scale, l2, slots, pad)
    return out


@pytest.mark.parametrize("dims", DIMS, ids=DIM_IDS)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
def test_update_matches_reference(dims, state_dtype, act):
    layer = Layer(dims, act, seed=1)
    num_slots = 8
    slots = torch.tensor([4, -1, 0, 6, 99, 2, 7], dtype=torch.int32, device=DEV)   # a pad and an out-of-range row
    valid, pads = [0, 2, 3, 5, 6], [1, 4]
    state = layer.states(num_slots, state_dtype)
    init = state.clone()
    ref_state = state.double()
    for step in range(3):
        tok = layer.tokens(len(slots))
        out = run_update(layer, state, tok, slots)
        ref_out = ref_update(layer, ref_state, tok, slots)
        assert torch.count_nonzero(out[pads]) == 0, "pad and out-of-range rows get zero output"
        assert rel_err(out[valid], ref_out[valid]) < 8e-3, f"step {step}"
        assert rel_err(state, ref_state) < STATE_TOL[state_dtype], f"state after step {step}"
        ref_state = state.double()          # the reference goes on from the state as the GPU stores it
    for s in (1, 3, 5):                     # slots no row names
        assert torch.equal(bits(state[s]), bits(init[s]))


# The split (gdn_update_split, which kda_update takes too: CTAs of 4 KB of state instead of 16 KB, the
# rule's choice at the smallest batches) changes no bit: every (K, V), state dtype and activation dtype, with pads, an out-of-range
# slot and slots no row names; the split's outputs and states also match the fp64 reference.
@pytest.mark.parametrize("dims", [KIMI, SMALL, KV_64_128, KV_128_64], ids=["kimi", "k64v64", "k64v128", "k128v64"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
def test_update_split_changes_no_bit(dims, state_dtype, act, set_overrides):
    layer = Layer(dims, act, seed=9)
    slots = torch.tensor([4, -1, 0, 6, 99, 2, 7], dtype=torch.int32, device=DEV)
    valid = [0, 2, 3, 5, 6]
    init = layer.states(8, state_dtype)
    steps = [layer.tokens(len(slots)) for _ in range(3)]
    results = []
    for split in (0, 1):
        set_overrides(gdn_update_split=split)
        state, outs = init.clone(), []
        for i, tok in enumerate(steps):
            ref_state = state.double()  # the reference steps from the state as the GPU stores it
            outs.append(run_update(layer, state, tok, slots))
            if split == 1:
                ref_out = ref_update(layer, ref_state, tok, slots)
                assert rel_err(outs[-1][valid], ref_out[valid]) < 8e-3, f"step {i}"
                assert rel_err(state, ref_state) < STATE_TOL[state_dtype], f"state after step {i}"
        results.append([bits(o) for o in outs] + [bits(state)])
        assert torch.equal(bits(state[[1, 3, 5]]), bits(init[[1, 3, 5]])), "slots no row names"
    assert all(torch.equal(a, b) for a, b in zip(results[1], results[0]))


# The decay is per key channel: a state whose channels decay at very different rates (one channel of
# each head kept, the others decayed to almost nothing) comes out as the reference says, and a GDN-like
# gate (every channel the same) as gdn_update with that scalar gate does.
def test_update_decays_each_key_channel():
    layer = Layer(SMALL, seed=7)
    H, HV, K, V = SMALL
    batch = 3
    state = layer.states(batch, torch.float32)
    ref_state = state.double()
    q, k, v, a, b = layer.tokens(batch)
    a = torch.full_like(a, -30.0)
    a[..., 5] = 30.0                        # channel 5 decays hard, the others hardly at all
    out = run_update(layer, state, (q, k, v, a, b), None)
    ref_out = ref_update(layer, ref_state, (q, k, v, a, b), None)
    assert rel_err(out, ref_out) < 8e-3 and rel_err(state, ref_state) < STATE_TOL[torch.float32]

    flat = layer.tokens(batch)
    scalar_a = flat[3][..., 0].float()
    gdn_state, kda_state = (layer.states(batch, torch.float32) for _ in range(2))
    kda_state.copy_(gdn_state)
    A_log, _ = layer.weights()
    dt_bias = torch.full((HV, K), 0.25, device=DEV)
    kda_out = torch.empty(batch, HV, V, dtype=layer.act, device=DEV)
    gdn_out = torch.empty_like(kda_out)
    op("kda_update")(kda_state, *flat[:3], scalar_a[..., None].expand(batch, HV, K), flat[4], A_log, dt_bias,
                     kda_out, None, True, None, -1)
    op("gdn_update")(gdn_state, *flat[:3], scalar_a, flat[4], A_log, dt_bias[:, 0].contiguous(), gdn_out, None,
                     True, None, -1)
    assert rel_err(kda_out, gdn_out) < 1e-2 and rel_err(kda_state, gdn_state) < 1e-6


# Without the L2 normalisation, with a scale of one's own, fp32 gate inputs, an `a` whose key channels
# are not adjacent, and an odd batch without a slot tensor (row r uses slot r).
@pytest.mark.parametrize("dims", [KIMI, SMALL], ids=["kimi", "k64v64"])
def test_update_options_match_reference(dims):
    layer = Layer(dims, seed=2, gate_dtype=torch.float32)
    batch, num_slots = 5, 7
    state = layer.states(num_slots, torch.float32)
    init = state.clone()
    ref_state = state.double()
    for l2, scale in ((False, 0.3), (True, 1.7), (False, None)):
        q, k, v, a, b = layer.tokens(batch)
        if not l2:
            q, k = (t / layer.K ** 0.5 for t in (q, k))
        a = torch.stack([a, torch.zeros_like(a)], dim=-1)[..., 0]   # channel stride 2
        assert a.stride(-1) == 2
        tok = (q, k, v, a, b)
        out = run_update(layer, state, tok, None, scale=scale, l2=l2)
        ref_out = ref_update(layer, ref_state, tok, None, scale=scale, l2=l2)
        assert rel_err(out, ref_out) < 8e-3, f"l2={l2} scale={scale}"
        assert rel_err(state, ref_state) < STATE_TOL[torch.float32]
    assert torch.equal(bits(state)[batch:], bits(init)[batch:]), "slots past the batch are not named"


# A slot-strided pool, a row-padded pool (state rows 2K apart), int64 slots and pad id 0: the bits of the
# plain layout; then a CUDA-graph replay of the same steps, bitwise eager.
@pytest.mark.parametrize("dims", [KIMI, KV_64_128], ids=["kimi", "k64v128"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_update_layouts_and_graph_are_bitwise_the_same(dims, state_dtype):
    layer = Layer(dims, seed=3)
    H, HV, K, V = dims
    num_slots = 6
    init = layer.states(num_slots, state_dtype)
    steps = [layer.tokens(5) for _ in range(3)]
    slots32 = torch.tensor([4, 1, 0, 5, 9], dtype=torch.int32, device=DEV)    # slot 0 is the pad id below

    def run(state, slots, pad):
        return [run_update(layer, state, tok, slots, pad) for tok in steps]

    want_state = init.clone()
    want = run(want_state, slots32, 0)
    assert all(torch.count_nonzero(o[[2, 4]]) == 0 for o in want), "pad id 0 and an out-of-range slot"
    assert torch.equal(bits(want_state[0]), bits(init[0])), "the pad slot is not touched"
    slot_pool = torch.zeros(num_slots, 2, HV, V, K, dtype=state_dtype, device=DEV)
    row_pool = torch.zeros(num_slots, HV, V, 2 * K, dtype=state_dtype, device=DEV)
    for state in (slot_pool[:, 1], row_pool[..., :K]):
        state.copy_(init)
        got = run(state, slots32.long(), 0)
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want)), f"strides {state.stride()}"
        assert torch.equal(bits(state), bits(want_state)), f"strides {state.stride()}"
    assert torch.count_nonzero(slot_pool[:, 0]) == 0 and torch.count_nonzero(row_pool[..., K:]) == 0

    state = init.clone()
    static = [t.clone() for t in steps[0]]
    static_out = torch.empty(5, HV, V, dtype=layer.act, device=DEV)
    A_log, dt_bias = layer.weights()
    run_update(layer, state.clone(), static, slots32, 0, out=static_out)     # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op("kda_update")(state, *static, A_log, dt_bias, static_out, None, True, slots32, 0)
    for tok, w in zip(steps, want):
        for s, n in zip(static, tok):
            s.copy_(n)
        graph.replay()
        assert torch.equal(bits(static_out), bits(w))
    assert torch.equal(bits(state), bits(want_state))


def test_update_batch_zero_launches_nothing():
    layer = Layer(KIMI, seed=4)
    state = layer.states(3, torch.float32)
    before = state.clone()
    q, k, v, a, b = layer.tokens(0)
    out = torch.empty(0, layer.HV, layer.V, dtype=layer.act, device=DEV)
    run_update(layer, state, (q, k, v, a, b), None, out=out)
    torch.cuda.synchronize()
    assert torch.equal(state, before)


# ---- snapshots (the conventional speculative baseline) -------------------------------------------

def run_snapshots(layer, state, tok, slots, pad=-1, out=None, snapshots=None):
    q, k, v, a, b = tok
    batch, T = q.shape[:2]
    if out is None:
        out = torch.full((batch, T, layer.HV, layer.V), float("nan"), dtype=layer.act, device=DEV)
    if snapshots is None:
        snapshots = torch.full((batch, T, layer.HV, layer.V, layer.K), float("nan"), dtype=state.dtype, device=DEV)
    A_log, dt_bias = layer.weights()
    op("kda_update_snapshots")(state, q, k, v, a, b, A_log, dt_bias, out, snapshots, None, True, slots, pad)
    return out, snapshots


@pytest.mark.parametrize("dims", DIMS, ids=DIM_IDS)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T", [1, 4, 16])
def test_snapshots_are_T_updates(dims, state_dtype, T):
    layer = Layer(dims, seed=5)
    num_slots = 6
    slots = torch.tensor([3, -1, 0, 77, 5], dtype=torch.int64, device=DEV)
    valid, pads = [0, 2, 4], [1, 3]
    state = layer.states(num_slots, state_dtype)
    before = bits(state).clone()
    tok = layer.tokens(len(slots), T)
    out, snaps = run_snapshots(layer, state, tok, slots)
    torch.cuda.synchronize()
    assert torch.equal(bits(state), before), "the state is only read"
    assert torch.count_nonzero(out[pads]) == 0 and torch.count_nonzero(snaps[pads]) == 0, "pad rows: zeros"
    # Token by token: the reference update from the previous snapshot as stored (exactly T updates).
    work = state[slots[valid]].double()
    rows = torch.arange(len(valid), device=DEV)
    for t in range(T):
        step_tok = [x[valid, t] for x in tok]
        ref_out = ref_update(layer, work, step_tok, rows)
        assert rel_err(out[valid, t], ref_out) < 8e-3, f"token {t}"
        assert rel_err(snaps[valid, t], work) < STATE_TOL[state_dtype], f"snapshot {t}"
        work = snaps[valid, t].double()


# Token by token the snapshots are kda_update's states, bit for bit (the same arithmetic, the state
# rounded to its dtype after every token).
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_snapshots_are_bitwise_the_updates(state_dtype):
    layer = Layer(KV_128_64, seed=8)
    state = layer.states(4, state_dtype)
    slots = torch.tensor([1, 3], dtype=torch.int32, device=DEV)
    tok = layer.tokens(2, 5)
    out, snaps = run_snapshots(layer, state, tok, slots)
    work = state.clone()
    for t in range(5):
        o = run_update(layer, work, [x[:, t] for x in tok], slots)
        assert torch.equal(bits(o), bits(out[:, t])), f"token {t}"
        assert torch.equal(bits(work[slots.long()]), bits(snaps[:, t])), f"snapshot {t}"


def test_snapshots_strided_pool_and_graph_are_bitwise_the_same():
    layer = Layer(KIMI, seed=6)
    H, HV, K, V = KIMI
    state = layer.states(4, torch.float32)
    slots = torch.tensor([2, 0, -1], dtype=torch.int32, device=DEV)
    tok = layer.tokens(3, 4)
    want_out, want_snaps = run_snapshots(layer, state, tok, slots)
    pool = torch.zeros(4, 3, HV, V, K, device=DEV)
    pool[:, 2].copy_(state)
    snap_pool = torch.zeros(3, 4, HV, V, 2 * K, device=DEV)
    out, snaps = run_snapshots(layer, pool[:, 2], tok, slots, snapshots=snap_pool[..., :K])
    assert torch.equal(bits(out), bits(want_out)) and torch.equal(bits(snaps), bits(want_snaps))
    assert torch.count_nonzero(snap_pool[..., K:]) == 0

    static = [t.clone() for t in tok]
    static_out, static_snaps = run_snapshots(layer, state, static, slots)   # warm-up outside the graph
    A_log, dt_bias = layer.weights()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op("kda_update_snapshots")(state, *static, A_log, dt_bias, static_out, static_snaps, None, True, slots, -1)
    new = layer.tokens(3, 4)
    for s, n in zip(static, new):
        s.copy_(n)
    graph.replay()
    eager_out, eager_snaps = run_snapshots(layer, state, new, slots)
    assert torch.equal(bits(static_out), bits(eager_out)) and torch.equal(bits(static_snaps), bits(eager_snaps))


# ---- the cache ----------------------------------------------------------------------------------------

# KDACache at buffer_len 1 steps with the conventional update: the compiled kda_update, bit for bit the op.
def test_kda_cache_at_buffer_len_one_runs_the_kernel():
    layer = Layer(KIMI, seed=9)
    A_log, dt_bias = layer.weights()
    weights = DeltaRuleWeights(A_log=A_log, dt_bias=dt_bias)
    with warnings.catch_warnings():         # the fallback warning of any replay op this build lacks
        warnings.simplefilter("ignore", RuntimeWarning)
        cache = KDACache(4, layer.H, layer.HV, layer.K, layer.V, weights, buffer_len=1, device=DEV)
    assert cache._compiled["kda_update"], "the cache chose the kernel"
    init = layer.states(4, torch.float32)
    cache.load(init)
    state = init.clone()
    slots = torch.tensor([2, 0, 3], dtype=torch.int32, device=DEV)
    for _ in range(3):
        tok = layer.tokens(3)
        got = cache.step(*tok, slots=slots)
        want = run_update(layer, state, tok, slots)
        assert torch.equal(bits(got), bits(want))
    assert torch.equal(bits(cache.checkpoint), bits(state))


# ---- the replay step and the fold (kda_step, kda_commit, kda_flush, kda_materialize) -----------------

FP8 = torch.float8_e4m3fn
OUT_TOL = {None: 8e-3, torch.bfloat16: 1.5e-2, torch.float16: 1e-2, FP8: 4e-2}


class Cache:
    """The cache tensors of one KDA layer on the GPU (g_buf (slots, HV, L, K): a log decay per key
    channel) and an fp64 twin for the reference, started from the same checkpoint (as the GPU stores
    it). pool > 1: every tensor a view into a slot pool."""

    def __init__(self, layer, num_slots, L, ckpt=torch.float32, copy=None, mdt=1, init=None, pool=1):
        H, HV, K, V = layer.H, layer.HV, layer.K, layer.V
        self.layer, self.L, self.mdt, self.copy = layer, L, mdt, copy
        S = num_slots

        def make(shape, dtype):
            return torch.zeros(S, pool, *shape, dtype=dtype, device=DEV)[:, pool - 1]

        self.checkpoint = make((HV, V, K), ckpt)
        self.checkpoint.copy_(layer.states(S, ckpt) if init is None else init)
        self.read_copy = make((HV, V, K), copy) if copy is not None else None
        self.read_scale = make((HV, V), torch.float32) if copy == FP8 else None
        self.k_buf = make((H, L, K), layer.act)
        self.v_buf = make((HV, L, V), layer.act)
        self.g_buf = make((HV, L, K), torch.float32)
        self.beta_buf = make((HV, L), torch.float32)
        self.u_buf = make((HV, L, V), torch.float32)
        self.num_committed = torch.zeros(S, dtype=torch.int32, device=DEV)
        self.num_verified = torch.zeros(S, dtype=torch.int32, device=DEV)
        if copy is not None:
            op("make_read_copy")(self.checkpoint, self.read_copy, self.read_scale, None, -1)
        self.ref = [self.checkpoint.double(), None, None] + [torch.zeros(t.shape, dtype=torch.float64, device=DEV)
                                                             for t in (self.k_buf, self.v_buf, self.g_buf,
                                                                       self.beta_buf, self.u_buf)]
        self.ref_nc = self.num_committed.clone()
        self.ref_nv = self.num_verified.clone()
        if copy is not None:
            self.ref[1] = torch.empty(self.read_copy.shape, dtype=copy, device=DEV)
            self.ref[2] = torch.ones(self.read_scale.shape, device=DEV) if copy == FP8 else None
            reference.make_read_copy(self.ref[0], self.ref[1], self.ref[2])

    @property
    def tensors(self):
        return [t for t in (self.checkpoint, self.read_copy, self.read_scale, self.k_buf, self.v_buf, self.g_buf,
                            self.beta_buf, self.u_buf, self.num_committed, self.num_verified) if t is not None]

    def args(self):
        return (self.checkpoint, self.read_copy, self.read_scale, self.k_buf, self.v_buf, self.g_buf,
                self.beta_buf, self.u_buf, self.num_committed)

    def stagger(self, period):
        """Cursors s % period over zero (neutral) entries, in both caches."""
        start = (torch.arange(self.num_committed.shape[0], device=DEV) % period).to(torch.int32)
        self.num_committed.copy_(start)
        self.ref_nc.copy_(start)

    def step(self, tok, slots, pad=-1, out=None, staggered=False):
        q, k, v, a, b = tok
        out = torch.full((q.shape[0], self.layer.HV, self.layer.V), float("nan"), dtype=self.layer.act,
                         device=DEV) if out is None else out
        A_log, dt_bias = self.layer.weights()
        op("kda_step")(*self.args(), q, k, v, a, b, A_log, dt_bias, out, None, True, self.mdt, slots, pad, staggered)
        return out

    def ref_step(self, tok, slots, pad=-1):
        q, k, v, a, b = as64(*tok)
        out = torch.empty(q.shape[0], self.layer.HV, self.layer.V, dtype=torch.float64, device=DEV)
        A_log, dt_bias = self.layer.weights(torch.float64)
        reference.delta_step(*self.ref[:8], self.ref_nc, q, k, v, a, b, A_log, dt_bias, out, None, True, self.mdt,
                             slots, pad)
        return out

    def verify(self, tok, slots):
        """The drafts' entries through replayssm_cuda.ops.kda_verify (the kernel where this build has
        one, else the reference on these tensors), and the fp64 reference's."""
        q, k, v, a, b = tok
        A_log, dt_bias = self.layer.weights()
        out = torch.empty(*q.shape[:2], self.layer.HV, self.layer.V, dtype=self.layer.act, device=DEV)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ops.kda_verify(*self.args(), self.num_verified, q, k, v, a, b, A_log, dt_bias, out, None, True, slots, -1)
        ref_out = torch.empty(out.shape, dtype=torch.float64, device=DEV)
        A64, dt64 = self.layer.weights(torch.float64)
        reference.delta_verify(*self.ref[:8], self.ref_nc, self.ref_nv, *as64(q, k, v, a, b), A64, dt64, ref_out,
                               None, True, slots, -1)
        return out, ref_out

    def commit(self, accepted, slots):
        op("kda_commit")(*self.args(), self.num_verified, accepted, self.mdt, True, slots, -1, None)
        reference.delta_commit(*self.ref[:8], self.ref_nc, self.ref_nv, accepted, self.mdt, True, slots, -1)

    def sync_reference_checkpoint(self):
        self.ref[0].copy_(self.checkpoint.double())
        if self.copy is not None:
            self.ref[1].copy_(self.read_copy)
            if self.ref[2] is not None:
                self.ref[2].copy_(self.read_scale)

    def check_window(self, named, where):
        for s in named.tolist():
            if not 0 <= s < self.num_committed.shape[0]:
                continue
            w = int(self.num_committed[s])
            assert torch.equal(self.k_buf[s, :, :w].double(), self.ref[3][s, :, :w]), f"k_buf of slot {s} {where}"
            assert torch.equal(self.v_buf[s, :, :w].double(), self.ref[4][s, :, :w]), f"v_buf of slot {s} {where}"
            assert torch.allclose(self.g_buf[s, :, :w].double(), self.ref[5][s, :, :w], rtol=1e-5, atol=1e-7), where
            assert torch.allclose(self.beta_buf[s, :, :w].double(), self.ref[6][s, :, :w], rtol=1e-5, atol=1e-7), where
            if self.copy is None and w > 0:
                assert rel_err(self.u_buf[s, :, :w], self.ref[7][s, :, :w]) < 1e-4, f"u_buf of slot {s} {where}"

    def check_read_copy(self, slots):
        if self.copy is None:
            return
        want = torch.empty_like(self.read_copy)
        want_scale = None if self.read_scale is None else torch.empty_like(self.read_scale)
        op("make_read_copy")(self.checkpoint, want, want_scale, None, -1)
        assert torch.equal(bits(self.read_copy)[slots], bits(want)[slots]), "the fold's copy is make_read_copy's"
        if want_scale is not None:
            assert torch.equal(self.read_scale[slots], want_scale[slots])

    def check_state(self, where, tol=STATE_TOL):
        ck = self.checkpoint.dtype
        assert rel_err(self.checkpoint, self.ref[0]) < tol[ck], f"checkpoint {where}"
        if ck != torch.float32:
            self.sync_reference_checkpoint()


def step_and_compare(cache, tok, slots, valid, where, pad=-1):
    out = cache.step(tok, slots, pad)
    ref_out = cache.ref_step(tok, slots, pad)
    invalid = [r for r in range(len(tok[0])) if r not in valid]
    if invalid:
        assert torch.count_nonzero(out[invalid]) == 0, f"pad rows get zero output ({where})"
    assert rel_err(out[valid], ref_out[valid]) < OUT_TOL[cache.copy], where
    assert torch.equal(cache.num_committed, cache.ref_nc), f"cursors {where}"
    cache.check_window(torch.arange(len(tok[0]), device=DEV) if slots is None else slots, where)
    cache.check_state(where)
    return out


# Fold cycles at L in {1, 2, 5, 16} (and 64 at K = 64): 2.5 cycles of steps, every output, cursor, live
# window and checkpoint against the fp64 reference; the fold's read copy is make_read_copy's; slots no
# row names stay bit-identical.
CYCLES = [
    # dims, checkpoint, read copy, L, max_draft_tokens
    (KIMI, torch.float32, None, 16, 1),
    (KIMI, torch.float32, torch.bfloat16, 16, 4),
    (KIMI, torch.float32, FP8, 5, 1),
    (KIMI, torch.bfloat16, None, 5, 2),
    (SMALL, torch.float32, None, 1, 1),
    (SMALL, torch.float32, torch.float16, 2, 1),
    (SMALL, torch.bfloat16, FP8, 2, 2),
    (KV_64_128, torch.float32, None, 64, 1),
    (KV_128_64, torch.float16, None, 5, 1),
]


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dims,ck,rc,L,mdt", CYCLES)
def test_step_matches_reference_over_fold_cycles(dims, ck, rc, L, mdt, act):
    layer = Layer(dims, act, seed=L + mdt)
    cache = Cache(layer, 7, L, ck, rc, mdt)
    slots = torch.tensor([3, -1, 0, 6, 99], dtype=torch.int64, device=DEV)
    valid, untouched = [0, 2, 3], [1, 2, 4, 5]
    before = [bits(t)[untouched].clone() for t in cache.tensors]
    cycle = L - mdt + 1
    folds = 0
    for step in range(2 * cycle + cycle // 2 + 1):
        step_and_compare(cache, layer.tokens(len(slots)), slots, valid, f"at step {step}")
        if int(cache.num_committed[3]) == 0:
            folds += 1
            cache.check_read_copy(slots[valid])
    assert folds >= 2
    for t_before, t in zip(before, cache.tensors):
        assert torch.equal(t_before, bits(t)[untouched]), "a slot no row names changed"


# Every (checkpoint, read copy) pair with cursors staggered over the slots, so that in every launch some
# rows fold while the others replay, at K = 64 (3 v-heads a k-head) and K = V = 128.
CACHES = [(torch.float32, None), (torch.float32, torch.bfloat16), (torch.float32, torch.float16),
          (torch.float32, FP8), (torch.bfloat16, None), (torch.bfloat16, FP8), (torch.float16, None),
          (torch.float16, FP8)]
CACHE_IDS = ["fp32", "fp32-bf16", "fp32-fp16", "fp32-fp8", "bf16", "bf16-fp8", "fp16", "fp16-fp8"]


@pytest.mark.parametrize("dims", [KIMI, KV_64_128], ids=["kimi", "k64v128"])
@pytest.mark.parametrize("ck,rc", CACHES, ids=CACHE_IDS)
def test_step_every_cache_pair_with_staggered_folds(dims, ck, rc):
    layer = Layer(dims, seed=9)
    L, mdt, num_slots = 5, 2, 9
    cache = Cache(layer, num_slots, L, ck, rc, mdt)
    cache.stagger(L - mdt + 1)
    slots = torch.tensor([8, 1, 4, 0, 6, 3, 7], dtype=torch.int32, device=DEV)
    for step in range(2 * L):
        step_and_compare(cache, layer.tokens(len(slots)), slots, list(range(len(slots))), f"at step {step}")
        cache.check_read_copy(slots)


# The parts a step CTA takes of a (row, v-head)'s value rows (gdn_step_parts 1, 2, 4; V = 64 allows 2)
# change no bit: staggered fold cycles, an odd batch with a pad row, every output and cache tensor the
# same bits.
@pytest.mark.parametrize("dims", [KIMI, KV_128_64], ids=["kimi", "k128v64"])
@pytest.mark.parametrize("ck,rc", [(torch.float32, torch.bfloat16), (torch.float32, FP8), (torch.float32, None)],
                         ids=["fp32-bf16", "fp32-fp8", "fp32"])
def test_step_parts_change_no_bit(dims, ck, rc, set_overrides):
    layer = Layer(dims, seed=14)
    L, mdt, num_slots = 6, 2, 9
    init = layer.states(num_slots, ck)
    slots = torch.tensor([8, -1, 4, 0, 6, 3, 7], dtype=torch.int32, device=DEV)
    steps = [layer.tokens(len(slots)) for _ in range(2 * (L - mdt + 1) + 1)]
    results = []
    for parts in (1, 2, 4):
        set_overrides(gdn_step_parts=parts)
        cache = Cache(layer, num_slots, L, ck, rc, mdt, init=init)
        cache.stagger(L - mdt + 1)
        outs = [cache.step(tok, slots) for tok in steps]
        results.append([bits(o) for o in outs] + [bits(t) for t in cache.tensors])
    for parts, got in zip((2, 4), results[1:]):
        assert all(torch.equal(a, b) for a, b in zip(got, results[0])), f"gdn_step_parts={parts}"


# The order and fold-split tests' rows: L = 6 with 2 drafts, 11 slots, an even batch of 12 with a pad
# row, tokens for two fold cycles and a step.
def staggered_rows(layer, ck):
    L, mdt, num_slots = 6, 2, 11
    init = layer.states(num_slots, ck)
    slots = torch.tensor([10, -1, 4, 0, 6, 3, 7, 1, 9, 2, 5, 8], dtype=torch.int32, device=DEV)
    steps = [layer.tokens(len(slots)) for _ in range(2 * (L - mdt + 1) + 1)]
    return L, mdt, num_slots, init, slots, steps


# The order pass (gdn_step_order 1, under the staggered-flush hint) changes no bit: staggered fold cycles
# of an odd batch with a pad row.
@pytest.mark.parametrize("ck,rc", [(torch.float32, None), (torch.float32, FP8)], ids=["fp32", "fp32-fp8"])
def test_step_order_changes_no_bit(ck, rc, set_overrides):
    layer = Layer(KIMI, seed=17)
    L, mdt, num_slots, init, slots, steps = staggered_rows(layer, ck)
    results = []
    for order in (0, 1):
        set_overrides(gdn_step_order=order)
        cache = Cache(layer, num_slots, L, ck, rc, mdt, init=init)
        cache.stagger(L - mdt + 1)
        outs = [cache.step(tok, slots, staggered=True) for tok in steps]
        results.append([bits(o) for o in outs] + [bits(t) for t in cache.tensors])
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1]))


# The fold split (gdn_step_fold_parts 4: the first folding rows in 4 CTAs a v-head) changes no bit against
# the ordered launch without it: staggered fold cycles, then lock-step ones (more folds than split rows).
@pytest.mark.parametrize("ck,rc", [(torch.float32, None), (torch.float32, FP8)], ids=["fp32", "fp32-fp8"])
def test_step_fold_split_changes_no_bit(ck, rc, set_overrides):
    layer = Layer(KIMI, seed=19)
    L, mdt, num_slots, init, slots, steps = staggered_rows(layer, ck)
    results = []
    for fold_parts in (1, 4):  # 1: none (0 would be the rule)
        set_overrides(gdn_step_order=1, gdn_step_fold_parts=fold_parts)
        got = []
        for spread in (L - mdt + 1, 1):
            cache = Cache(layer, num_slots, L, ck, rc, mdt, init=init)
            cache.stagger(spread)
            got += [bits(o) for o in (cache.step(tok, slots, staggered=True) for tok in steps)]
            got += [bits(t) for t in cache.tensors]
        results.append(got)
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1]))


# The tile in chunks of 32 rows (gdn_step_tile_stages 1 / 2 / 4; an fp32 checkpoint without a copy)
# changes no bit against the whole tile: staggered fold cycles with a pad row, one and two parts a v-head.
@pytest.mark.parametrize("dims", [KIMI, KV_64_128], ids=["kimi", "k64v128"])
@pytest.mark.parametrize("parts", [1, 2])
def test_step_tile_chunks_change_no_bit(dims, parts, set_overrides):
    layer = Layer(dims, seed=23)
    L, mdt, num_slots, init, slots, steps = staggered_rows(layer, torch.float32)
    results = []
    for stages in (0, 1, 2, 4):
        set_overrides(gdn_step_parts=parts, gdn_step_tile_stages=stages)
        cache = Cache(layer, num_slots, L, torch.float32, None, mdt, init=init)
        cache.stagger(L - mdt + 1)
        outs = [cache.step(tok, slots, staggered=True) for tok in steps]
        results.append([bits(o) for o in outs] + [bits(t) for t in cache.tensors])
    for stages, got in zip((1, 2, 4), results[1:]):
        assert all(torch.equal(a, b) for a, b in zip(got, results[0])), f"gdn_step_tile_stages={stages}"


# A strided pool, int64 slots and pad id 0 give the bits of the plain layout with int32 slots; a CUDA
# graph of one step replayed over two cycles gives the bits of eager steps.
@pytest.mark.parametrize("ck,rc", [(torch.float32, None), (torch.float32, FP8), (torch.bfloat16, None)],
                         ids=["fp32", "fp32-fp8", "bf16"])
def test_step_layouts_and_graph_are_bitwise_the_same(ck, rc):
    layer = Layer(KIMI, seed=11)
    L, num_slots = 4, 6
    init = layer.states(num_slots, ck)
    plain = Cache(layer, num_slots, L, ck, rc, init=init)
    strided = Cache(layer, num_slots, L, ck, rc, init=init, pool=3)
    slots = torch.tensor([5, 0, 2, 1], dtype=torch.int32, device=DEV)      # slot 0 is the pad id
    steps = [layer.tokens(4) for _ in range(2 * L)]
    for tok in steps:
        a = plain.step(tok, slots, pad=0)
        b = strided.step(tok, slots.long(), pad=0)
        assert torch.equal(bits(a), bits(b))
        assert torch.count_nonzero(a[1]) == 0
    for x, y in zip(plain.tensors, strided.tensors):
        assert torch.equal(bits(x), bits(y))

    eager = Cache(layer, num_slots, L, ck, rc, init=init)
    graphed = Cache(layer, num_slots, L, ck, rc, init=init)
    static = [t.clone() for t in steps[0]]
    static_out = torch.empty(4, layer.HV, layer.V, dtype=layer.act, device=DEV)
    warm = Cache(layer, num_slots, L, ck, rc, init=init)
    warm.step(static, slots, out=static_out)                  # warm-up outside the graph
    A_log, dt_bias = layer.weights()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op("kda_step")(*graphed.args(), *static, A_log, dt_bias, static_out, None, True, 1, slots, -1, False)
    for tok in steps:
        for s, n in zip(static, tok):
            s.copy_(n)
        graph.replay()
        assert torch.equal(bits(static_out), bits(eager.step(tok, slots)))
    for x, y in zip(eager.tensors, graphed.tensors):
        assert torch.equal(bits(x), bits(y))


# As tests/gpu/test_gdn_spec_cuda.py: verify's outputs read the copy, and a round's checkpoint error
# builds up over folds of fp32 corrected values.
SPEC_OUT_TOL = {None: 8e-3, torch.bfloat16: 2e-2, torch.float16: 1e-2, FP8: 8e-2}
SPEC_CKPT_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


# Speculative rounds: verify (ops.kda_verify: the kernel where compiled) and a random accepted count,
# committed by kda_commit (its fold where the next verify would not fit), against the fp64 reference;
# then kda_materialize of every row and kda_flush.
SPEC = [
    # dims, checkpoint, read copy, L, max_draft_tokens
    (KIMI, torch.float32, None, 16, 4),
    (KIMI, torch.float32, torch.bfloat16, 16, 4),
    (KIMI, torch.bfloat16, FP8, 12, 4),
    (SMALL, torch.float32, torch.float16, 5, 3),
    (SMALL, torch.float32, None, 1, 1),
    (KV_128_64, torch.float32, None, 64, 16),
    (KV_64_128, torch.float16, FP8, 8, 2),
]


@pytest.mark.parametrize("dims,ck,rc,L,mdt", SPEC)
def test_spec_rounds_commit_flush_materialize_match_reference(dims, ck, rc, L, mdt):
    layer = Layer(dims, seed=L + 3 * mdt)
    num_slots = 6
    cache = Cache(layer, num_slots, L, ck, rc, mdt)
    slots = torch.tensor([4, 0, 5, 2], dtype=torch.int32, device=DEV)
    gen = torch.Generator().manual_seed(L)
    for rnd in range(3 * L // mdt + 2):
        T = int(torch.randint(1, mdt + 1, (1,), generator=gen))
        tok = layer.tokens(len(slots), T)
        out, ref_out = cache.verify(tok, slots)
        assert rel_err(out, ref_out) < SPEC_OUT_TOL[rc], f"verify output at round {rnd}"
        accepted = torch.randint(0, T + 1, (len(slots),), generator=gen).to(DEV)
        cache.commit(accepted, slots)
        assert torch.equal(cache.num_committed, cache.ref_nc), f"cursors at round {rnd}"
        assert torch.equal(cache.num_verified, cache.ref_nv), f"num_verified at round {rnd}"
        cache.check_state(f"at round {rnd}", SPEC_CKPT_TOL)
        cache.check_read_copy(slots)
    rows = torch.tensor([2, -1, 4, 0], dtype=torch.int64, device=DEV)
    got = torch.full((4, layer.HV, layer.V, layer.K), float("nan"), device=DEV)
    op("kda_materialize")(cache.checkpoint, cache.k_buf, cache.v_buf, cache.g_buf, cache.beta_buf, cache.u_buf,
                          cache.num_committed, got, True, rows, -1)
    want = torch.zeros(got.shape, dtype=torch.float64, device=DEV)
    reference.delta_materialize(cache.ref[0], *cache.ref[3:8], cache.ref_nc, want, True, rows, -1)
    assert torch.count_nonzero(got[1]) == 0, "a pad row's state is zero"
    assert rel_err(got, want) < SPEC_CKPT_TOL[torch.float32], "materialize"
    op("kda_flush")(*cache.args(), True, None, -1)
    reference.delta_flush(*cache.ref[:8], cache.ref_nc, True, None, -1)
    assert int(cache.num_committed.abs().sum()) == 0
    cache.check_state("after flush", SPEC_CKPT_TOL)
    cache.check_read_copy(torch.arange(num_slots, device=DEV))


# kda_verify + kda_commit captured in a CUDA graph and replayed across folds give the bits of eager calls.
@pytest.mark.parametrize("rc", [None, FP8], ids=["no-copy", "fp8-copy"])
def test_cuda_graph_verify_commit_is_bitwise_eager(rc):
    layer = Layer(KIMI, seed=3)
    T, batch, num_slots, L = 3, 4, 5, 8
    init = layer.states(num_slots, torch.float32)
    caches = [Cache(layer, num_slots, L, torch.float32, rc, mdt=4, init=init) for _ in range(2)]
    slots = torch.tensor([2, 0, -1, 4], dtype=torch.int32, device=DEV)
    A_log, dt_bias = layer.weights()
    static_in = list(layer.tokens(batch, T))
    static_acc = torch.zeros(batch, dtype=torch.int32, device=DEV)
    static_out = torch.empty(batch, T, layer.HV, layer.V, dtype=layer.act, device=DEV)

    def spec(c, inputs, accepted, out):
        op("kda_verify")(*c.args(), c.num_verified, *inputs, A_log, dt_bias, out, None, True, slots, -1, None)
        op("kda_commit")(*c.args(), c.num_verified, accepted, 4, True, slots, -1, None)
        return out

    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):      # warm-up on a side stream, as graph capture requires
        spec(caches[0], static_in, static_acc, static_out)
        spec(caches[1], static_in, static_acc, torch.empty_like(static_out))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        spec(caches[0], static_in, static_acc, static_out)
    gen = torch.Generator().manual_seed(4)
    folded = False
    for _ in range(12):                  # crosses folds at L = 8
        cursors = caches[0].num_committed.clone()
        new = layer.tokens(batch, T)
        acc = torch.randint(0, T + 1, (batch,), generator=gen, dtype=torch.int32).to(DEV)
        for s_, n in zip(static_in, new):
            s_.copy_(n)
        static_acc.copy_(acc)
        graph.replay()
        eager = spec(caches[1], new, acc, torch.empty_like(static_out))
        assert torch.equal(bits(static_out), bits(eager))
        for a, b in zip(caches[0].tensors, caches[1].tensors):
            assert torch.equal(bits(a), bits(b))
        folded = folded or bool((caches[0].num_committed < cursors).any())
    assert folded, "the replayed rounds must cross a fold"


# ---- bad input --------------------------------------------------------------------------------------

def test_bad_inputs_name_the_argument():
    layer = Layer(SMALL, seed=15)
    state = layer.states(3, torch.float32)
    q, k, v, a, b = layer.tokens(2)
    A_log, dt_bias = layer.weights()
    out = torch.empty(2, layer.HV, layer.V, dtype=layer.act, device=DEV)
    upd = op("kda_update")
    with pytest.raises(RuntimeError, match=r"kda_update: a must have shape \(batch, v_heads, head_k_dim\)"):
        upd(state, q, k, v, a[..., 0], b, A_log, dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"kda_update: dt_bias must have shape \(4, 64\), got \(4,\)"):
        upd(state, q, k, v, a, b, A_log, dt_bias[:, 0].contiguous(), out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"kda_update: q must have dtype in \{bfloat16, float16\}, got float32"):
        upd(state, q.float(), k, v, a, b, A_log, dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"kda_update: state \(head_k_dim K = size\(3\), head_v_dim V = size\(2\)\) must have \(K, V\) in"):
        upd(torch.zeros(3, 4, 64, 96, device=DEV), q, k, v, a, b, A_log, dt_bias, out, None, True, None, -1)
    snaps = torch.empty(2, 3, layer.HV, layer.V, layer.K, device=DEV)
    qs, ks, vs, as_, bs = layer.tokens(2, 3)
    outs = torch.empty(2, 3, layer.HV, layer.V, dtype=layer.act, device=DEV)
    with pytest.raises(RuntimeError, match=r"kda_update_snapshots: a must have shape \(batch, T, v_heads, head_k_dim\)"):
        op("kda_update_snapshots")(state, qs, ks, vs, bs, bs, A_log, dt_bias, outs, snaps, None, True, None, -1)


# The replay ops take g_buf (slots, HV, L, K): GDN's (slots, HV, L) is refused by name.
def test_replay_ops_name_a_gdn_shaped_g_buf():
    layer = Layer(SMALL, seed=16)
    cache = Cache(layer, 3, 4)
    gdn_g = torch.zeros(3, layer.HV, 4, device=DEV)
    args = list(cache.args())
    args[5] = gdn_g
    tok = layer.tokens(2)
    A_log, dt_bias = layer.weights()
    out = torch.empty(2, layer.HV, layer.V, dtype=layer.act, device=DEV)
    shape = rf"\(3, {layer.HV}, 4, {layer.K}\), got \(3, {layer.HV}, 4\)"
    with pytest.raises(RuntimeError, match=rf"kda_step: g_buf must have shape {shape}"):
        op("kda_step")(*args, *tok, A_log, dt_bias, out, None, True, 1, None, -1, False)
    with pytest.raises(RuntimeError, match=rf"kda_flush: g_buf must have shape {shape}"):
        op("kda_flush")(*args, True, None, -1)


# The fold's ring stage (a 64 KB float32 tile) and its workspace with the window's (L, K) log decays pass a
# CTA's 227 KB at L = 64 (gdn_fold_max_buffer_len, families/gdn/params.h): commit, flush and materialize
# refuse that buffer by name, and capabilities() lists the limit. The step's fused fold keeps no tile
# beside its workspace: it runs and folds at L = 64; at L = 63 the fold runs.
def test_fold_refuses_a_buffer_a_float32_kimi_checkpoint_cannot_fold():
    assert [128, 128, "float32", 63] in ops._extension.capabilities()["kda"]["fold_max_buffer_len"]
    layer = Layer(KIMI, seed=17)
    cache = Cache(layer, 4, 64)
    want = (r"the buffer length L \(k_buf.size\(2\)\) must be <= 63 with a float32 checkpoint of "
            r"\(head_v_dim, head_k_dim\) = \(128, 128\) .*got 64")
    accepted = torch.zeros(4, dtype=torch.int32, device=DEV)
    with pytest.raises(RuntimeError, match="kda_commit: " + want):
        op("kda_commit")(*cache.args(), cache.num_verified, accepted, 1, True, None, -1, None)
    with pytest.raises(RuntimeError, match="kda_flush: " + want):
        op("kda_flush")(*cache.args(), True, None, -1)
    state = torch.empty(4, layer.HV, layer.V, layer.K, device=DEV)
    with pytest.raises(RuntimeError, match="kda_materialize: " + want):
        op("kda_materialize")(cache.checkpoint, cache.k_buf, cache.v_buf, cache.g_buf, cache.beta_buf, cache.u_buf,
                              cache.num_committed, state, True, None, -1)
    start = torch.tensor([62, 63, 10, 0], dtype=torch.int32, device=DEV)   # neutral (zero) entries below
    cache.num_committed.copy_(start)
    cache.ref_nc.copy_(start)
    slots = torch.arange(4, dtype=torch.int32, device=DEV)
    for step in range(3):
        step_and_compare(cache, layer.tokens(4), slots, [0, 1, 2, 3], f"at step {step} of L = 64")
    assert int(cache.num_committed[0]) < 62 and int(cache.num_committed[1]) < 63, "rows 0 and 1 folded"
    short = Cache(layer, 2, 63)
    short.num_committed.fill_(5)
    short.ref_nc.fill_(5)
    op("kda_flush")(*short.args(), True, None, -1)
    reference.delta_flush(*short.ref[:8], short.ref_nc, True, None, -1)
    assert int(short.num_committed.abs().sum()) == 0
    short.check_state("after a flush at L = 63")
