"""Stochastic rounding in the compiled Mamba-2 kernels (update, step's fold, commit, flush) against the
reference's rounding rule and bits (reference.stochastic_round, reference.rounding_bits).

The kernel's fp32 value before rounding is observable: the same kernel with an fp32 checkpoint, fed the
same 16-bit state and inputs, runs the same arithmetic and stores it unrounded. So the 16-bit result
must equal the reference's stochastic rounding of that fp32 result bit for bit, everywhere. Against the
reference *ops* (torch arithmetic, whose fp32 values differ in the last bits) the results may differ
by one 16-bit ulp on a small fraction of elements. Plus: graph replay == eager, one seed twice gives
the same bits, both CTA shapes of the step, bf16 and fp16, bad arguments."""

import pytest
import torch

from replayssm_cuda import Mamba2Cache, ops
from replayssm_cuda import reference as R
from test_mamba2_cuda import Layer as Mamba2Layer

FP8 = torch.float8_e4m3fn
HALF16 = [torch.bfloat16, torch.float16]
NANO4B = (96, 80, 128, 8)
ODD = (24, 80, 64, 8)         # 3 heads per group, N = 64 (5 fold rows per thread: an odd draw)
SMALL = (8, 128, 64, 2)
SEED = 0x0123_4567_89AB_CDEF


def _name(d):
    return str(d).replace("torch.", "")


class Layer(Mamba2Layer):
    """test_mamba2_cuda's layer (weights) with inputs on the GPU (optional lead dims, e.g. draft tokens)
    and states in a given dtype."""

    def inputs(self, batch, lead=()):
        g = self.gen
        shapes = [(batch, *lead, self.H, self.P), (batch, *lead, self.H), (batch, *lead, self.G, self.N),
                  (batch, *lead, self.G, self.N), (batch, *lead, self.H, self.P)]
        scales = [1.0, 0.5, 1.0, 1.0, 1.0]
        return [(s * torch.randn(shape, generator=g)).to(self.act).cuda() for s, shape in zip(scales, shapes)]

    def states(self, num_slots, dtype):
        return (0.3 * torch.randn(num_slots, self.H, self.P, self.N, generator=self.gen)).to(dtype)


def cache(layer, num_slots, ck, sr=False, seed=SEED, **kw):
    return Mamba2Cache(num_slots, layer.H, layer.P, layer.N, layer.G, layer.weights(), device="cuda",
                       checkpoint_dtype=ck, activation_dtype=layer.act, backend="cuda", stochastic_rounding=sr,
                       seed=seed, **kw)


def expect_sr_of(got16, pre32, dtype, seed, offset, slots, what):
    """got16 (the kernel's 16-bit result for `slots`) == SR of pre32 (its fp32 value) with the bits of
    (seed, offset, slot, head, p, n), bit for bit."""
    bits = R.rounding_bits(seed, offset, torch.as_tensor(slots), *got16.shape[1:])
    want = R.stochastic_round(pre32.cpu(), dtype, bits)
    got = got16.cpu()
    assert got.dtype == want.dtype
    bad = (got.view(torch.int16) != want.view(torch.int16))
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.numel()} elements differ from the reference's SR"


def spacing16(t):
    """The distance from each 16-bit value to the next one away from zero."""
    mag = t.cpu().abs()
    return (mag.view(torch.int16) + 1).view(t.dtype).float() - mag.float()


