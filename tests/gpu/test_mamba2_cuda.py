"""Compiled Mamba-2 ops (mamba2_update, mamba2_step) against the fp64 reference, on the reference
dims (nano4b: H=96 P=80 N=128 G=8; super120b: H=128 P=64 N=128 G=8) and odd ones (3 heads per group,
N=64, batch 1), over several fold cycles; pads, unnamed slots, strided pools, CUDA graphs, bad input."""

import itertools
import json
import os
import tempfile

import pytest
import torch

from replayssm_cuda import Mamba2Cache, Mamba2Weights, ops

FP8 = torch.float8_e4m3fn
# (H, P, N, G)
NANO4B = (96, 80, 128, 8)
SUPER120B = (128, 64, 128, 8)
ODD = (24, 80, 64, 8)          # 3 heads per group
SMALL = (8, 128, 64, 2)
WIDE = (16, 128, 128, 4)
MANY_ROWS = (8, 64, 64, 1)     # small enough for batches over 1,024 rows


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def bits(t):
    return t.view(torch.uint8) if t.dtype == FP8 else t.contiguous().view(torch.uint8)


class Layer:
    """Random weights and inputs of one Mamba-2 layer, on a device, with bf16/fp16 activations."""

    def __init__(self, dims, act=torch.bfloat16, seed=0):
        self.H, self.P, self.N, self.G = dims
        self.act = act
        self.gen = torch.Generator().manual_seed(seed)
        H = self.H
        self.A = -(0.5 + torch.rand(H, generator=self.gen))
        self.D = torch.randn(H, generator=self.gen)
        self.dt_bias = 0.1 * torch.randn(H, generator=self.gen)

    def weights(self, device="cuda", dtype=torch.float32):
        return Mamba2Weights(A=self.A.to(device, dtype), D=self.D.to(device, dtype),
                             dt_bias=self.dt_bias.to(device, dtype), dt_softplus=True)

    def inputs(self, batch):
        g = self.gen
        x = torch.randn(batch, self.H, self.P, generator=g)
        dt = 0.5 * torch.randn(batch, self.H, generator=g)
        B = torch.randn(batch, self.G, self.N, generator=g)
        C = torch.randn(batch, self.G, self.N, generator=g)
        z = torch.randn(batch, self.H, self.P, generator=g)
        return [t.to(self.act) for t in (x, dt, B, C, z)]

    def states(self, num_slots):
        return 0.3 * torch.randn(num_slots, self.H, self.P, self.N, generator=self.gen, dtype=torch.float64)


def gpu_cache(layer, num_slots, **kw):
    return Mamba2Cache(num_slots, layer.H, layer.P, layer.N, layer.G, layer.weights("cuda"), device="cuda",
                       activation_dtype=layer.act, backend="auto", **kw)


def ref_cache(layer, num_slots, read_copy_dtype=None, **kw):
    return Mamba2Cache(num_slots, layer.H, layer.P, layer.N, layer.G, layer.weights("cpu", torch.float64),
                       device="cpu", checkpoint_dtype=torch.float64, activation_dtype=torch.float64,
                       read_copy_dtype=read_copy_dtype, backend="reference", **kw)


def cuda_step(cache, x, dt, B, C, z, slots, out=None, staggered_flush=False):
    w = cache.weights
    out = torch.empty_like(x) if out is None else out
    return ops.mamba2_step(cache.checkpoint, cache.read_copy, cache.read_scale, cache.x_buf, cache.B_buf,
                           cache.dt_buf, cache.num_committed, x, dt, w.A, B, C, out, w.D, z, w.dt_bias,
                           w.dt_softplus, cache.max_draft_tokens, slots, cache.pad_slot_id,
                           staggered_flush=staggered_flush, backend="cuda")


# ---- conventional update --------------------------------------------------------------------------

