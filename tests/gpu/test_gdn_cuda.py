"""Compiled Gated DeltaNet ops (gdn_update, gdn_update_snapshots, gdn_step) against the fp64 reference
(replayssm_cuda.reference.delta_update / delta_step), called through torch.ops.replayssm directly.

Shapes: qwen4b (H=16, HV=32, K=V=128), qwen122b (HV=64), a TP-sharded shard (H=4, HV=16), K=V=64 and
the mixed (K, V) pairs with 1-3 v-heads a k-head; odd batch sizes. The step: fold cycles at L in
{1, 2, 5, 16} (and 64), every (checkpoint, read copy) pair of the variants table, cursors staggered so
that folding and replaying rows share a launch, the fold's read copy bitwise make_read_copy's of the
checkpoint stored. Everywhere: pad and out-of-range rows get zero output and touch nothing, slots no row
names stay bit-identical, strided slot pools and int32 / int64 slots give the bits of the plain
layout, CUDA-graph replay is bitwise eager, batch 0 launches nothing.

Tolerances: outputs are stored in bf16 / fp16, compared norm-wise over the valid rows (a few 16-bit
ulps: 8e-3; more with a read copy, whose rounding is the bound: the reference reads a copy of the same
dtype made from its own checkpoint). fp32 states and checkpoints stay at fp32 rounding (relative
error <= 5e-6 after several folds); 16-bit ones are compared with the reference state as the GPU
stores it after every step (each step's arithmetic, then one rounding).
"""

import pytest
import torch

from replayssm_cuda import reference

FP8 = torch.float8_e4m3fn
DEV = "cuda"

# (H, HV, K, V)
QWEN4B = (16, 32, 128, 128)
QWEN122B = (16, 64, 128, 128)
TP4 = (4, 16, 128, 128)        # a tensor-parallel shard of qwen122b (HV = 64 over 4 GPUs)
SMALL = (2, 4, 64, 64)
KV_64_128 = (2, 6, 64, 128)    # 3 v-heads a k-head
KV_128_64 = (3, 3, 128, 64)    # one v-head a k-head
DIMS = [QWEN4B, QWEN122B, TP4, SMALL, KV_64_128, KV_128_64]
DIM_IDS = ["qwen4b", "qwen122b", "tp4", "k64v64", "k64v128", "k128v64"]

# (checkpoint, read copy) pairs of the variants table (families/gdn/variants.h)
CACHES = [(torch.float32, None), (torch.float32, torch.bfloat16), (torch.float32, torch.float16),
          (torch.float32, FP8), (torch.bfloat16, None), (torch.bfloat16, FP8), (torch.float16, None),
          (torch.float16, FP8)]
CACHE_IDS = ["fp32", "fp32-bf16", "fp32-fp16", "fp32-fp8", "bf16", "bf16-fp8", "fp16", "fp16-fp8"]