def expect_close_to_reference_op(got16, ref16, pre_kernel, pre_ref, what, max_fraction=0.01):
    """The kernel against the reference *op*, whose own fp32 arithmetic gives slightly other values
    before rounding (pre_ref, from the reference with an fp32 checkpoint; pre_kernel likewise from the
    kernel): where those agree the 16-bit results are bitwise equal, elsewhere they differ by at most the
    pre-rounding difference plus one 16-bit ulp, and only a small fraction differs at all."""
    got, want = got16.cpu(), ref16.cpu().to(got16.dtype)
    pk, pr = pre_kernel.cpu().float(), pre_ref.cpu().float()
    same_pre = pk.view(torch.int32) == pr.view(torch.int32)
    equal = got.view(torch.int16) == want.view(torch.int16)
    assert equal[same_pre].all(), f"{what}: equal fp32 values rounded differently"
    bound = (pk - pr).abs() + torch.maximum(spacing16(got), spacing16(want))
    assert ((got.float() - want.float()).abs() <= bound).all(), f"{what}: more than one ulp beyond the fp32 difference"
    assert (~equal).float().mean() <= max_fraction, f"{what}: {100 * (~equal).float().mean():.2f}% differ"


# ---- conventional update (the L=1 path) -------------------------------------------------------------

# split: the update's items whole heads (0) or one pass of state rows (1): the random bits follow the
# element, not the item.
@pytest.mark.parametrize("dims", [NANO4B, ODD, SMALL], ids=["nano4b", "odd", "small"])
@pytest.mark.parametrize("dtype", HALF16, ids=_name)
@pytest.mark.parametrize("split", [0, 1])
def test_update_sr_is_the_reference_rounding_of_the_kernel_value(dims, dtype, split, set_overrides):
    set_overrides(update_split=split)
    layer = Layer(dims, seed=1)
    init = layer.states(7, dtype)
    slots = torch.tensor([4, -1, 0, 6, 2], device="cuda")
    valid = [4, 0, 6, 2]
    w = layer.weights()
    state16, state32 = init.cuda(), init.float().cuda()
    seed = torch.tensor([SEED, 77], dtype=torch.int64, device="cuda")
    for i in range(2):
        x, dt, B, C, z = layer.inputs(5)
        before = state16.clone()
        out16, out32 = torch.empty_like(x), torch.empty_like(x)
        ops.mamba2_update(state16, x, dt, w.A, B, C, out16, w.D, z, w.dt_bias, True, slots, -1, seed, backend="cuda")
        ops.mamba2_update(state32, x, dt, w.A, B, C, out32, w.D, z, w.dt_bias, True, slots, -1, backend="cuda")
        assert seed.tolist() == [SEED, 78 + i], "the launch advances the offset by one"
        assert torch.equal(out16, out32), "outputs come from the fp32 state before rounding"
        expect_sr_of(state16[valid], state32[valid], dtype, SEED, 77 + i, valid, f"update {i}")
        assert torch.equal(state16[[1, 3, 5]], init[[1, 3, 5]].cuda()), "slots no row names"
        if i == 0:  # the reference op on the same inputs, rounding and not
            ref16, ref32 = before.cpu(), before.cpu().float()
            args = (x.cpu(), dt.cpu(), w.A.cpu(), B.cpu(), C.cpu(), torch.empty_like(x.cpu()), w.D.cpu(), z.cpu(),
                    w.dt_bias.cpu(), True, slots.cpu(), -1)
            ops.mamba2_update(ref16, *args, torch.tensor([SEED, 77]), backend="reference")
            ops.mamba2_update(ref32, *args, backend="reference")
            expect_close_to_reference_op(state16[valid], ref16[valid], state32[valid], ref32[valid],
                                         "update vs reference op")
        state32.copy_(state16.float())   # continue both from the rounded state


def test_l1_cache_step_uses_the_rounding_update():
    layer = Layer(SMALL, seed=2)
    c = cache(layer, 3, torch.bfloat16, sr=True, buffer_len=1)
    c.load(layer.states(3, torch.bfloat16).cuda())
    c.step(*layer.inputs(3))
    assert c.rounding_seed.tolist() == [SEED, 1]


# ---- replay step: the fused fold ------------------------------------------------------------------

@pytest.mark.parametrize("heads_per_cta", [1, 64])
# odd-fp8: P = 80, whose fold quantises the fp8 copy after the head's last row (from the tile in shared
# memory, packed as stored); small-fp8: P = 128, a batch of rows at a time.
@pytest.mark.parametrize("dims,rc", [(NANO4B, None), (ODD, None), (ODD, FP8), (SMALL, FP8)],
                         ids=["nano4b", "odd", "odd-fp8", "small-fp8"])