@pytest.mark.parametrize("dims", [NANO4B, SUPER120B, ODD, SMALL], ids=["nano4b", "super120b", "odd", "small"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
def test_update_matches_reference(dims, state_dtype, act):
    layer = Layer(dims, act, seed=1)
    num_slots, batch = 7, 5
    init = layer.states(num_slots)
    state = init.to("cuda", state_dtype)
    ref_state = state.double().cpu()
    slots = torch.tensor([4, -1, 0, 6, 2], dtype=torch.int32)
    w_gpu, w_ref = layer.weights("cuda"), layer.weights("cpu", torch.float64)
    for _ in range(3):
        x, dt, B, C, z = layer.inputs(batch)
        out = torch.full((batch, layer.H, layer.P), float("nan"), dtype=act, device="cuda")
        ops.mamba2_update(state, x.cuda(), dt.cuda(), w_gpu.A, B.cuda(), C.cuda(), out, w_gpu.D, z.cuda(),
                          w_gpu.dt_bias, True, slots.cuda(), -1, backend="cuda")
        ref_out = torch.empty(batch, layer.H, layer.P, dtype=torch.float64)
        ops.mamba2_update(ref_state, x.double(), dt.double(), w_ref.A, B.double(), C.double(), ref_out, w_ref.D,
                          z.double(), w_ref.dt_bias, True, slots, -1, backend="reference")
        assert torch.count_nonzero(out[1]) == 0, "pad row gets zero output"
        assert rel_err(out, ref_out) < 8e-3
        ref_state = ref_state.to(state_dtype).double()     # the reference state as the GPU stores it
    tol = 2e-6 if state_dtype == torch.float32 else 1e-2
    assert rel_err(state, ref_state) < tol
    for s in (1, 3, 5):                                    # slots no row names
        assert torch.equal(state[s].cpu(), init[s].to(state_dtype))


# The update's persistent CTAs walk the (row, head) items through a ring of S tiles; at these batches the
# launcher gives each CTA one or two items, so few CTAs (the update_ctas override) and few stages
# (update_stages) are forced to wrap the ring many times (pad items included), with items past the first
# S rounds claimed from the launch's counter or, with update_claims = 0, in fixed shares; and the items
# split into one pass of state rows each (update_split = 1) or whole heads (0). Every launch shape, a
# slot-strided pool, a row-padded pool (one bulk copy per state row) and a CUDA-graph replay (the
# counter's zeroing captured with it) must give the bits of the default launch on a contiguous state: an
# item skipped or updated twice, or a part of a head's rows in the wrong place, would show.
@pytest.mark.parametrize("dims", [NANO4B, SUPER120B, ODD], ids=["nano4b", "super120b", "odd"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_update_launch_shapes_and_layouts_are_bitwise_the_same(dims, state_dtype, set_overrides):
    layer = Layer(dims, seed=7)
    num_slots = 6
    init = layer.states(num_slots).to("cuda", state_dtype)
    slots = torch.tensor([4, -1, 0, 5, 99, 2, 1], dtype=torch.int64, device="cuda")   # a pad and an out-of-range id
    w = layer.weights("cuda")
    steps = [[t.cuda() for t in layer.inputs(len(slots))] for _ in range(2)]

    def run(state):
        outs = []
        for x, dt, B, C, z in steps:
            out = torch.full_like(x, float("nan"))
            ops.mamba2_update(state, x, dt, w.A, B, C, out, w.D, z, w.dt_bias, True, slots, -1, backend="cuda")
            outs.append(out)
        return outs

    want_state = init.clone()
    want_out = run(want_state)
    assert all(torch.count_nonzero(o[[1, 4]]) == 0 for o in want_out), "pad and out-of-range rows get zero output"
    for (ctas, stages), claims, split in itertools.product([(1, 1), (3, 2), (5, 3), (2, 8), (64, 2)], [1, 0], [0, 1]):
        set_overrides(update_ctas=ctas, update_stages=stages, update_claims=claims, update_split=split)
        slot_pool = torch.zeros(num_slots, 2, *init.shape[1:], device="cuda", dtype=state_dtype)
        row_pool = torch.zeros(*init.shape[:3], 2 * layer.N, device="cuda", dtype=state_dtype)
        for state in (init.clone(), slot_pool[:, 1], row_pool[..., :layer.N]):
            state.copy_(init)
            out = run(state)
            where = f"ctas={ctas} stages={stages} claims={claims} split={split} strides={state.stride()}"
            assert all(torch.equal(bits(a), bits(b)) for a, b in zip(out, want_out)), where
            assert torch.equal(bits(state), bits(want_state)), where
        assert torch.count_nonzero(slot_pool[:, 0]) == 0 and torch.count_nonzero(row_pool[..., layer.N:]) == 0
    set_overrides(update_ctas=None, update_stages=None, update_claims=None, update_split=None)

    state = init.clone()
    static_in = [t.clone() for t in steps[0]]
    static_out = torch.empty_like(static_in[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):        # the eager launches above were the warm-up
        x, dt, B, C, z = static_in
        ops.mamba2_update(state, x, dt, w.A, B, C, static_out, w.D, z, w.dt_bias, True, slots, -1, backend="cuda")
    for step, want in zip(steps, want_out):
        for s, n in zip(static_in, step):
            s.copy_(n)
        graph.replay()
        assert torch.equal(bits(static_out), bits(want))
    assert torch.equal(bits(state), bits(want_state))


# At a decode batch every SM runs two CTAs that claim items concurrently (update_claims = 1,
# which the launcher's rule also takes at this batch): the same bits as fixed shares, and the
# reference's values.
@pytest.mark.parametrize("dims", [NANO4B, SUPER120B], ids=["nano4b", "super120b"])
def test_update_claimed_items_match_fixed_shares_at_full_occupancy(dims, set_overrides):
    layer = Layer(dims, seed=11)
    batch, num_slots = 40, 48
    init = layer.states(num_slots).to("cuda", torch.float32)
    gen = torch.Generator().manual_seed(3)
    slots = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    slots[7] = -1                                          # a pad row
    slots = slots.cuda()
    w = layer.weights("cuda")
    x, dt, B, C, z = [t.cuda() for t in layer.inputs(batch)]

    def run(claims):
        set_overrides(update_claims=claims)
        state, out = init.clone(), torch.full_like(x, float("nan"))
        ops.mamba2_update(state, x, dt, w.A, B, C, out, w.D, z, w.dt_bias, True, slots, -1, backend="cuda")
        return state, out

    claimed, fixed = run(1), run(0)
    set_overrides(update_claims=None)
    assert torch.equal(bits(claimed[0]), bits(fixed[0])) and torch.equal(bits(claimed[1]), bits(fixed[1]))
    w_ref = layer.weights("cpu", torch.float64)
    ref_state = init.double().cpu()
    ref_out = torch.empty(batch, layer.H, layer.P, dtype=torch.float64)
    ops.mamba2_update(ref_state, x.double().cpu(), dt.double().cpu(), w_ref.A, B.double().cpu(), C.double().cpu(),
                      ref_out, w_ref.D, z.double().cpu(), w_ref.dt_bias, True, slots.cpu(), -1, backend="reference")
    assert rel_err(claimed[0], ref_state) < 2e-6 and rel_err(claimed[1], ref_out) < 8e-3
    assert torch.count_nonzero(claimed[1][7]) == 0, "pad row gets zero output"


# ---- replay step ----------------------------------------------------------------------------------

STEP_CONFIGS = [
    # dims, checkpoint dtype, read copy, L, max_draft_tokens
    (NANO4B, torch.float32, None, 16, 1),
    (NANO4B, torch.float32, torch.bfloat16, 16, 1),
    (SUPER120B, torch.float32, FP8, 8, 2),
    (SUPER120B, torch.float32, torch.float16, 5, 1),
    (ODD, torch.float32, None, 2, 1),
    (ODD, torch.bfloat16, FP8, 4, 1),
    (SMALL, torch.float16, None, 64, 1),
    # Groups of more than 32 heads (whole-group CTAs of 40 and 36 heads): the tensor-core replay's scalar
    # warp takes its per-head scalars 32 heads at a time and computes and appends the current dt per batch
    # of 32 (session 34), so a CTA's 33rd head starts the second batch. P = 80 (window term on tensor
    # cores) with an fp8 copy, P = 64 (split epilogue) with a bf16 copy, and the tf32 replay.
    ((80, 80, 64, 1), torch.float32, FP8, 16, 1),
    ((72, 64, 64, 1), torch.float32, torch.bfloat16, 16, 1),
    ((80, 80, 64, 1), torch.float32, None, 16, 1),
]


# A step CTA pipelines several heads of a group; at these small batches the launcher would give each
# CTA one head, so the multi-head path (ring refills, x windows two heads ahead) is forced as well.
@pytest.mark.parametrize("heads_per_cta", [None, 64], ids=["auto", "whole-group"])
@pytest.mark.parametrize("dims,ck,rc,L,T", STEP_CONFIGS)
def test_step_matches_reference_over_fold_cycles(dims, ck, rc, L, T, heads_per_cta, set_overrides):
    if heads_per_cta is not None:
        set_overrides(step_heads_per_cta=heads_per_cta)
    layer = Layer(dims, seed=L)
    num_slots, batch = 6, 4
    gpu = gpu_cache(layer, num_slots, buffer_len=L, max_draft_tokens=T, checkpoint_dtype=ck, read_copy_dtype=rc)
    ref = ref_cache(layer, num_slots, read_copy_dtype=rc, buffer_len=L, max_draft_tokens=T)
    init = layer.states(num_slots)
    gpu.load(init.to("cuda", ck))
    ref.load(init.to(ck).double())
    slots = torch.tensor([3, -1, 0, 5], dtype=torch.int64)
    untouched = [1, 2, 4]
    before = [bits(t[untouched]).clone() for t in gpu.cache_tensors]
    steps = 2 * L + 3 if L < 64 else 70
    out_tol = 8e-3 if rc is None else {torch.bfloat16: 2e-2, torch.float16: 1e-2, FP8: 8e-2}[rc]
    ck_tol = {torch.float32: 2e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[ck]
    for step in range(steps):
        x, dt, B, C, z = layer.inputs(batch)
        out = torch.full((batch, layer.H, layer.P), float("nan"), dtype=layer.act, device="cuda")
        cuda_step(gpu, x.cuda(), dt.cuda(), B.cuda(), C.cuda(), z.cuda(), slots.cuda(), out)
        ref_out = ref.step(x.double(), dt.double(), B.double(), C.double(), z.double(), slots=slots)
        assert torch.count_nonzero(out[1]) == 0
        valid = [0, 2, 3]
        assert rel_err(out[valid], ref_out[valid]) < out_tol, f"step {step}"
        assert torch.equal(gpu.num_committed.cpu(), ref.num_committed), f"cursor after step {step}"
    assert rel_err(gpu.checkpoint, ref.checkpoint) < ck_tol
    for t_before, t in zip(before, gpu.cache_tensors):
        assert torch.equal(t_before, bits(t[untouched])), "a slot no row names changed"
    ref_state = ref.materialize(slots=slots[[0, 2, 3]])
    gpu_state = gpu.materialize(slots=slots[[0, 2, 3]].cuda())    # reference materialize on the GPU buffers
    assert rel_err(gpu_state, ref_state) < ck_tol


# The fold of an fp32 checkpoint that has a read copy, on every (P, N) and on windows that are not a
# multiple of 8 entries (L = 5, 20, 64): the checkpoint must be the very one the same cache without a copy
# folds (a read copy changes what the replay steps read, never the fold's arithmetic), within fp32
# rounding of the fp64 reference, and the read copy make_read_copy's of the checkpoint stored, bit for bit.
COPY_FOLDS = [
    # dims, activations, read copy, L
    (NANO4B, torch.bfloat16, FP8, 16),
    (NANO4B, torch.float16, torch.float16, 5),
    (SUPER120B, torch.bfloat16, torch.bfloat16, 20),
    ((8, 64, 128, 2), torch.float16, FP8, 64),   # super120b's tile, fewer heads: 128 steps of the reference
    (ODD, torch.bfloat16, FP8, 16),
    (SMALL, torch.float16, FP8, 5),
    (WIDE, torch.bfloat16, FP8, 20),
    ((16, 64, 64, 4), torch.bfloat16, torch.bfloat16, 16),
]


@pytest.mark.parametrize("heads_per_cta", [None, 64], ids=["auto", "whole-group"])
@pytest.mark.parametrize("dims,act,rc,L", COPY_FOLDS)
def test_fold_with_a_read_copy_is_the_plain_fold_and_refreshes_the_copy(dims, act, rc, L, heads_per_cta, set_overrides):
    if heads_per_cta is not None:
        set_overrides(step_heads_per_cta=heads_per_cta)
    layer = Layer(dims, act=act, seed=L + 1)
    num_slots, batch = 5, 3
    slots = torch.tensor([4, 0, 2], dtype=torch.int64)
    with_copy = gpu_cache(layer, num_slots, buffer_len=L, read_copy_dtype=rc)
    plain = gpu_cache(layer, num_slots, buffer_len=L)
    ref = ref_cache(layer, num_slots, buffer_len=L)
    init = layer.states(num_slots)
    for c in (with_copy, plain):
        c.load(init.to("cuda", torch.float32))
    ref.load(init.float().double())
    folds = 0
    for step in range(2 * L):
        x, dt, B, C, z = layer.inputs(batch)
        outs = [cuda_step(c, x.cuda(), dt.cuda(), B.cuda(), C.cuda(), z.cuda(), slots.cuda()) for c in (with_copy, plain)]
        ref_out = ref.step(x.double(), dt.double(), B.double(), C.double(), z.double(), slots=slots)
        assert rel_err(outs[1], ref_out) < 8e-3
        if int(with_copy.num_committed[slots[0]]) != 0:
            continue
        folds += 1   # this step folded every named slot
        assert rel_err(outs[0], ref_out) < 8e-3, f"fold output at step {step}"
        assert torch.equal(with_copy.checkpoint, plain.checkpoint), f"fold {folds}: the copy changed the fold"
        got, want = with_copy.checkpoint[slots].double().cpu(), ref.checkpoint[slots]
        err = (got - want).abs().max().item() / want.abs().max().item()
        assert err < 4e-6, f"fold {folds}: max error {err:.2e} of max|S|"
        want_rc = torch.empty_like(with_copy.read_copy)
        want_scale = None if with_copy.read_scale is None else torch.empty_like(with_copy.read_scale)
        ops.make_read_copy(with_copy.checkpoint, want_rc, want_scale, backend="cuda")
        assert torch.equal(bits(with_copy.read_copy[slots]), bits(want_rc[slots])), "the fold's copy is make_read_copy's"
        if want_scale is not None:
            assert torch.equal(with_copy.read_scale[slots], want_scale[slots])
    assert folds == 2


# The fold's fp8 copy of rows whose maximum is NaN or zero (the fold takes a row's max|v| as an unsigned
# max of bit patterns since session 16; make_read_copy keeps a float max): a row holding a NaN gets scale
# 1 and keeps its NaN, an all-zero row scale 1 and zeros, and the copy and scales are make_read_copy's bit
# for bit. nano4b (P = 80) quantises after the head's last row, super120b (P = 64) a batch of rows at a time.
@pytest.mark.parametrize("dims", [NANO4B, SUPER120B], ids=["nano4b", "super120b"])
def test_fold_fp8_copy_of_nan_and_zero_rows_is_make_read_copys(dims):
    layer = Layer(dims, seed=31)
    L, num_slots, zero_row, nan_row = 4, 3, 5, 7
    slots = torch.tensor([2, 0], dtype=torch.int64, device="cuda")
    cache = gpu_cache(layer, num_slots, buffer_len=L, read_copy_dtype=FP8)
    init = layer.states(num_slots).float()
    init[:, :, zero_row, :] = 0.0
    init[2, 3, nan_row, 11] = float("nan")
    cache.load(init.cuda())
    for _ in range(L):                 # cursor 0 .. L - 1: the last step folds (max_draft_tokens = 1)
        x, dt, B, C, z = [t.cuda() for t in layer.inputs(slots.numel())]
        x[:, :, zero_row] = 0          # buffered and current x of the zero row: it stays zero through the fold
        cuda_step(cache, x, dt, B, C, z, slots)
    assert int(cache.num_committed[2]) == 0 and int(cache.num_committed[0]) == 0, "the last step folded"
    ck = cache.checkpoint
    assert torch.isnan(ck[2, 3, nan_row]).any()
    assert (ck[slots][:, :, zero_row] == 0).all()
    want_rc, want_scale = torch.empty_like(cache.read_copy), torch.empty_like(cache.read_scale)
    ops.make_read_copy(ck, want_rc, want_scale, backend="cuda")
    assert torch.equal(bits(cache.read_copy[slots]), bits(want_rc[slots]))
    assert torch.equal(cache.read_scale[slots], want_scale[slots])
    assert cache.read_scale[2, 3, nan_row].item() == 1.0
    assert torch.isnan(cache.read_copy[2, 3, nan_row].float()).any()
    assert (cache.read_scale[slots][:, :, zero_row] == 1.0).all()
    assert (cache.read_copy[slots][:, :, zero_row].float() == 0).all()


# The replay read of a bf16 / fp16 / fp8 read copy runs on tensor cores (mamba2_mma.cuh) where the
# copy's type allows it: fp8 (C goes through f16, scaled by a power of two with bf16 activations),
# bf16 copy + bf16 activations, fp16 + fp16. A bf16 copy with fp16 activations keeps the CUDA-core
# reduction. Against the fp64 reference on the very same read copy, the only differences are fp32
# accumulation and the bf16 / fp16 rounding of the output, so the bound is tight (the fold-cycle test
# above compares against an independently rounded copy and needs 2e-2 .. 8e-2). C is scaled up in row 0
# and by 1e-4 in row 1 so that C's f16 scaling is exercised at both ends.
REPLAY_SOURCES = [
    (torch.bfloat16, torch.bfloat16), (FP8, torch.bfloat16), (FP8, torch.float16),
    (torch.float16, torch.float16), (torch.bfloat16, torch.float16),
]


@pytest.mark.parametrize("heads_per_cta", [None, 64], ids=["auto", "whole-group"])
@pytest.mark.parametrize("rc,act", REPLAY_SOURCES, ids=["bf16-bf16", "fp8-bf16", "fp8-fp16", "fp16-fp16", "bf16-fp16"])
@pytest.mark.parametrize("dims", [NANO4B, SUPER120B, SMALL, (16, 64, 64, 4)], ids=["nano4b", "super120b", "small", "p64n64"])
def test_replay_step_matches_reference_on_the_same_read_copy(dims, rc, act, heads_per_cta, set_overrides):
    if heads_per_cta is not None:
        set_overrides(step_heads_per_cta=heads_per_cta)
    layer = Layer(dims, act=act, seed=11)
    H, P, N, G = dims
    num_slots, batch, L = 5, 4, 16
    g = torch.Generator().manual_seed(12)
    ck = (0.3 * torch.randn(num_slots, H, P, N, generator=g)).cuda()
    copy = torch.empty(num_slots, H, P, N, dtype=rc, device="cuda")
    scale = torch.empty(num_slots, H, P, device="cuda") if rc == FP8 else None
    ops.make_read_copy(ck, copy, scale, backend="cuda")
    x_buf = torch.randn(num_slots, H, L, P, generator=g).to(act).cuda()
    B_buf = torch.randn(num_slots, G, L, N, generator=g).to(act).cuda()
    dt_buf = (0.1 * torch.rand(num_slots, H, L, generator=g)).cuda()
    cursors = torch.tensor([0, 7, 14, 3, 9], dtype=torch.int32, device="cuda")   # no fold at T = 1, L = 16
    x, dt, B, C, z = [t.cuda() for t in layer.inputs(batch)]
    C[0] *= 1e4 if act == torch.bfloat16 else 30.0   # fp16 outputs overflow beyond ~6e4
    C[1] *= 1e-4
    slots = torch.tensor([4, 0, 2, 1], dtype=torch.int64, device="cuda")
    w = layer.weights("cuda")
    host = [None if t is None else t.cpu() for t in (ck, copy, scale, x_buf, B_buf, dt_buf, cursors)]
    ref_ck, ref_copy, ref_scale, ref_x_buf, ref_B_buf, ref_dt_buf, ref_cursors = host
    ref_x_buf, ref_B_buf, ref_dt_buf = ref_x_buf.double(), ref_B_buf.double(), ref_dt_buf.double()
    out = torch.empty(batch, H, P, dtype=act, device="cuda")
    ops.mamba2_step(ck, copy, scale, x_buf, B_buf, dt_buf, cursors, x, dt, w.A, B, C, out, w.D, z, w.dt_bias,
                    True, 1, slots, -1, backend="cuda")
    wr = layer.weights("cpu", torch.float64)
    ref_out = torch.empty(batch, H, P, dtype=torch.float64)
    ops.mamba2_step(ref_ck.double(), ref_copy, ref_scale, ref_x_buf, ref_B_buf, ref_dt_buf, ref_cursors,
                    *[t.cpu().double() for t in (x, dt)], wr.A, *[t.cpu().double() for t in (B, C)], ref_out, wr.D,
                    z.cpu().double(), wr.dt_bias, True, 1, slots.cpu(), -1, backend="reference")
    for r in range(batch):
        assert rel_err(out[r], ref_out[r]) < 3e-3, f"row {r} (slot {slots[r].item()})"
    assert torch.equal(cursors.cpu(), ref_cursors)
    assert torch.equal(x_buf.cpu().double(), ref_x_buf)       # the appended entries, exactly
    assert torch.equal(B_buf.cpu().double(), ref_B_buf)
    assert torch.allclose(dt_buf.cpu().double(), ref_dt_buf, rtol=1e-6, atol=0)
    assert torch.equal(ck.cpu(), ref_ck)                      # a replay step writes no state


# An fp32 checkpoint without a read copy replays on tensor cores (2 x tf32, StepLayout's kTf32Replay):
# over fold cycles on every (P, N), both activation types, a pad row, C scaled up and down, the outputs
# against the fp64 reference (S C within 2^-21 of each fp32 product, so a wrong fragment map would be
# off by O(1)) and the checkpoint at fp32 rounding.
TF32_REPLAY_DIMS = [NANO4B, SUPER120B, ODD, SMALL, WIDE, (16, 64, 64, 4)]


@pytest.mark.parametrize("heads_per_cta", [None, 64], ids=["auto", "whole-group"])
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("dims", TF32_REPLAY_DIMS, ids=["nano4b", "super120b", "odd", "small", "wide", "p64n64"])
def test_tf32_replay_matches_the_reference(dims, act, heads_per_cta, set_overrides):
    if heads_per_cta is not None:
        set_overrides(step_heads_per_cta=heads_per_cta)
    layer = Layer(dims, act=act, seed=21)
    num_slots, L = 5, 8
    slots = torch.tensor([3, -1, 0, 4], dtype=torch.int64)
    valid = [0, 2, 3]
    cache = gpu_cache(layer, num_slots, buffer_len=L)
    ref = ref_cache(layer, num_slots, buffer_len=L)
    init = layer.states(num_slots)
    cache.load(init.to("cuda", torch.float32))
    ref.load(init.float().double())
    for step in range(2 * L + 3):
        x, dt, B, C, z = layer.inputs(slots.numel())
        C[0] *= 1e3 if act == torch.bfloat16 else 30.0
        C[2] *= 1e-3
        out = cuda_step(cache, x.cuda(), dt.cuda(), B.cuda(), C.cuda(), z.cuda(), slots.cuda(),
                        torch.full((slots.numel(), layer.H, layer.P), float("nan"), dtype=act, device="cuda"))
        ref_out = ref.step(x.double(), dt.double(), B.double(), C.double(), z.double(), slots=slots)
        assert torch.count_nonzero(out[1]) == 0, "pad row"
        for r in valid:
            assert rel_err(out[r], ref_out[r]) < 3e-3, f"step {step} row {r}"
    assert torch.equal(cache.num_committed.cpu(), ref.num_committed)
    assert rel_err(cache.checkpoint, ref.checkpoint) < 2e-5


# The read copies' CTAs of two whole groups (mamba2_two_group_ctas; the step_groups_per_cta override = 2
# forces them at any batch, 1 turns them off): a CTA switches B's window, the window dots and C's
# fragments at its second group's first head, in the replay and in the fold. With and without, over fold
# cycles, both tensor-core copies, odd group sizes (3 heads) and N = 64: everything bit for bit (each
# head is computed from the same values by the same lanes), a pad row and unnamed slots untouched. The
# grids show which kernel ran: G / 2 CTAs a row with them, at least G without.
@pytest.mark.parametrize("source", ["bf16", "fp8"])
@pytest.mark.parametrize("dims", [NANO4B, SUPER120B, ODD, SMALL], ids=["nano4b", "super120b", "odd", "small"])
def test_step_two_group_ctas_are_bitwise_one_group_ctas(dims, source, set_overrides):
    rc = {"bf16": torch.bfloat16, "fp8": FP8}[source]
    layer = Layer(dims, seed=31)
    num_slots, L = 8, 5
    slots = torch.tensor([6, 0, 3, -1, 5, 1], dtype=torch.int64)   # slots 2, 4, 7 unnamed
    caches = {k: gpu_cache(layer, num_slots, buffer_len=L, read_copy_dtype=rc) for k in ("2", "1")}
    init = layer.states(num_slots).cuda().float()
    for c in caches.values():
        c.load(init)
    untouched = [2, 4, 7]
    before = [bits(t[untouched]).clone() for t in caches["2"].cache_tensors]
    for step in range(2 * L + 2):
        x, dt, B, C, z = (t.cuda() for t in layer.inputs(slots.numel()))
        outs = {}
        for knob, cache in caches.items():
            set_overrides(step_groups_per_cta=int(knob))
            out = torch.full((slots.numel(), layer.H, layer.P), float("nan"), dtype=layer.act, device="cuda")
            grids = step_grids(lambda: cuda_step(cache, x, dt, B, C, z, slots.cuda(), out))
            assert len(grids) == 1, grids
            if knob == "2":
                assert grids[0][0] == layer.G // 2, grids
            else:
                assert grids[0][0] >= layer.G, grids
            outs[knob] = out
        assert torch.count_nonzero(outs["2"][3]) == 0, "pad row"
        assert torch.equal(bits(outs["2"]), bits(outs["1"])), f"outputs, step {step}"
        for a, b in zip(caches["2"].cache_tensors, caches["1"].cache_tensors):
            assert torch.equal(bits(a), bits(b)), f"step {step}"
    for t_before, t in zip(before, caches["2"].cache_tensors):
        assert torch.equal(t_before, bits(t[untouched])), "a slot no row names changed"


# Sources: an fp8 read copy and an fp32 checkpoint (tf32), both on tensor cores.
@pytest.mark.parametrize("source", ["fp8", "tf32"])
@pytest.mark.parametrize("heads_per_cta", [None, 64], ids=["auto", "whole-group"])
def test_step_cuda_graph_replay_is_bitwise_eager(heads_per_cta, source, set_overrides):
    if heads_per_cta is not None:
        set_overrides(step_heads_per_cta=heads_per_cta)
    layer = Layer(NANO4B, seed=3)
    caches = [gpu_cache(layer, 4, buffer_len=4, read_copy_dtype=FP8 if source == "fp8" else None) for _ in range(2)]
    init = layer.states(4).cuda().float()
    for c in caches:
        c.load(init)
    slots = torch.tensor([2, 0, -1], dtype=torch.int32, device="cuda")
    static_in = [t.cuda() for t in layer.inputs(3)]
    static_out = torch.empty_like(static_in[0])
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):      # warm-up on a side stream, as graph capture requires
        cuda_step(caches[0], *static_in, slots, static_out)
        cuda_step(caches[1], *static_in, slots)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cuda_step(caches[0], *static_in, slots, static_out)
    for _ in range(9):                   # crosses two folds at L=4
        new = [t.cuda() for t in layer.inputs(3)]
        for s, n in zip(static_in, new):
            s.copy_(n)
        graph.replay()
        eager = cuda_step(caches[1], *new, slots)
        assert torch.equal(bits(static_out), bits(eager))
    for a, b in zip(caches[0].cache_tensors, caches[1].cache_tensors):
        assert torch.equal(bits(a), bits(b))


# The staggered_flush hint only sizes the CTAs: at batch 32 the tensor-core replay kernels (bf16 and fp8
# copies) get 1 head per CTA with it (nano4b, 132 SMs) and whole groups without, and the bits must not
# change.
@pytest.mark.parametrize("rc", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
def test_step_staggered_flush_hint_changes_no_bits(rc):
    layer = Layer(NANO4B, seed=13)
    num_slots, L = 32, 4
    caches = [gpu_cache(layer, num_slots, buffer_len=L, read_copy_dtype=rc) for _ in range(2)]
    init = layer.states(num_slots).cuda().float()
    for c in caches:
        c.load(init)
    slots = torch.arange(num_slots, dtype=torch.int32, device="cuda").flip(0)
    for _ in range(L + 2):                   # crosses a fold
        inputs = [t.cuda() for t in layer.inputs(num_slots)]
        a = cuda_step(caches[0], *inputs, slots, staggered_flush=False)
        b = cuda_step(caches[1], *inputs, slots, staggered_flush=True)
        assert torch.equal(bits(a), bits(b))
    for t0, t1 in zip(caches[0].cache_tensors, caches[1].cache_tensors):
        assert torch.equal(bits(t0), bits(t1))


def staggered_rows(layer, num_slots, L, rc, seed, checkpoint_dtype=torch.float32):
    """Two caches with staggered fold phases (a quarter of the slots fold in each step at L = 4), one
    slot without room, and a batch naming the slots in a random order (int64) with two pad rows."""
    caches = [gpu_cache(layer, num_slots, buffer_len=L, read_copy_dtype=rc, checkpoint_dtype=checkpoint_dtype,
                        staggered_flush=True) for _ in range(2)]
    init = layer.states(num_slots).cuda().float()
    for c in caches:
        c.load(init)
        c.num_committed[3] = L + 2
    slots = torch.randperm(num_slots, generator=torch.Generator().manual_seed(seed))[: num_slots - 4]
    slots[[1, 7]] = caches[0].pad_slot_id
    return caches, slots.cuda()


def step_with_and_without_hint(caches, layer, slots):
    """One step of the same inputs, without the staggered_flush hint on caches[0] and with it on
    caches[1]: outputs and cursors must be bit for bit equal. Returns which slots folded in it."""
    before = caches[1].num_committed.cpu()
    inputs = [t.cuda() for t in layer.inputs(slots.numel())]
    a = cuda_step(caches[0], *inputs, slots, staggered_flush=False)
    b = cuda_step(caches[1], *inputs, slots, staggered_flush=True)
    assert torch.equal(bits(a), bits(b))
    assert torch.equal(caches[0].num_committed, caches[1].num_committed)
    return (before > 0) & (caches[1].num_committed.cpu() == 0)


# With the hint, a read copy (or the fp32 checkpoint's tensor-core replay) and more than one wave of CTAs
# of more than one head, the step runs the order pass first (the rows whose slot folds start first): the folding, replaying, pad and no-room rows
# must come out bit for bit as without it, also past 1,024 rows (the pass takes them 1,024 at a time).
# nano4b at batch 36 gets 2 heads per CTA with the hint, MANY_ROWS at 1,096 rows 4.
@pytest.mark.parametrize("dims,num_slots,ck,rc", [(NANO4B, 40, torch.float32, torch.bfloat16),
                                                  (NANO4B, 40, torch.float32, FP8),
                                                  (NANO4B, 40, torch.bfloat16, FP8),
                                                  (MANY_ROWS, 1100, torch.float32, FP8),
                                                  (NANO4B, 40, torch.float32, None),
                                                  (MANY_ROWS, 1100, torch.float32, None)],
                         ids=["nano4b-bf16-copy", "nano4b-fp8-copy", "nano4b-bf16-checkpoint-fp8-copy",
                              "1096-rows-fp8-copy", "nano4b-no-copy", "1096-rows-no-copy"])
def test_step_order_pass_changes_no_bits(dims, num_slots, ck, rc):
    check_order_pass_changes_no_bits(dims, num_slots, ck, rc)


# A 16-bit checkpoint without a read copy through the ordered kernel at every launch (step_order = 1,
# past the rule, which takes it only past one wave or with the fold split) and the fold split's rule:
# bit for bit as without the hint, and the pass did run.
@pytest.mark.parametrize("ck", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dims,num_slots", [(NANO4B, 40), (MANY_ROWS, 1100)], ids=["nano4b", "1096-rows"])
def test_step_forced_order_pass_changes_no_bits(dims, num_slots, ck, set_overrides):
    set_overrides(step_order=1)
    check_order_pass_changes_no_bits(dims, num_slots, ck, None)
    layer = Layer(dims, seed=2)
    cache = gpu_cache(layer, num_slots, buffer_len=4, checkpoint_dtype=ck, staggered_flush=True)
    cache.load(layer.states(num_slots).cuda().float())
    inputs = [t.cuda() for t in layer.inputs(num_slots)]
    names = cuda_kernels_run(lambda: cuda_step(cache, *inputs, torch.arange(num_slots, device="cuda"), staggered_flush=True))
    assert any("row_order_kernel" in n for n in names), "the pass ran"


def check_order_pass_changes_no_bits(dims, num_slots, ck, rc):
    layer = Layer(dims, seed=21)
    L = 4
    caches, slots = staggered_rows(layer, num_slots, L, rc, seed=5, checkpoint_dtype=ck)
    folded = torch.zeros(num_slots, dtype=torch.bool)
    for _ in range(L + 2):
        folded |= step_with_and_without_hint(caches, layer, slots)
    assert folded.sum() >= num_slots // 2        # folds came in different steps, the case the pass orders
    assert caches[1].num_committed[3].item() == L + 2
    for t0, t1 in zip(caches[0].cache_tensors, caches[1].cache_tensors):
        assert torch.equal(bits(t0), bits(t1))


def cuda_kernels_run(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.key for e in prof.key_averages()}


# Where the order pass runs (the launcher's rule, 132 SMs): with the hint and a read copy, or without one
# on tensor cores, at nano4b batch 40 (2 heads per CTA, 1,920 CTAs); not without the hint, nor at batch 1 (one wave: every CTA starts at once), nor with one
# head per CTA, nor with the step_order override = 0.
def test_step_order_pass_runs_only_where_the_launcher_rule_says(set_overrides):
    layer = Layer(NANO4B, seed=2)
    caches = {rc: gpu_cache(layer, 40, buffer_len=4, read_copy_dtype=rc, staggered_flush=True) for rc in (None, FP8)}
    for c in caches.values():
        c.load(layer.states(40).cuda().float())

    def order_pass_ran(batch, hint, rc=FP8):
        inputs = [t.cuda() for t in layer.inputs(batch)]
        slots = torch.arange(batch, device="cuda")
        names = cuda_kernels_run(lambda: cuda_step(caches[rc], *inputs, slots, staggered_flush=hint))
        assert any("step_kernel" in n for n in names)
        return any("row_order_kernel" in n for n in names)

    assert order_pass_ran(40, True)
    assert not order_pass_ran(40, False)
    assert order_pass_ran(40, True, rc=None)
    assert not order_pass_ran(1, True)
    set_overrides(step_order=0)
    assert not order_pass_ran(40, True)
    assert not order_pass_ran(40, True, rc=None)
    set_overrides(step_order=None)
    set_overrides(step_heads_per_cta=1)
    assert not order_pass_ran(40, True)


def step_grids(fn):
    """The grids (x, y, z) of the step kernels that fn launches, from the profiler's trace."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return [tuple(e["args"]["grid"]) for e in events if e.get("cat") == "kernel" and "step_kernel" in e["name"]]


# The launch overrides' Python hook (replayssm_cuda.launch_overrides over _C.set_launch_overrides): what
# it sets is what the next launch plans with, every field is checked, and the previous overrides come
# back on exit. nano4b, fp32 checkpoint, batch 8: 4 heads a CTA are 24 CTAs a row, whole groups 8.
def test_launch_overrides_reach_the_launch():
    from replayssm_cuda import _extension, get_launch_overrides, launch_overrides

    before = get_launch_overrides()
    with pytest.raises(ValueError, match="unknown field step_heads"):
        _extension._C.set_launch_overrides({"step_heads": 2})
    with pytest.raises(ValueError, match=r"step_groups_per_cta must be in \[0, 2\]"):
        with launch_overrides(step_groups_per_cta=3):
            pass
    with pytest.raises(ValueError, match="step_order must be an int or None, got str"):
        _extension._C.set_launch_overrides({"step_order": "1"})
    assert get_launch_overrides() == before
    layer = Layer(NANO4B, seed=4)
    cache = gpu_cache(layer, 8, buffer_len=4)
    inputs = [t.cuda() for t in layer.inputs(8)]
    slots = torch.arange(8, device="cuda")
    for heads_per_cta, ctas_per_row in [(4, 24), (12, 8), (5, 24)]:
        with launch_overrides(step_heads_per_cta=heads_per_cta) as now:
            assert now["step_heads_per_cta"] == heads_per_cta
            assert step_grids(lambda: cuda_step(cache, *inputs, slots)) == [(ctas_per_row, 8, 1)]
    assert get_launch_overrides() == before


# Below one CTA per (row, group) per SM, the step takes the smallest part of a group whose CTAs the SMs
# hold at once (one wave). The H200's numbers: 132 SMs; nano4b's kernels hold 2 CTAs an SM without a
# copy (264 at once), 3 with an fp8 copy (396). Without a copy: batch 4 2 heads a CTA (192 CTAs), batch 8
# 3 heads (256), batch 16 6 heads (256); with fp8: batch 4 1 head (384), batch 8 2 heads (384), batch 16
# 4 heads (384); batch 1 one head (96 CTAs) for both. With the staggered-flush hint and the fold split
# off, one head per CTA as before (the split's grids: test_step_fold_split_changes_no_bits). The grid's x
# is the CTAs per row: heads / heads per CTA.
H200_STEP_CTAS_PER_ROW = {(None, 1): 96, (None, 4): 48, (None, 8): 32, (None, 16): 16,
                          (FP8, 1): 96, (FP8, 4): 96, (FP8, 8): 48, (FP8, 16): 24}


def test_step_below_one_wave_takes_the_most_ctas_one_wave_holds(set_overrides):
    props = torch.cuda.get_device_properties(0)
    if (props.major, props.minor, props.multi_processor_count) != (9, 0, 132):
        pytest.skip("the expected CTA counts are the H200's (132 SMs, sm_90 occupancy)")
    set_overrides(step_heads_per_cta=None)
    layer = Layer(NANO4B, seed=5)

    def grid_x(batch, rc, hint=False):
        cache = gpu_cache(layer, batch, buffer_len=4, read_copy_dtype=rc, staggered_flush=hint)
        inputs = [t.cuda() for t in layer.inputs(batch)]
        grids = step_grids(lambda: cuda_step(cache, *inputs, torch.arange(batch, device="cuda"), staggered_flush=hint))
        assert len(grids) == 1 and grids[0][1] == batch, grids
        return grids[0][0]

    for (rc, batch), ctas_per_row in H200_STEP_CTAS_PER_ROW.items():
        assert grid_x(batch, rc) == ctas_per_row, (rc, batch)
    # Two whole groups a CTA (4 CTAs a row) with an fp8 copy where whole groups would pass one wave and
    # two-group CTAs do not (batch 50-99 at 396 resident): not at batch 49 or 100, nor with a bf16 copy
    # or none (half groups there: 16 CTAs a row).
    for rc, batch, ctas_per_row in [(FP8, 64, 4), (FP8, 99, 4), (FP8, 50, 4), (FP8, 100, 8), (FP8, 49, 8),
                                    (torch.bfloat16, 64, 16), (None, 64, 16)]:
        assert grid_x(batch, rc) == ctas_per_row, (rc, batch)
    set_overrides(step_fold_split=0)
    assert grid_x(16, FP8, hint=True) == 96, "hint without the fold split: one head per CTA"


# The fold split (staggered-flush hint, a read copy, whole groups of every row within one wave; see
# mamba2_fold_split): replaying rows in one-wave CTAs, the first `rows` folding rows in CTAs `split`
# times smaller, their other parts in helper rows at the top of the grid. Bit for bit as without the
# hint over two cycles of staggered phases (steps with different numbers of folding rows), with pad and
# no-room rows, then with every slot folding in the same step (more folding rows than the split serves:
# the rest fold in replay-sized CTAs). The grid (H200: 396 resident CTAs for these kernels) shows it
# ran: x = heads / replay heads per CTA, y = batch + rows * (split - 1).
@pytest.mark.parametrize("dims,num_slots,L,rc,grid", [
    (SUPER120B, 20, 16, FP8, (16, 16 + 1 * 7)),            # 8-head replay CTAs, one row of 1-head folds
    (SUPER120B, 20, 4, torch.bfloat16, (8, 16 + 4 * 7)),   # whole-group replay, four rows of 2-head folds
    (NANO4B, 20, 4, FP8, (16, 16 + 4 * 2)),                # 6-head replay, four rows of 2-head folds
    (SUPER120B, 20, 4, None, (8, 16 + 4 * 7)),             # no copy (tf32 replay, 3 CTAs an SM): as bf16
    ((16, 64, 128, 1), 68, 16, FP8, (4, 64 + 4 * 3)),      # super120b@tp8 b64 (2-3 waves, batch >= L): 4-head
                                                           # replay, four rows of 1-head folds
], ids=["super120b-b16-L16-fp8", "super120b-b16-L4-bf16", "nano4b-b16-L4-fp8", "super120b-b16-L4-no-copy",
        "super120b-tp8-b64-L16-fp8"])
def test_step_fold_split_changes_no_bits(dims, num_slots, L, rc, grid, set_overrides):
    set_overrides(step_heads_per_cta=None, step_fold_split=None)
    layer = Layer(dims, seed=31)
    caches, slots = staggered_rows(layer, num_slots, L, rc, seed=9)
    props = torch.cuda.get_device_properties(0)
    if (props.major, props.minor, props.multi_processor_count) == (9, 0, 132):
        inputs = [t.cuda() for t in layer.inputs(slots.numel())]
        probe = [gpu_cache(layer, num_slots, buffer_len=L, read_copy_dtype=rc)]
        grids = step_grids(lambda: cuda_step(probe[0], *inputs, slots, staggered_flush=True))
        assert grids == [grid + (1,)], grids
    fold_counts = []
    for step in range(3 * L + 1):
        if step == 2 * L:                     # lock-step from here: every named slot folds at once
            for c in caches:
                c.num_committed[c.num_committed < L] = 0
        fold_counts.append(int(step_with_and_without_hint(caches, layer, slots).sum()))
    staggered = fold_counts[: 2 * L]
    assert max(staggered) >= 1 and min(staggered) < max(staggered), fold_counts
    named = {int(v) for v in slots.cpu() if v >= 0 and v != 3}          # slot 3 has no room, pads fold nothing
    assert max(fold_counts[2 * L:]) == len(named), fold_counts
    for t0, t1 in zip(caches[0].cache_tensors, caches[1].cache_tensors):
        assert torch.equal(bits(t0), bits(t1))


# The fold split chosen by hand (step_staggered_heads_per_cta, step_fold_split >= 1: the launch choices for
# the shapes the rule was not measured at), bit for bit as without the hint over two cycles of staggered
# phases: 4-head replay CTAs with 1-head folds, the forced split beyond one wave (nano4b batch 36: the
# hint's 2-head CTAs, 2,160 of them, 9 rows of 1-head folds), and the tf32 replay with 2-head folds. Grid
# (x, y) as on 132 SMs: heads / replay heads, batch + rows * (split - 1).
@pytest.mark.parametrize("dims,num_slots,L,rc,overrides,grid", [
    (SUPER120B, 20, 4, FP8, {"step_staggered_heads_per_cta": 4, "step_fold_split": 1}, (32, 16 + 4 * 3)),
    (NANO4B, 40, 4, torch.bfloat16, {"step_fold_split": 1}, (48, 36 + 9 * 1)),
    (SUPER120B, 20, 4, None, {"step_staggered_heads_per_cta": 8, "step_fold_split": 2}, (16, 16 + 4 * 3)),
], ids=["super120b-b16-k4-f1-fp8", "nano4b-b36-f1-bf16-waves", "super120b-b16-k8-f2-no-copy"])
def test_step_fold_split_overrides_change_no_bits(dims, num_slots, L, rc, overrides, grid, set_overrides):
    set_overrides(step_heads_per_cta=None, step_order=None, **overrides)
    layer = Layer(dims, seed=37)
    caches, slots = staggered_rows(layer, num_slots, L, rc, seed=11)
    props = torch.cuda.get_device_properties(0)
    if (props.major, props.minor, props.multi_processor_count) == (9, 0, 132):
        inputs = [t.cuda() for t in layer.inputs(slots.numel())]
        probe = gpu_cache(layer, num_slots, buffer_len=L, read_copy_dtype=rc)
        grids = step_grids(lambda: cuda_step(probe, *inputs, slots, staggered_flush=True))
        assert grids == [grid + (1,)], grids
    fold_counts = [int(step_with_and_without_hint(caches, layer, slots).sum()) for _ in range(2 * L + 1)]
    assert max(fold_counts) >= 1 and min(fold_counts) < max(fold_counts), fold_counts
    for t0, t1 in zip(caches[0].cache_tensors, caches[1].cache_tensors):
        assert torch.equal(bits(t0), bits(t1))


def test_step_order_pass_under_cuda_graph_is_bitwise_eager():
    layer = Layer(NANO4B, seed=8)
    L = 4
    caches, slots = staggered_rows(layer, 40, L, FP8, seed=6)
    static_in = [t.cuda() for t in layer.inputs(slots.numel())]
    static_out = torch.empty_like(static_in[0])
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):      # warm-up on a side stream, as graph capture requires
        cuda_step(caches[0], *static_in, slots, static_out, staggered_flush=True)
        cuda_step(caches[1], *static_in, slots, staggered_flush=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cuda_step(caches[0], *static_in, slots, static_out, staggered_flush=True)
    for _ in range(2 * L + 1):            # every slot folds twice
        new = [t.cuda() for t in layer.inputs(slots.numel())]
        for s, n in zip(static_in, new):
            s.copy_(n)
        graph.replay()
        eager = cuda_step(caches[1], *new, slots, staggered_flush=True)
        assert torch.equal(bits(static_out), bits(eager))
    for a, b in zip(caches[0].cache_tensors, caches[1].cache_tensors):
        assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("heads_per_cta", [None, 1], ids=["auto", "one-head-ctas"])
def test_step_leaves_cursors_with_no_room_as_they_were(heads_per_cta, set_overrides):
    # A cursor that leaves no room (w >= L after masking off the head tickets, so also -1 and 70000)
    # must end as it was, whatever its high bits, with the slot's state untouched and zero outputs,
    # while the other rows step as usual; at one head per CTA a slot has H CTAs drawing tickets.
    if heads_per_cta is not None:
        set_overrides(step_heads_per_cta=heads_per_cta)
    layer = Layer(SUPER120B, seed=7)
    cache = gpu_cache(layer, 6, buffer_len=4)
    cache.load(layer.states(6).cuda().float())
    cursors = torch.tensor([1, -1, 4, 9, 70000, 2], dtype=torch.int32, device="cuda")
    cache.num_committed.copy_(cursors)
    before = [t.clone() for t in cache.cache_tensors]
    x, dt, B, C, z = [t.cuda() for t in layer.inputs(6)]
    out = cuda_step(cache, x, dt, B, C, z, None, torch.full_like(x, float("nan")))
    bad = [1, 2, 3, 4]
    assert torch.equal(cache.num_committed[bad], cursors[bad])
    for slot, w in ((0, 1), (5, 2)):
        moved = 0 if w + 1 + cache.max_draft_tokens > 4 else w + 1   # folded, or one entry further
        assert cache.num_committed[slot].item() == moved
    for a, b in zip(cache.cache_tensors, before):
        if a.dim() > 1:
            assert torch.equal(bits(a[bad]), bits(b[bad]))
    assert torch.count_nonzero(out[bad]) == 0
    assert torch.isfinite(out[[0, 5]]).all()


def test_strided_pool_and_int32_slots():
    layer = Layer(SUPER120B, seed=4)
    pool = torch.zeros(5, 3, layer.H, layer.P, layer.N, device="cuda")
    view = pool[:, 1]
    gpu = gpu_cache(layer, 5, buffer_len=3, checkpoint=view)
    plain = gpu_cache(layer, 5, buffer_len=3)
    init = layer.states(5).cuda().float()
    gpu.load(init)
    plain.load(init)
    slots = torch.tensor([4, 1], dtype=torch.int32, device="cuda")
    for _ in range(5):
        inputs = [t.cuda() for t in layer.inputs(2)]
        assert torch.equal(cuda_step(gpu, *inputs, slots), cuda_step(plain, *inputs, slots))
    assert torch.equal(pool[:, 1], plain.checkpoint)
    assert torch.count_nonzero(pool[:, 0]) == 0 and torch.count_nonzero(pool[:, 2]) == 0


def test_bad_inputs_name_the_argument():
    layer = Layer((8, 96, 128, 2), seed=5)         # P = 96 is not compiled
    cache = gpu_cache(layer, 2, buffer_len=4)
    x, dt, B, C, z = [t.cuda() for t in layer.inputs(2)]
    with pytest.raises(RuntimeError, match=r"mamba2_step: backend='cuda' asked for, but \(head_dim, state_dim\) = \(96, 128\) has no compiled kernel"):
        cuda_step(cache, x, dt, B, C, z, None)
    w = cache.weights
    with pytest.raises(RuntimeError, match=r"mamba2_step: checkpoint \(head_dim P, state_dim N\) must be one of .*got \(96, 128\)"):
        torch.ops.replayssm.mamba2_step(cache.checkpoint, None, None, cache.x_buf, cache.B_buf, cache.dt_buf,
                                        cache.num_committed, x, dt, w.A, B, C, torch.empty_like(x),
                                        None, None, None, True, 1, None, -1)
    layer = Layer(SMALL, seed=5)
    cache = gpu_cache(layer, 2, buffer_len=4)
    x, dt, B, C, z = [t.cuda() for t in layer.inputs(2)]
    w = cache.weights
    # The activations take the cache's dtype (x_buf's); the message names the input that differs.
    with pytest.raises(RuntimeError, match=r"mamba2_step: x must have the cache's activation dtype \(x_buf's, bfloat16\), got float16"):
        torch.ops.replayssm.mamba2_step(cache.checkpoint, None, None, cache.x_buf, cache.B_buf, cache.dt_buf,
                                        cache.num_committed, x.half(), dt, w.A, B.half(), C.half(), x.half(),
                                        None, None, None, True, 1, None, -1)
    with pytest.raises(RuntimeError, match=r"mamba2_step: C must have the cache's activation dtype \(x_buf's, bfloat16\), got float16"):
        torch.ops.replayssm.mamba2_step(cache.checkpoint, None, None, cache.x_buf, cache.B_buf, cache.dt_buf,
                                        cache.num_committed, x, dt, w.A, B, C.half(), torch.empty_like(x),
                                        None, None, None, True, 1, None, -1)
    xs, dts, Bs, Cs, zs = [t.cuda().unsqueeze(1) for t in layer.inputs(2)]   # T = 1
    with pytest.raises(RuntimeError, match=r"mamba2_verify: z must have the cache's activation dtype \(x_buf's, bfloat16\), got float16"):
        torch.ops.replayssm.mamba2_verify(cache.checkpoint, None, None, cache.x_buf, cache.B_buf, cache.dt_buf,
                                          cache.num_committed, cache.num_verified, xs, dts, w.A, Bs, Cs, torch.empty_like(xs), None,
                                          zs.half(), None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"mamba2_update: A must have dtype in \{float32\}, got float64"):
        torch.ops.replayssm.mamba2_update(cache.checkpoint, x, dt, w.A.double(), B, C, torch.empty_like(x),
                                          None, None, None, True, None, -1)


def test_torch_compile_fullgraph_step():
    layer = Layer(SMALL, seed=6)
    caches = [gpu_cache(layer, 3, buffer_len=3, read_copy_dtype=torch.bfloat16) for _ in range(2)]
    init = layer.states(3).cuda().float()
    for c in caches:
        c.load(init)
    slots = torch.tensor([2, 0], dtype=torch.int64, device="cuda")

    def step(c, x, dt, B, C, z, out):
        w = c.weights
        torch.ops.replayssm.mamba2_step(c.checkpoint, c.read_copy, c.read_scale, c.x_buf, c.B_buf, c.dt_buf,
                                        c.num_committed, x, dt, w.A, B, C, out, w.D, z, w.dt_bias, True, 1,
                                        slots, -1)
        return out

    compiled = torch.compile(step, fullgraph=True)
    for _ in range(4):                     # crosses a fold at L=3
        inputs = [t.cuda() for t in layer.inputs(2)]
        a = compiled(caches[0], *inputs, torch.empty_like(inputs[0]))
        b = step(caches[1], *inputs, torch.empty_like(inputs[0]))
        assert torch.equal(a, b)
    for t0, t1 in zip(caches[0].cache_tensors, caches[1].cache_tensors):
        assert torch.equal(bits(t0), bits(t1))