OUT_TOL = {None: 8e-3, torch.bfloat16: 1.5e-2, torch.float16: 1e-2, FP8: 4e-2}
STATE_TOL = {torch.float32: 5e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def op(name):
    # Looked up at call time: without the compiled extension the namespace has no such op (and the
    # conftest skips these tests).
    return getattr(torch.ops.replayssm, name)


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def bits(t):
    """The raw bits of t (any strides; index the result, not t: float8 has no index kernels)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


class Layer:
    """Weights and per-token inputs of one GDN layer. Decays e^g between about e^-0.02 and e^-0.6 a
    token, so a window of 16 entries still reaches back."""

    def __init__(self, dims, act=torch.bfloat16, seed=0, gate_dtype=None):
        self.H, self.HV, self.K, self.V = dims
        self.act = act
        self.gate_dtype = gate_dtype or act     # a, b: the activation dtype or fp32
        self.gen = torch.Generator().manual_seed(seed)
        self.A_log = torch.log(0.05 + 0.45 * torch.rand(self.HV, generator=self.gen))
        self.dt_bias = 0.5 * torch.randn(self.HV, generator=self.gen)

    def weights(self, dtype=torch.float32):
        return self.A_log.to(DEV, dtype), self.dt_bias.to(DEV, dtype)

    def tokens(self, batch, T=None):
        """(q, k, v, a, b) on the device: one token per row, or T tokens per row."""
        lead = (batch,) if T is None else (batch, T)
        g = self.gen
        q = torch.randn(*lead, self.H, self.K, generator=g)
        k = torch.randn(*lead, self.H, self.K, generator=g)
        v = torch.randn(*lead, self.HV, self.V, generator=g)
        a = torch.randn(*lead, self.HV, generator=g)
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
    op("gdn_update")(state, q, k, v, a, b, A_log, dt_bias, out, scale, l2, slots, pad)
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


# The split (gdn_update_split: CTAs of 4 KB of state instead of 16 KB, the rule's choice at the smallest
# batches) changes no bit: every (K, V), state dtype and activation dtype, with pads, an out-of-range
# slot and slots no row names; the split's outputs and states also match the fp64 reference.
@pytest.mark.parametrize("dims", [QWEN4B, SMALL, KV_64_128, KV_128_64], ids=["qwen4b", "k64v64", "k64v128", "k128v64"])
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


# Without the L2 normalisation (keys of norm ~1 as given), with a scale of one's own, fp32 gate inputs,
# and an odd batch without a slot tensor (row r uses slot r).
@pytest.mark.parametrize("dims", [QWEN4B, SMALL], ids=["qwen4b", "k64v64"])
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
        tok = (q, k, v, a, b)
        out = run_update(layer, state, tok, None, scale=scale, l2=l2)
        ref_out = ref_update(layer, ref_state, tok, None, scale=scale, l2=l2)
        assert rel_err(out, ref_out) < 8e-3, f"l2={l2} scale={scale}"
        assert rel_err(state, ref_state) < STATE_TOL[torch.float32]
    assert torch.equal(bits(state)[batch:], bits(init)[batch:]), "slots past the batch are not named"


# A slot-strided pool, a row-padded pool (state rows 2K apart), int64 slots and pad id 0: the bits of the
# plain layout; then a CUDA-graph replay of the same steps, bitwise eager.
@pytest.mark.parametrize("dims", [QWEN4B, KV_64_128], ids=["qwen4b", "k64v128"])
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
        op("gdn_update")(state, *static, A_log, dt_bias, static_out, None, True, slots32, 0)
    for tok, w in zip(steps, want):
        for s, n in zip(static, tok):
            s.copy_(n)
        graph.replay()
        assert torch.equal(bits(static_out), bits(w))
    assert torch.equal(bits(state), bits(want_state))


def test_update_batch_zero_launches_nothing():
    layer = Layer(QWEN4B, seed=4)
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
    op("gdn_update_snapshots")(state, q, k, v, a, b, A_log, dt_bias, out, snapshots, None, True, slots, pad)
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


def test_snapshots_strided_pool_and_graph_are_bitwise_the_same():
    layer = Layer(TP4, seed=6)
    H, HV, K, V = TP4
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
        op("gdn_update_snapshots")(state, *static, A_log, dt_bias, static_out, static_snaps, None, True, slots, -1)
    new = layer.tokens(3, 4)
    for s, n in zip(static, new):
        s.copy_(n)
    graph.replay()
    eager_out, eager_snaps = run_snapshots(layer, state, new, slots)
    assert torch.equal(bits(static_out), bits(eager_out)) and torch.equal(bits(static_snaps), bits(eager_snaps))


# ---- the replay step ------------------------------------------------------------------------------

class Cache:
    """The cache tensors of one GDN layer on the GPU (checkpoint dtype, optional read copy) and an fp64
    twin for the reference, started from the same checkpoint (as the GPU stores it)."""

    def __init__(self, layer, num_slots, L, ckpt=torch.float32, copy=None, mdt=1, init=None, pool=1):
        H, HV, K, V = layer.H, layer.HV, layer.K, layer.V
        self.layer, self.L, self.mdt, self.copy = layer, L, mdt, copy
        S = num_slots

        def make(shape, dtype):
            # pool > 1: a view into a slot pool (every pool-th slot), the strided layout engines page
            return torch.zeros(S, pool, *shape, dtype=dtype, device=DEV)[:, pool - 1]

        self.checkpoint = make((HV, V, K), ckpt)
        self.checkpoint.copy_(layer.states(S, ckpt) if init is None else init)
        self.read_copy = make((HV, V, K), copy) if copy is not None else None
        self.read_scale = make((HV, V), torch.float32) if copy == FP8 else None
        self.k_buf = make((H, L, K), layer.act)
        self.v_buf = make((HV, L, V), layer.act)
        self.g_buf = make((HV, L), torch.float32)
        self.beta_buf = make((HV, L), torch.float32)
        self.u_buf = make((HV, L, V), torch.float32)
        self.num_committed = torch.zeros(S, dtype=torch.int32, device=DEV)
        if copy is not None:
            op("make_read_copy")(self.checkpoint, self.read_copy, self.read_scale, None, -1)
        # the fp64 reference
        self.ref = [self.checkpoint.double(), None, None] + [torch.zeros(t.shape, dtype=torch.float64, device=DEV)
                                                             for t in (self.k_buf, self.v_buf, self.g_buf,
                                                                       self.beta_buf, self.u_buf)]
        self.ref_nc = self.num_committed.clone()
        if copy is not None:
            self.ref[1] = torch.empty(self.read_copy.shape, dtype=copy, device=DEV)
            self.ref[2] = torch.ones(self.read_scale.shape, device=DEV) if copy == FP8 else None
            reference.make_read_copy(self.ref[0], self.ref[1], self.ref[2])

    @property
    def tensors(self):
        return [t for t in (self.checkpoint, self.read_copy, self.read_scale, self.k_buf, self.v_buf, self.g_buf,
                            self.beta_buf, self.u_buf, self.num_committed) if t is not None]

    def args(self):
        return (self.checkpoint, self.read_copy, self.read_scale, self.k_buf, self.v_buf, self.g_buf,
                self.beta_buf, self.u_buf, self.num_committed)

    def stagger(self, period):
        """Cursors s % period over zero (neutral) entries, in both caches."""
        start = (torch.arange(self.num_committed.shape[0], device=DEV) % period).to(torch.int32)
        self.num_committed.copy_(start)
        self.ref_nc.copy_(start)

    def step(self, tok, slots, pad=-1, out=None, scale=None, l2=True, staggered=False):
        q, k, v, a, b = tok
        out = torch.full((q.shape[0], self.layer.HV, self.layer.V), float("nan"), dtype=self.layer.act,
                         device=DEV) if out is None else out
        A_log, dt_bias = self.layer.weights()
        op("gdn_step")(*self.args(), q, k, v, a, b, A_log, dt_bias, out, scale, l2, self.mdt, slots, pad, staggered)
        return out

    def ref_step(self, tok, slots, pad=-1, scale=None, l2=True):
        q, k, v, a, b = as64(*tok)
        out = torch.empty(q.shape[0], self.layer.HV, self.layer.V, dtype=torch.float64, device=DEV)
        A_log, dt_bias = self.layer.weights(torch.float64)
        reference.delta_step(*self.ref[:8], self.ref_nc, q, k, v, a, b, A_log, dt_bias, out, scale, l2, self.mdt,
                             slots, pad)
        return out

    def sync_reference_checkpoint(self):
        """The reference goes on from the checkpoint (and read copy) as the GPU stores them."""
        self.ref[0].copy_(self.checkpoint.double())
        if self.copy is not None:
            self.ref[1].copy_(self.read_copy)
            if self.ref[2] is not None:
                self.ref[2].copy_(self.read_scale)

    def check_window(self, named, where):
        """The live buffer entries (j < cursor) of the named slots, against the reference's."""
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
        """The read copy of the named slots is make_read_copy's of the checkpoint stored, bit for bit."""
        if self.copy is None:
            return
        want = torch.empty_like(self.read_copy)
        want_scale = None if self.read_scale is None else torch.empty_like(self.read_scale)
        op("make_read_copy")(self.checkpoint, want, want_scale, None, -1)
        assert torch.equal(bits(self.read_copy)[slots], bits(want)[slots]), "the fold's copy is make_read_copy's"
        if want_scale is not None:
            assert torch.equal(self.read_scale[slots], want_scale[slots])


def step_and_compare(cache, tok, slots, valid, where, pad=-1, staggered=False):
    """One step of both caches: outputs, cursors, the checkpoints and the live windows compared."""
    out = cache.step(tok, slots, pad, staggered=staggered)
    ref_out = cache.ref_step(tok, slots, pad)
    invalid = [r for r in range(len(tok[0])) if r not in valid]
    if invalid:
        assert torch.count_nonzero(out[invalid]) == 0, f"pad rows get zero output ({where})"
    assert rel_err(out[valid], ref_out[valid]) < OUT_TOL[cache.copy], where
    assert torch.equal(cache.num_committed, cache.ref_nc), f"cursors {where}"
    ck = cache.checkpoint.dtype
    assert rel_err(cache.checkpoint, cache.ref[0]) < STATE_TOL[ck], f"checkpoint {where}"
    cache.check_window(torch.arange(len(tok[0]), device=DEV) if slots is None else slots, where)
    if ck != torch.float32:
        cache.sync_reference_checkpoint()
    return out


# Fold cycles at L in {1, 2, 5, 16, 64} (max_draft_tokens 1 and larger): 2.5 cycles of steps, every
# output, cursor, live window and checkpoint against the reference; the fold's read copy is
# make_read_copy's; slots no row names stay bit-identical.
CYCLES = [
    # dims, checkpoint, read copy, L, max_draft_tokens
    (QWEN4B, torch.float32, None, 16, 1),
    (QWEN4B, torch.float32, torch.bfloat16, 16, 4),
    (QWEN4B, torch.float32, FP8, 16, 1),
    (TP4, torch.float32, None, 5, 1),
    (TP4, torch.float32, FP8, 5, 2),
    (SMALL, torch.float32, None, 1, 1),
    (SMALL, torch.float32, torch.float16, 2, 1),
    (SMALL, torch.bfloat16, FP8, 2, 2),
    (KV_64_128, torch.float32, None, 64, 1),
    (KV_128_64, torch.float16, None, 5, 1),
    (QWEN122B, torch.float32, torch.bfloat16, 5, 1),
]


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dims,ck,rc,L,mdt", CYCLES)
def test_step_matches_reference_over_fold_cycles(dims, ck, rc, L, mdt, act):
    layer = Layer(dims, act, seed=L + mdt)
    num_slots = 7
    cache = Cache(layer, num_slots, L, ck, rc, mdt)
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
# rows fold while the others replay (the tickets of several slots, folding and replaying CTAs side by
# side), an odd batch and a shape with 3 v-heads a k-head.
@pytest.mark.parametrize("dims", [TP4, KV_64_128], ids=["tp4", "k64v128"])
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


# Odd batches (1, 3, 7 rows of a random slot permutation) at each compiled (K, V), without a slot
# tensor too (row r uses slot r).
@pytest.mark.parametrize("dims", [SMALL, KV_64_128, KV_128_64, QWEN4B], ids=["k64v64", "k64v128", "k128v64", "k128v128"])
@pytest.mark.parametrize("batch", [1, 3, 7])
def test_step_odd_batches(dims, batch):
    layer = Layer(dims, seed=batch)
    num_slots = 8
    cache = Cache(layer, num_slots, 4, torch.float32, FP8 if batch == 3 else None, 1)
    perm = torch.randperm(num_slots, generator=torch.Generator().manual_seed(batch))[:batch].to(DEV)
    for step in range(6):
        slots = perm if step % 2 == 0 else None
        rows = perm if slots is not None else torch.arange(batch, device=DEV)
        step_and_compare(cache, layer.tokens(batch), slots, list(range(batch)), f"at step {step}")
        cache.check_read_copy(rows)


# A strided pool (every cache tensor a view into a pool of 3 slots a slot), int64 slots and pad id 0 give
# the bits of the plain layout with int32 slots; a CUDA graph of one step replayed over two cycles gives
# the bits of eager steps.
@pytest.mark.parametrize("ck,rc", [(torch.float32, None), (torch.float32, FP8), (torch.bfloat16, None)],
                         ids=["fp32", "fp32-fp8", "bf16"])
def test_step_layouts_and_graph_are_bitwise_the_same(ck, rc):
    layer = Layer(QWEN4B, seed=11)
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
        op("gdn_step")(*graphed.args(), *static, A_log, dt_bias, static_out, None, True, 1, slots, -1, False)
    for tok in steps:
        for s, n in zip(static, tok):
            s.copy_(n)
        graph.replay()
        assert torch.equal(bits(static_out), bits(eager.step(tok, slots)))
    for x, y in zip(eager.tensors, graphed.tensors):
        assert torch.equal(bits(x), bits(y))


# The parts a step CTA takes of a (row, v-head)'s value rows (gdn_step_parts 1, 2, 4; V = 64 allows 2)
# change no bit: over fold cycles with staggered cursors (folding and replaying CTAs in every launch, the
# tickets of several CTAs a slot), an odd batch with a pad and an out-of-range row, every output and
# every cache tensor are the same bits, and the first run matches the reference.
@pytest.mark.parametrize("dims", [QWEN4B, KV_128_64], ids=["qwen4b", "k128v64"])
@pytest.mark.parametrize("ck,rc", [(torch.float32, torch.bfloat16), (torch.float32, FP8), (torch.float32, None),
                                   (torch.bfloat16, FP8)], ids=["fp32-bf16", "fp32-fp8", "fp32", "bf16-fp8"])
def test_step_parts_change_no_bit(dims, ck, rc, set_overrides):
    layer = Layer(dims, seed=13)
    L, mdt, num_slots = 6, 2, 9
    init = layer.states(num_slots, ck)
    slots = torch.tensor([8, -1, 4, 0, 6, 99, 3, 7, 1], dtype=torch.int32, device=DEV)
    valid = [0, 2, 3, 4, 6, 7, 8]
    steps = [layer.tokens(len(slots)) for _ in range(2 * (L - mdt + 1) + 1)]
    results = []
    for parts in (1, 2, 4):
        set_overrides(gdn_step_parts=parts)
        cache = Cache(layer, num_slots, L, ck, rc, mdt, init=init)
        cache.stagger(L - mdt + 1)
        if parts == 1:
            outs = [step_and_compare(cache, tok, slots, valid, f"at step {i}") for i, tok in enumerate(steps)]
        else:
            outs = [cache.step(tok, slots) for tok in steps]
        results.append(([bits(o) for o in outs], [bits(t) for t in cache.tensors]))
    for parts, (outs, tensors) in zip((2, 4), results[1:]):
        for i, (a, b) in enumerate(zip(outs, results[0][0])):
            assert torch.equal(a, b), f"gdn_step_parts={parts}: output of step {i}"
        for i, (a, b) in enumerate(zip(tensors, results[0][1])):
            assert torch.equal(a, b), f"gdn_step_parts={parts}: cache tensor {i}"


# The order and fold-split tests' rows: L = 6 with 2 drafts, 11 slots, an odd batch of 13 with a pad row
# (-1) and an out-of-range one (99), tokens for two fold cycles and a step.
def staggered_rows(layer, ck):
    L, mdt, num_slots = 6, 2, 11
    init = layer.states(num_slots, ck)
    slots = torch.tensor([10, -1, 4, 0, 6, 99, 3, 7, 1, 9, 2, 5, 8], dtype=torch.int32, device=DEV)
    valid = [0, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12]
    steps = [layer.tokens(len(slots)) for _ in range(2 * (L - mdt + 1) + 1)]
    return L, mdt, num_slots, init, slots, valid, steps


# The order pass (gdn_step_order 1: the folding rows' CTAs first, under the staggered-flush hint) changes
# no bit against the launch without it, over staggered fold cycles of an odd batch with pad and
# out-of-range rows, and matches the reference.
@pytest.mark.parametrize("ck,rc", [(torch.float32, None), (torch.float32, torch.bfloat16), (torch.float32, FP8),
                                   (torch.bfloat16, FP8)], ids=["fp32", "fp32-bf16", "fp32-fp8", "bf16-fp8"])
def test_step_order_changes_no_bit(ck, rc, set_overrides):
    layer = Layer(QWEN4B, seed=16)
    L, mdt, num_slots, init, slots, valid, steps = staggered_rows(layer, ck)
    results = []
    for order in (1, 0):
        set_overrides(gdn_step_order=order)
        cache = Cache(layer, num_slots, L, ck, rc, mdt, init=init)
        cache.stagger(L - mdt + 1)
        if order:
            outs = [step_and_compare(cache, tok, slots, valid, f"at step {i}", staggered=True) for i, tok in enumerate(steps)]
        else:
            outs = [cache.step(tok, slots, staggered=True) for tok in steps]
        results.append([bits(o) for o in outs] + [bits(t) for t in cache.tensors])
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1]))