@pytest.mark.parametrize("dtype", HALF16, ids=_name)
def test_step_fold_sr_is_the_reference_rounding_of_the_kernel_value(dims, rc, dtype, heads_per_cta, set_overrides):
    set_overrides(step_heads_per_cta=heads_per_cta)
    layer = Layer(dims, seed=3)
    L, num_slots = 4, 6
    c16 = cache(layer, num_slots, dtype, sr=True, buffer_len=L, read_copy_dtype=rc)
    c32 = cache(layer, num_slots, torch.float32, buffer_len=L)
    init = layer.states(num_slots, dtype)
    c16.load(init.cuda())
    c32.load(init.float().cuda())
    slots = torch.tensor([3, -1, 0, 5], device="cuda")
    valid = [3, 0, 5]
    folds = 0
    for step in range(3 * L):
        inputs = layer.inputs(4)
        y16, y32 = c16.step(*inputs, slots=slots), c32.step(*inputs, slots=slots)
        assert c16.rounding_seed.tolist() == [SEED, step + 1]
        if int(c32.num_committed[valid[0]]) != 0:
            continue
        folds += 1   # this step folded every named slot (they move together)
        assert torch.equal(y16, y32), "a fold step's output comes from the fp32 state"
        expect_sr_of(c16.checkpoint[valid], c32.checkpoint[valid], dtype, SEED, step, valid, f"fold at step {step}")
        if rc is not None:   # the read copy is made from the checkpoint as stored (after SR)
            want_rc, want_scale = torch.empty_like(c16.read_copy), torch.empty_like(c16.read_scale)
            ops.make_read_copy(c16.checkpoint, want_rc, want_scale, backend="cuda")
            assert torch.equal(c16.read_copy[valid].view(torch.uint8), want_rc[valid].view(torch.uint8))
            assert torch.equal(c16.read_scale[valid], want_scale[valid])
        c32.checkpoint.copy_(c16.checkpoint.float())
    assert folds == 3
    assert torch.equal(c16.checkpoint[[1, 2, 4]].cpu(), init[[1, 2, 4]]), "slots no row names"


@pytest.mark.parametrize("dtype", HALF16, ids=_name)
def test_step_sr_vs_reference_op(dtype):
    layer = Layer(ODD, seed=4)
    L = 3
    gpu = cache(layer, 4, dtype, sr=True, seed=5, buffer_len=L)
    ref = Mamba2Cache(4, layer.H, layer.P, layer.N, layer.G, layer.weights("cpu"), buffer_len=L,
                      checkpoint_dtype=dtype, activation_dtype=layer.act, backend="reference",
                      stochastic_rounding=True, seed=5)
    gpu32 = cache(layer, 4, torch.float32, buffer_len=L)
    ref32 = Mamba2Cache(4, layer.H, layer.P, layer.N, layer.G, layer.weights("cpu"), buffer_len=L,
                        activation_dtype=layer.act, backend="reference")
    init = layer.states(4, dtype)
    gpu.load(init.cuda())
    gpu32.load(init.float().cuda())    # the compiled load takes fp32 states or the checkpoint's dtype
    for c in (ref, ref32):
        c.load(init)
    slots = torch.tensor([2, 0, 3])
    for _ in range(L):   # up to and including the first fold
        inputs = layer.inputs(3)
        for c in (gpu, gpu32):
            c.step(*inputs, slots=slots.cuda())
        for c in (ref, ref32):
            c.step(*[t.cpu() for t in inputs], slots=slots)
    assert gpu.rounding_seed.tolist() == ref.rounding_seed.tolist() == [5, L]
    assert torch.equal(gpu.num_committed.cpu(), ref.num_committed)
    expect_close_to_reference_op(gpu.checkpoint, ref.checkpoint, gpu32.checkpoint, ref32.checkpoint,
                                 "step fold vs reference op")