# The fold split (gdn_step_fold_parts 2 / 4: the first ceil(batch / L) folding rows in 2 or 4 CTAs a
# v-head, helper rows after the batch) changes no bit against the ordered launch without it, and matches
# the reference: staggered fold cycles (as many or fewer folds in a step than split rows: idle helpers),
# then lock-step ones with the hint (every row folds in one step, more folds than split rows), an odd
# batch with pad and out-of-range rows; V = 64 takes at most 2.
@pytest.mark.parametrize("dims", [QWEN4B, KV_128_64], ids=["qwen4b", "k128v64"])
@pytest.mark.parametrize("ck,rc", [(torch.float32, None), (torch.float32, torch.bfloat16), (torch.float32, FP8),
                                   (torch.bfloat16, FP8)], ids=["fp32", "fp32-bf16", "fp32-fp8", "bf16-fp8"])
def test_step_fold_split_changes_no_bit(dims, ck, rc, set_overrides):
    layer = Layer(dims, seed=18)
    L, mdt, num_slots, init, slots, valid, steps = staggered_rows(layer, ck)
    results = []
    for fold_parts in (1, 2, 4):  # 1: none (0 would be the rule)
        set_overrides(gdn_step_order=1, gdn_step_fold_parts=fold_parts)
        got = []
        for spread in (L - mdt + 1, 1):  # staggered, then lock-step (slot % 1 = 0), both with the hint
            cache = Cache(layer, num_slots, L, ck, rc, mdt, init=init)
            cache.stagger(spread)
            if fold_parts == 1:
                outs = [step_and_compare(cache, tok, slots, valid, f"at step {i}", staggered=True)
                        for i, tok in enumerate(steps)]
            else:
                outs = [cache.step(tok, slots, staggered=True) for tok in steps]
            got += [bits(o) for o in outs] + [bits(t) for t in cache.tensors]
        results.append(got)
    for fold_parts, got in zip((2, 4), results[1:]):
        assert all(torch.equal(a, b) for a, b in zip(got, results[0])), f"gdn_step_fold_parts={fold_parts}"


# The tile in chunks of 32 rows (gdn_step_tile_stages 1 / 2 / 4 in flight with an fp32 checkpoint and no
# copy; a bf16 copy's tile asked for over the set-up; the fp8 copy's kernels keep the one copy, whatever
# the override) changes no bit against the whole tile, which matches the reference: staggered fold cycles
# of an odd batch with pad and out-of-range rows (replaying, folding and idle CTAs in one launch), one and
# two parts a v-head (two parts of V = 64 are one chunk each: the whole tile).
@pytest.mark.parametrize("dims", [QWEN4B, KV_128_64], ids=["qwen4b", "k128v64"])
@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("rc", [None, torch.bfloat16, FP8], ids=["none", "bf16", "fp8"])
def test_step_tile_chunks_change_no_bit(dims, parts, rc, set_overrides):
    layer = Layer(dims, seed=21)
    L, mdt, num_slots, init, slots, valid, steps = staggered_rows(layer, torch.float32)
    results = []
    for stages in (0, 1, 2, 4):
        set_overrides(gdn_step_parts=parts, gdn_step_tile_stages=stages)
        cache = Cache(layer, num_slots, L, torch.float32, rc, mdt, init=init)
        cache.stagger(L - mdt + 1)
        if stages == 0:
            outs = [step_and_compare(cache, tok, slots, valid, f"at step {i}", staggered=True) for i, tok in enumerate(steps)]
        else:
            outs = [cache.step(tok, slots, staggered=True) for tok in steps]
        results.append([bits(o) for o in outs] + [bits(t) for t in cache.tensors])
    for stages, got in zip((1, 2, 4), results[1:]):
        assert all(torch.equal(a, b) for a, b in zip(got, results[0])), f"gdn_step_tile_stages={stages}"