@pytest.mark.parametrize("heads_per_cta", [1, 64])
@pytest.mark.parametrize("dtype", HALF16, ids=_name)
def test_step_sr_graph_replay_is_bitwise_eager_and_seeds_repeat(dtype, heads_per_cta, set_overrides):
    set_overrides(step_heads_per_cta=heads_per_cta)
    layer = Layer(NANO4B, seed=6)
    caches = [cache(layer, 4, dtype, sr=True, buffer_len=4) for _ in range(2)] + [cache(layer, 4, dtype, sr=True,
                                                                                        seed=SEED + 1, buffer_len=4)]
    init = layer.states(4, dtype).cuda()
    for c in caches:
        c.load(init)
    slots = torch.tensor([2, 0, -1], dtype=torch.int32, device="cuda")
    static_in = layer.inputs(3)
    static_out = torch.empty_like(static_in[0])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):      # warm-up (one step each) outside the capture
        for c in caches:
            c.step(*static_in, slots=slots, out=static_out if c is caches[0] else None)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        caches[0].step(*static_in, slots=slots, out=static_out)
    for _ in range(9):                   # crosses two folds at L=4
        new = layer.inputs(3)
        for s, n in zip(static_in, new):
            s.copy_(n)
        graph.replay()
        eager = caches[1].step(*new, slots=slots)
        caches[2].step(*new, slots=slots)
        assert torch.equal(static_out, eager)
    assert caches[0].rounding_seed.tolist() == caches[1].rounding_seed.tolist() == [SEED, 10]
    for a, b in zip(caches[0].cache_tensors, caches[1].cache_tensors):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), "graph replay == eager, same seed"
    assert not torch.equal(caches[1].checkpoint, caches[2].checkpoint), "another seed, other roundings"


# ---- commit and flush: the fold kernel -------------------------------------------------------------

@pytest.mark.parametrize("dims", [NANO4B, ODD], ids=["nano4b", "odd"])
@pytest.mark.parametrize("dtype", HALF16, ids=_name)
def test_commit_and_flush_sr_are_the_reference_rounding_of_the_kernel_value(dims, dtype):
    layer = Layer(dims, seed=7)
    L, T, num_slots = 8, 3, 5
    c16 = cache(layer, num_slots, dtype, sr=True, buffer_len=L, max_draft_tokens=T)
    c32 = cache(layer, num_slots, torch.float32, buffer_len=L, max_draft_tokens=T)
    init = layer.states(num_slots, dtype)
    c16.load(init.cuda())
    c32.load(init.float().cuda())
    slots = torch.tensor([1, 4, -1, 0], device="cuda")
    gen = torch.Generator().manual_seed(8)
    offset, folds = 0, 0
    for rnd in range(7):
        inputs = layer.inputs(4, lead=(T,))
        c16.verify(*inputs, slots=slots)
        c32.verify(*inputs, slots=slots)
        accepted = torch.randint(0, T + 1, (4,), generator=gen).cuda()
        before = c32.num_committed.clone()
        c16.commit(accepted, slots=slots)
        c32.commit(accepted, slots=slots)
        # A row folded when its cursor went back to 0 with entries to fold (a fold has n > L - T > 0).
        folded = [s for r, s in enumerate(slots.tolist())
                  if s >= 0 and int(c32.num_committed[s]) == 0 and int(before[s]) + int(accepted[r]) > 0]
        expect_sr_of(c16.checkpoint[folded], c32.checkpoint[folded], dtype, SEED, offset, folded, f"commit {rnd}")
        folds += len(folded)
        offset += 1
        assert c16.rounding_seed.tolist() == [SEED, offset]
        c32.checkpoint.copy_(c16.checkpoint.float())
    c16.flush()
    c32.flush()
    expect_sr_of(c16.checkpoint, c32.checkpoint, dtype, SEED, offset, list(range(num_slots)), "flush")
    assert c16.rounding_seed.tolist() == [SEED, offset + 1]
    assert folds > 0
    assert torch.equal(c16.checkpoint[2].cpu(), init[2]), "a slot no row names and nothing to flush"