# The same under load: 300 rows of qwen4b (9600 CTAs, 24 waves), so that chunks land while CTAs queue and
# thread 0's requests at the set-up's barriers find some landed and some not; every seventh cursor has no
# room (its CTAs wait for their first chunks and leave; with a bf16 copy they settle the rest of the
# tile's bytes, as the folding CTAs do).
@pytest.mark.parametrize("rc", [None, torch.bfloat16], ids=["none", "bf16"])
def test_step_tile_chunks_change_no_bit_under_load(rc, set_overrides):
    layer = Layer(QWEN4B, seed=22)
    L, mdt, num_slots, batch = 6, 2, 310, 300
    init = layer.states(num_slots, torch.float32)
    slots = torch.randperm(num_slots, device=DEV)[:batch].to(torch.int32)
    steps = [layer.tokens(batch) for _ in range(L - mdt + 2)]
    full = slots[::7].long()
    results = []
    for stages in (0, 1, 2):
        set_overrides(gdn_step_tile_stages=stages)
        cache = Cache(layer, num_slots, L, torch.float32, rc, mdt, init=init)
        cache.stagger(L - mdt + 1)
        cache.num_committed[full] = L
        outs = [cache.step(tok, slots, staggered=True) for tok in steps]
        results.append([bits(o) for o in outs] + [bits(t) for t in cache.tensors])
    assert not results[0][0][::7].any(), "rows whose cursor has no room: zero output"
    for stages, got in zip((1, 2), results[1:]):
        assert all(torch.equal(a, b) for a, b in zip(got, results[0])), f"gdn_step_tile_stages={stages}"


# (experiment) The order pass in every launch (gdn_step_order 2), with the cursors it writes taken by the
# CTAs (gdn_step_order_cursor 1) or read from the slots (0), changes no bit against the rule's launch:
# 300 rows of qwen4b over L + 2 steps from cursors spread over the buffer (every row folds once), a pad row
# and one out of range, lock-step and staggered launches, fp32 checkpoint without and with read copies.
@pytest.mark.parametrize("rc", [None, torch.bfloat16, FP8], ids=["none", "bf16", "fp8"])
@pytest.mark.parametrize("staggered", [False, True], ids=["lockstep", "staggered"])
def test_step_order_pass_cursors_change_no_bit(rc, staggered, set_overrides):
    layer = Layer(QWEN4B, seed=29)
    L, num_slots, batch = 16, 310, 300
    init = layer.states(num_slots, torch.float32)
    slots = torch.randperm(num_slots, device=DEV)[:batch].to(torch.int32)
    slots[5], slots[17] = -1, num_slots + 3
    start = (torch.arange(num_slots, device=DEV) % L).to(torch.int32)
    steps = [layer.tokens(batch) for _ in range(L + 2)]
    results = []
    variants = ({}, {"gdn_step_order": 2, "gdn_step_order_cursor": 1}, {"gdn_step_order": 2, "gdn_step_order_cursor": 0})
    for v in variants:
        set_overrides(**v)
        cache = Cache(layer, num_slots, L, torch.float32, rc, 1, init=init)
        cache.num_committed.copy_(start)
        outs = [cache.step(tok, slots, staggered=staggered) for tok in steps]
        results.append([bits(o) for o in outs] + [bits(t) for t in cache.tensors])
    for v, got in zip(variants[1:], results[1:]):
        assert all(torch.equal(a, b) for a, b in zip(got, results[0])), f"{v}"