# ---- torch.compile, bad arguments -------------------------------------------------------------------

def test_torch_compile_fullgraph_step_with_seed():
    layer = Layer(SMALL, seed=9)
    caches = [cache(layer, 3, torch.bfloat16, sr=True, buffer_len=3) for _ in range(2)]
    init = layer.states(3, torch.bfloat16).cuda()
    for c in caches:
        c.load(init)
    slots = torch.tensor([2, 0], dtype=torch.int64, device="cuda")

    def step(c, x, dt, B, C, z, out):
        w = c.weights
        torch.ops.replayssm.mamba2_step(c.checkpoint, c.read_copy, c.read_scale, c.x_buf, c.B_buf, c.dt_buf,
                                        c.num_committed, x, dt, w.A, B, C, out, w.D, z, w.dt_bias, True, 1,
                                        slots, -1, c.rounding_seed)
        return out

    compiled = torch.compile(step, fullgraph=True)
    for _ in range(4):                     # crosses a fold at L=3
        inputs = layer.inputs(2)
        a = compiled(caches[0], *inputs, torch.empty_like(inputs[0]))
        b = step(caches[1], *inputs, torch.empty_like(inputs[0]))
        assert torch.equal(a, b)
    assert caches[0].rounding_seed.tolist() == caches[1].rounding_seed.tolist() == [SEED, 4]
    for t0, t1 in zip(caches[0].cache_tensors, caches[1].cache_tensors):
        assert torch.equal(t0.view(torch.uint8), t1.view(torch.uint8))


def test_bad_rounding_seed_names_the_argument():
    layer = Layer(SMALL, seed=10)
    c = cache(layer, 2, torch.float32, buffer_len=4)
    x, dt, B, C, z = layer.inputs(2)
    w = c.weights
    seed = torch.tensor([1, 0], dtype=torch.int64, device="cuda")

    def step(ck, rounding_seed):
        torch.ops.replayssm.mamba2_step(ck, None, None, c.x_buf, c.B_buf, c.dt_buf, c.num_committed, x, dt, w.A,
                                        B, C, torch.empty_like(x), None, None, None, True, 1, None, -1,
                                        rounding_seed)

    with pytest.raises(RuntimeError, match=r"mamba2_step: rounding_seed \(stochastic rounding\) is only for a bfloat16 or float16 checkpoint, got a float32 checkpoint"):
        step(c.checkpoint, seed)
    with pytest.raises(RuntimeError, match=r"mamba2_update: rounding_seed \(stochastic rounding\) is only for a bfloat16 or float16 state, got a float32 state"):
        torch.ops.replayssm.mamba2_update(c.checkpoint, x, dt, w.A, B, C, torch.empty_like(x), None, None, None,
                                          True, None, -1, seed)
    ck16 = c.checkpoint.bfloat16()
    with pytest.raises(RuntimeError, match=r"mamba2_step: rounding_seed must have dtype in \{int64\}, got int32"):
        step(ck16, seed.int())
    with pytest.raises(RuntimeError, match=r"mamba2_step: rounding_seed must have shape \(2,\), got \(3,\)"):
        step(ck16, torch.zeros(3, dtype=torch.int64, device="cuda"))
    with pytest.raises(RuntimeError, match=r"mamba2_step: rounding_seed must be a CUDA tensor, got a tensor on cpu"):
        step(ck16, seed.cpu())
    with pytest.raises(RuntimeError, match=r"mamba2_flush: rounding_seed \(stochastic rounding\) is only for"):
        torch.ops.replayssm.mamba2_flush(c.checkpoint, None, None, c.x_buf, c.B_buf, c.dt_buf, c.num_committed,
                                         w.A, None, -1, seed)