# A cursor that leaves no room (w >= L after masking off the tickets' bits, so also -1 and 70000) stays as
# it was with the slot's cache untouched and zero output, while the other rows step as usual.
def test_step_leaves_cursors_with_no_room_as_they_were():
    layer = Layer(TP4, seed=12)
    L = 4
    cache = Cache(layer, 6, L, torch.float32, torch.bfloat16)
    cursors = torch.tensor([1, -1, 4, 9, 70000, 3], dtype=torch.int32, device=DEV)
    cache.num_committed.copy_(cursors)
    before = [t.clone() for t in cache.tensors]
    out = cache.step(layer.tokens(6), None)
    bad = [1, 2, 3, 4]
    assert torch.equal(cache.num_committed[bad], cursors[bad])
    assert cache.num_committed[0].item() == 2 and cache.num_committed[5].item() == 0   # one step; a fold
    for a, b in zip(cache.tensors, before):
        if a.dim() > 1:
            assert torch.equal(bits(a)[bad], bits(b)[bad])
    assert torch.count_nonzero(out[bad]) == 0
    assert torch.isfinite(out[[0, 5]].float()).all()


def test_step_batch_zero_launches_nothing():
    layer = Layer(SMALL, seed=13)
    cache = Cache(layer, 3, 4)
    before = [t.clone() for t in cache.tensors]
    tok = layer.tokens(0)
    out = torch.empty(0, layer.HV, layer.V, dtype=layer.act, device=DEV)
    cache.step(tok, None, out=out)
    torch.cuda.synchronize()
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(cache.tensors, before))


# A long run: 4096 steps of a qwen122b shard with an fp32 checkpoint, L = 16: the checkpoint's error
# against fp64 stays at fp32 rounding, with a bf16 read copy too (the folds recompute every u from the
# checkpoint), and the outputs' error does not grow with the number of folds.
@pytest.mark.parametrize("rc", [None, torch.bfloat16], ids=["no-copy", "bf16-copy"])
def test_step_long_run_error_is_flat(rc):
    layer = Layer(TP4, seed=14)
    cache = Cache(layer, 2, 16, copy=rc)
    slots = torch.tensor([1, 0], device=DEV)
    ck_errs, out_errs = [], []
    for step in range(4096):
        tok = layer.tokens(2)
        out = cache.step(tok, slots)
        out_errs.append(rel_err(out, cache.ref_step(tok, slots)))
        if int(cache.num_committed[0]) == 0:
            ck_errs.append(rel_err(cache.checkpoint, cache.ref[0]))
    assert max(ck_errs) < 5e-6
    first, last = sum(ck_errs[:20]) / 20, sum(ck_errs[-20:]) / 20
    assert last < 3 * first + 1e-7, f"checkpoint error grows: {first:.2e} -> {last:.2e}"
    first, last = sum(out_errs[:256]) / 256, sum(out_errs[-256:]) / 256
    assert last < 1.5 * first, f"output error grows: {first:.2e} -> {last:.2e}"


# ---- an independent implementation ----------------------------------------------------------------

# flash-linear-attention's fused_recurrent_gated_delta_rule (Triton, [K, V] states), where it is
# installed: one token from the same state gives the same output and state as gdn_update.
def test_update_matches_flash_linear_attention():
    fla = pytest.importorskip("fla.ops.gated_delta_rule")
    layer = Layer((4, 4, 128, 128), seed=16)
    batch = 3
    state = layer.states(batch, torch.float32)
    q, k, v, a, b = layer.tokens(batch)
    A_log, dt_bias = layer.weights()
    g = -A_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias)
    beta = torch.sigmoid(b.float())
    try:
        o, final = fla.fused_recurrent_gated_delta_rule(
            q[:, None], k[:, None], v[:, None], g[:, None], beta=beta[:, None], scale=layer.K ** -0.5,
            initial_state=state.transpose(-1, -2).contiguous(), output_final_state=True,
            use_qk_l2norm_in_kernel=True)
    except TypeError as exc:  # an fla release with another signature
        pytest.skip(f"fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule: {exc}")
    out = run_update(layer, state, (q, k, v, a, b), None)
    assert rel_err(out, o[:, 0]) < 1e-2
    assert rel_err(state, final.transpose(-1, -2)) < 1e-4


# ---- bad input --------------------------------------------------------------------------------------

def test_bad_inputs_name_the_argument():
    layer = Layer(SMALL, seed=15)
    state = layer.states(3, torch.float32)
    q, k, v, a, b = layer.tokens(2)
    A_log, dt_bias = layer.weights()
    out = torch.empty(2, layer.HV, layer.V, dtype=layer.act, device=DEV)
    upd = op("gdn_update")
    with pytest.raises(RuntimeError, match=r"gdn_update: state \(head_k_dim K = size\(3\), head_v_dim V = size\(2\)\) must have \(K, V\) in"):
        upd(torch.zeros(3, 4, 64, 96, device=DEV), q, k, v, a, b, A_log, dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_update: q must have dtype in \{bfloat16, float16\}, got float32"):
        upd(state, q.float(), k, v, a, b, A_log, dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_update: the number of v-heads \(4\) must be a multiple"):
        upd(state, q[:, :1].expand(2, 3, 64).contiguous(), k, v, a, b, A_log, dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_update: A_log must have dtype in \{float32\}, got float64"):
        upd(state, q, k, v, a, b, A_log.double(), dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_update: a must have shape \(batch, v_heads\)"):
        upd(state, q, k, v, a[:, :1], b, A_log, dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_update: without slots, row r uses slot r"):
        upd(state[:1], q, k, v, a, b, A_log, dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_update: state must be a CUDA tensor"):
        upd(state.cpu(), q, k, v, a, b, A_log, dt_bias, out, None, True, None, -1)

    cache = Cache(layer, 3, 4)
    step = op("gdn_step")
    with pytest.raises(RuntimeError, match=r"gdn_step: max_draft_tokens must be in \[1, L = 4\], got 5"):
        step(*cache.args(), q, k, v, a, b, A_log, dt_bias, out, None, True, 5, None, -1, False)
    bad_copy = torch.zeros(cache.checkpoint.shape, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(RuntimeError, match=r"gdn_step: read_copy must have dtype in \{float8_e4m3fn\}, got bfloat16"):
        step(cache.checkpoint.bfloat16(), bad_copy, None, *cache.args()[3:], q, k, v, a, b, A_log, dt_bias, out,
             None, True, 1, None, -1, False)
    with pytest.raises(RuntimeError, match=r"gdn_step: read_scale is required with a float8_e4m3fn read_copy"):
        step(cache.checkpoint, bad_copy.to(FP8), None, *cache.args()[3:], q, k, v, a, b, A_log, dt_bias, out,
             None, True, 1, None, -1, False)
    with pytest.raises(RuntimeError, match=r"gdn_step: u_buf must have dtype in \{float32\}"):
        args = list(cache.args())
        args[7] = args[7].double()
        step(*args, q, k, v, a, b, A_log, dt_bias, out, None, True, 1, None, -1, False)
