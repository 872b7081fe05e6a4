"""Compiled Mamba-2 speculative ops (mamba2_verify, mamba2_commit, mamba2_flush, mamba2_materialize)
against the fp64 reference, on the reference dims (nano4b: H=96 P=80 N=128 G=8; super120b: H=128 P=64
N=128 G=8) and an odd one (H=6 G=3 P=64 N=64), over 50+ random spec rounds (random T, random acceptance
with none and all in every round) that cross several folds; pads, unnamed slots and out-of-range
cursors untouched; verify never writes the checkpoint, read copy or cursor; CUDA graphs; bad input.

Tolerances: outputs are stored in bf16/fp16 and compared as in test_mamba2_cuda.py (norm-relative error
over the valid rows: a few bf16 ulps, more with a read copy, whose rounding is the bound). The fp32
checkpoint must stay at fp32 rounding: 5e-6 relative (measured ~1e-7 per fold; the exponent differences
Lambda_t - Lambda_j over a window of 16 lose ~1e-6 in fp32), 16-bit checkpoints at their own rounding."""

import pytest
import torch

from replayssm_cuda import Mamba2Cache, ops
from test_mamba2_cuda import Layer as Mamba2Layer, bits, rel_err

FP8 = torch.float8_e4m3fn
# (H, P, N, G)
NANO4B = (96, 80, 128, 8)
SUPER120B = (128, 64, 128, 8)
ODD = (6, 64, 64, 3)           # 2 heads per group, N = 64
WIDE = (8, 128, 128, 2)        # P = N = 128: the largest verify tiles and shared memory at L = 64, T = 16

OUT_TOL = {None: 8e-3, torch.bfloat16: 2e-2, torch.float16: 1e-2, FP8: 8e-2}
CKPT_TOL = {torch.float32: 5e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}


class Layer(Mamba2Layer):
    """test_mamba2_cuda's layer (weights, fp64 states) with draft inputs: T tokens per row."""

    def inputs(self, batch, T):
        g = self.gen
        x = torch.randn(batch, T, self.H, self.P, generator=g)
        dt = 0.5 * torch.randn(batch, T, self.H, generator=g)
        B = torch.randn(batch, T, self.G, self.N, generator=g)
        C = torch.randn(batch, T, self.G, self.N, generator=g)
        z = torch.randn(batch, T, self.H, self.P, generator=g)
        return [t.to(self.act) for t in (x, dt, B, C, z)]


def gpu_cache(layer, num_slots, **kw):
    # backend "auto" for load/reset (not under test here); the ops under test are called with "cuda".
    return Mamba2Cache(num_slots, layer.H, layer.P, layer.N, layer.G, layer.weights("cuda"), device="cuda",
                       activation_dtype=layer.act, backend="auto", **kw)


def ref_cache(layer, num_slots, read_copy_dtype=None, **kw):
    # The fp64 reference runs on the GPU too (the H200's fp64 makes it cheap); same semantics as on CPU.
    return Mamba2Cache(num_slots, layer.H, layer.P, layer.N, layer.G, layer.weights("cuda", torch.float64),
                       device="cuda", checkpoint_dtype=torch.float64, activation_dtype=torch.float64,
                       read_copy_dtype=read_copy_dtype, backend="reference", **kw)


def cuda_verify(cache, x, dt, B, C, z, slots, out=None):
    w = cache.weights
    out = torch.full_like(x, float("nan")) if out is None else out
    return ops.mamba2_verify(*cache._spec_cache_args(), x, dt, w.A, B, C, out, w.D, z, w.dt_bias, w.dt_softplus,
                             slots, cache.pad_slot_id, backend="cuda")


def cuda_commit(cache, accepted, slots):
    ops.mamba2_commit(*cache._spec_cache_args(), accepted, cache.weights.A, cache.max_draft_tokens, slots,
                      cache.pad_slot_id, backend="cuda")


def cuda_flush(cache, slots=None):
    ops.mamba2_flush(*cache._cache_args(), cache.weights.A, slots, cache.pad_slot_id, backend="cuda")


def cuda_materialize(cache, slots):
    out = torch.full((slots.shape[0], *cache.checkpoint.shape[1:]), float("nan"), device="cuda")
    return ops.mamba2_materialize(cache.checkpoint, cache.x_buf, cache.B_buf, cache.dt_buf, cache.num_committed,
                                  cache.weights.A, out, slots, cache.pad_slot_id, backend="cuda")


def read_copy_of(cache):
    """make_read_copy (reference, on the GPU) of the current checkpoint, to compare bitwise."""
    copy = torch.empty_like(cache.read_copy)
    scale = None if cache.read_scale is None else torch.empty_like(cache.read_scale)
    ops.make_read_copy(cache.checkpoint, copy, scale, backend="reference")
    return copy, scale


def load_both(layer, gpu, ref, ck, num_slots):
    init = layer.states(num_slots)
    gpu.load(init.to("cuda", ck))
    ref.load(init.to(ck).double().cuda())


def spec_round(layer, gpu, ref, slots, T, accepted, out_tol, valid_rows):
    """One verify + commit on both caches; checks outputs, what verify must not write, and cursors."""
    x, dt, B, C, z = layer.inputs(slots.shape[0], T)
    protected = [t for t in (gpu.checkpoint, gpu.read_copy, gpu.read_scale, gpu.num_committed) if t is not None]
    before = [bits(t).clone() for t in protected]
    out = cuda_verify(gpu, x.cuda(), dt.cuda(), B.cuda(), C.cuda(), z.cuda(), slots.cuda())
    for b, t in zip(before, protected):
        assert torch.equal(b, bits(t)), "verify wrote the checkpoint, read copy or cursor"
    ref_out = ref.verify(*(t.cuda().double() for t in (x, dt, B, C, z)), slots=slots.cuda())
    pad_rows = [r for r in range(slots.shape[0]) if r not in valid_rows]
    assert torch.count_nonzero(out[pad_rows]) == 0, "rows that touch nothing get zero output"
    err = rel_err(out[valid_rows], ref_out[valid_rows])
    assert err < out_tol, f"verify output error {err:.3g}"
    cuda_commit(gpu, accepted.cuda(), slots.cuda())
    ref.commit(accepted.cuda(), slots=slots.cuda())
    assert torch.equal(gpu.num_committed, ref.num_committed), "cursors after commit"
    return err


SPEC_CONFIGS = [
    # dims, checkpoint dtype, read copy, L, max_draft_tokens, activations
    (NANO4B, torch.float32, None, 16, 4, torch.bfloat16),
    (NANO4B, torch.float32, torch.bfloat16, 16, 4, torch.bfloat16),
    (SUPER120B, torch.float32, FP8, 12, 4, torch.bfloat16),
    (SUPER120B, torch.float32, None, 8, 8, torch.float16),
    (ODD, torch.float32, torch.float16, 5, 3, torch.float16),
    (ODD, torch.bfloat16, FP8, 8, 4, torch.bfloat16),
    (ODD, torch.float16, None, 6, 2, torch.float16),
    (ODD, torch.float32, None, 64, 16, torch.bfloat16),
    (WIDE, torch.float32, None, 64, 16, torch.bfloat16),
    # 16-bit copies of the activations' type read on tensor cores: drafts 8-15 (the second n-tile), P = 128
    # (a warp with two m-tiles), N = 64
    (WIDE, torch.float32, torch.bfloat16, 32, 16, torch.bfloat16),
    (ODD, torch.float32, torch.float16, 24, 12, torch.float16),
]


# A verify CTA pipelines several heads of a group through its ring; at these small batches the launcher
# gives each CTA one head, so the multi-head path (ring refills, x windows two heads ahead, the
# coefficient buffers alternating by head) is forced as well.
@pytest.mark.parametrize("heads_per_cta", [None, 64], ids=["auto", "whole-group"])
@pytest.mark.parametrize("dims,ck,rc,L,Tmax,act", SPEC_CONFIGS)
def test_spec_rounds_match_reference(dims, ck, rc, L, Tmax, act, heads_per_cta, set_overrides):
    if heads_per_cta is not None:
        set_overrides(verify_heads_per_cta=heads_per_cta)
    layer = Layer(dims, act, seed=31 * L + Tmax)
    num_slots = 7
    gpu = gpu_cache(layer, num_slots, buffer_len=L, max_draft_tokens=Tmax, checkpoint_dtype=ck, read_copy_dtype=rc)
    ref = ref_cache(layer, num_slots, read_copy_dtype=rc, buffer_len=L, max_draft_tokens=Tmax)
    load_both(layer, gpu, ref, ck, num_slots)
    slots = torch.tensor([3, -1, 0, 6, 5], dtype=torch.int64)
    valid_rows, named, untouched = [0, 2, 3, 4], [3, 0, 6, 5], [1, 2, 4]
    before = [bits(t[untouched]).clone() for t in gpu.cache_tensors]
    gen = torch.Generator().manual_seed(7)
    rounds, folds = 50 if L < 64 else 60, 0
    for rnd in range(rounds):
        T = int(torch.randint(1, Tmax + 1, (1,), generator=gen))
        accepted = torch.randint(0, T + 1, (slots.shape[0],), generator=gen, dtype=torch.int32)
        accepted[rnd % 5] = 0
        accepted[(rnd + 2) % 5] = T
        cursors = ref.num_committed.cpu()
        spec_round(layer, gpu, ref, slots, T, accepted, OUT_TOL[rc], valid_rows)
        folds += int((ref.num_committed.cpu()[named] < cursors[named] + accepted[valid_rows]).sum())
    assert folds >= 3 * len(named), f"only {folds} folds: the rounds must cross several"
    err = rel_err(gpu.checkpoint[named], ref.checkpoint[named])
    assert err < CKPT_TOL[ck], f"checkpoint error {err:.3g}"
    if rc is not None:
        copy, scale = read_copy_of(gpu)
        assert torch.equal(bits(copy), bits(gpu.read_copy)), "the fold's read copy is make_read_copy's"
        if scale is not None:
            assert torch.equal(scale, gpu.read_scale)
    for t_before, t in zip(before, gpu.cache_tensors):
        assert torch.equal(t_before, bits(t[untouched])), "a slot no row names changed"
    mat_slots = torch.tensor([5, -1, 3, 0, 6])
    state = cuda_materialize(gpu, mat_slots.cuda())
    ref_state = ref.materialize(slots=mat_slots.cuda())
    assert torch.count_nonzero(state[1]) == 0
    err = rel_err(state[[0, 2, 3, 4]], ref_state[[0, 2, 3, 4]])
    assert err < CKPT_TOL[ck], f"materialize error {err:.3g}"


@pytest.mark.parametrize("dims", [NANO4B, SUPER120B], ids=["nano4b", "super120b"])
def test_fp32_verify_rounds_like_the_reference(dims):
    """Verify on an fp32 checkpoint computes at fp32 accuracy: its fp16 outputs equal the fp64 reference
    rounded to fp16 except where the exact value lies within a few fp32 errors of a rounding boundary
    (expected well under 1% of them; a tensor-core read must split each state element into two tf32
    parts: one alone leaves up to 2^-10 of each product, a sizeable fraction of an fp16 step). A
    differing output is off by a few fp16 steps at most where it is small (fp32 cancellation), never by
    one step of the largest output. Cursors spread by a few spec rounds first."""
    layer = Layer(dims, torch.float16, seed=17)
    num_slots, L, Tmax = 7, 16, 8
    gpu = gpu_cache(layer, num_slots, buffer_len=L, max_draft_tokens=Tmax)
    ref = ref_cache(layer, num_slots, buffer_len=L, max_draft_tokens=Tmax)
    load_both(layer, gpu, ref, torch.float32, num_slots)
    slots = torch.tensor([3, -1, 0, 6, 5], dtype=torch.int64)
    valid_rows = [0, 2, 3, 4]
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        accepted = torch.randint(0, 5, (slots.shape[0],), generator=gen, dtype=torch.int32)
        spec_round(layer, gpu, ref, slots, 4, accepted, OUT_TOL[None], valid_rows)
    # From here both use the GPU's fp32 checkpoint, so that only verify is compared.
    ref.checkpoint.copy_(gpu.checkpoint.double())
    x, dt, B, C, z = layer.inputs(slots.shape[0], Tmax)
    out = cuda_verify(gpu, x.cuda(), dt.cuda(), B.cuda(), C.cuda(), z.cuda(), slots.cuda())
    ref_out = ref.verify(*(t.cuda().double() for t in (x, dt, B, C, z)), slots=slots.cuda())
    got, want = out[valid_rows].float(), ref_out[valid_rows].to(torch.float16).float()
    differ = (got != want).double().mean().item()
    worst = ((got - want).abs().max() / want.abs().max()).item()
    print(f"fp16 outputs that differ from the rounded reference: {differ:.4%}; largest difference {worst:.3g} "
          "of the largest output")
    assert differ < 0.01, f"{differ:.2%} of the outputs differ from the correctly rounded reference"
    assert worst <= 2.0 ** -10


@pytest.mark.parametrize("heads_per_cta", [None, 64], ids=["auto", "whole-group"])
@pytest.mark.parametrize("rc", [None, torch.bfloat16, FP8])
def test_flush_and_materialize_match_reference(rc, heads_per_cta, set_overrides):
    if heads_per_cta is not None:
        set_overrides(verify_heads_per_cta=heads_per_cta)
    layer = Layer(SUPER120B, seed=5)
    num_slots, L, Tmax = 6, 8, 4
    gpu = gpu_cache(layer, num_slots, buffer_len=L, max_draft_tokens=Tmax, read_copy_dtype=rc)
    ref = ref_cache(layer, num_slots, read_copy_dtype=rc, buffer_len=L, max_draft_tokens=Tmax)
    load_both(layer, gpu, ref, torch.float32, num_slots)
    slots = torch.tensor([4, 1, 0, 2], dtype=torch.int32)
    gen = torch.Generator().manual_seed(9)
    for _ in range(3):
        accepted = torch.randint(0, 3, (4,), generator=gen, dtype=torch.int32)
        spec_round(layer, gpu, ref, slots, 2, accepted, OUT_TOL[rc], [0, 1, 2, 3])
    assert int(ref.num_committed.count_nonzero()) >= 2, "the flush must find committed entries"

    mat_slots = torch.tensor([2, -1, 4, 1, 3, 0], dtype=torch.int64)   # slot 3 never named: cursor 0
    state = cuda_materialize(gpu, mat_slots.cuda())
    ref_state = ref.materialize(slots=mat_slots.cuda())
    assert torch.count_nonzero(state[1]) == 0
    valid = [0, 2, 3, 4, 5]
    assert rel_err(state[valid], ref_state[valid]) < CKPT_TOL[torch.float32]
    assert torch.equal(state[4], gpu.checkpoint[3]), "an empty buffer materializes the checkpoint itself"

    flush_slots = torch.tensor([4, -1, 0], dtype=torch.int64)
    others = [1, 2, 3, 5]
    before = [bits(t[others]).clone() for t in gpu.cache_tensors]
    cuda_flush(gpu, flush_slots.cuda())
    ref.flush(slots=flush_slots.cuda())
    assert torch.equal(gpu.num_committed, ref.num_committed)
    assert rel_err(gpu.checkpoint[[4, 0]], ref.checkpoint[[4, 0]]) < CKPT_TOL[torch.float32]
    for t_before, t in zip(before, gpu.cache_tensors):
        assert torch.equal(t_before, bits(t[others])), "flush touched a slot it was not given"
    cuda_flush(gpu)
    ref.flush()
    assert int(gpu.num_committed.count_nonzero()) == 0
    assert rel_err(gpu.checkpoint, ref.checkpoint) < CKPT_TOL[torch.float32]
    # After a flush the materialized state is the checkpoint, bitwise (fp32 checkpoint, empty buffer).
    assert torch.equal(cuda_materialize(gpu, torch.arange(num_slots, device="cuda")), gpu.checkpoint)
    if rc is not None:
        copy, scale = read_copy_of(gpu)
        assert torch.equal(bits(copy), bits(gpu.read_copy))
        if scale is not None:
            assert torch.equal(scale, gpu.read_scale)


def test_commit_over_several_row_chunks():
    """The fold's CTAs find the folding rows 256 at a time: a batch over two chunks, rows in random slot
    order with pads, folds in every round (L = 4, T = 2)."""
    layer = Layer(ODD, seed=12)
    num_slots, batch, L, T = 600, 520, 4, 2
    gpu = gpu_cache(layer, num_slots, buffer_len=L, max_draft_tokens=T)
    ref = ref_cache(layer, num_slots, buffer_len=L, max_draft_tokens=T)
    load_both(layer, gpu, ref, torch.float32, num_slots)
    gen = torch.Generator().manual_seed(13)
    slots = torch.randperm(num_slots, generator=gen)[:batch]
    slots[::7] = -1
    valid = [r for r in range(batch) if slots[r] >= 0]
    for _ in range(4):
        accepted = torch.randint(0, T + 1, (batch,), generator=gen, dtype=torch.int32)
        spec_round(layer, gpu, ref, slots, T, accepted, OUT_TOL[None], valid)
    assert rel_err(gpu.checkpoint, ref.checkpoint) < CKPT_TOL[torch.float32]


def test_out_of_range_cursors_touch_nothing():
    layer = Layer(ODD, seed=6)
    num_slots, L, T = 6, 8, 3
    gpu = gpu_cache(layer, num_slots, buffer_len=L, max_draft_tokens=T)
    ref = ref_cache(layer, num_slots, buffer_len=L, max_draft_tokens=T)
    load_both(layer, gpu, ref, torch.float32, num_slots)
    # slot 1: past the buffer; slot 3: negative; slot 4: room for fewer than T entries; slot 0: fine
    for cache in (gpu, ref):
        cache.num_committed[torch.tensor([1, 3, 4])] = torch.tensor([L + 1, -3, L - 2], dtype=torch.int32,
                                                                    device=cache.device)
    slots = torch.tensor([1, 3, 4, 0])
    before = [bits(t[[1, 3, 4]]).clone() for t in gpu.cache_tensors]
    before_out_of_range = [bits(t[[1, 3]]).clone() for t in gpu.cache_tensors]
    x, dt, B, C, z = layer.inputs(4, T)
    out = cuda_verify(gpu, x.cuda(), dt.cuda(), B.cuda(), C.cuda(), z.cuda(), slots.cuda())
    ref_out = ref.verify(*(t.cuda().double() for t in (x, dt, B, C, z)), slots=slots.cuda())
    assert torch.count_nonzero(out[:3]) == 0 and torch.count_nonzero(ref_out[:3]) == 0
    assert rel_err(out[3], ref_out[3]) < OUT_TOL[None]
    for t_before, t in zip(before, gpu.cache_tensors):
        assert torch.equal(t_before, bits(t[[1, 3, 4]])), "verify touched a slot with no room"
    # Commit: the out-of-range cursors (slots 1, 3) touch nothing; slot 4 (w = L - 2 <= L) is legal and
    # folds by the flush-early rule, as in the reference.
    accepted = torch.full((4,), T, dtype=torch.int32)
    cuda_commit(gpu, accepted.cuda(), slots.cuda())
    ref.commit(accepted.cuda(), slots=slots.cuda())
    assert torch.equal(gpu.num_committed, ref.num_committed)
    assert rel_err(gpu.checkpoint[[4, 0]], ref.checkpoint[[4, 0]]) < CKPT_TOL[torch.float32]
    cuda_flush(gpu, torch.tensor([1, 3], device="cuda"))
    state = cuda_materialize(gpu, torch.tensor([1, 3], device="cuda"))
    assert torch.count_nonzero(state) == 0, "materialize of an out-of-range cursor gives zeros"
    for t_before, t in zip(before_out_of_range, gpu.cache_tensors):
        assert torch.equal(t_before, bits(t[[1, 3]])), "commit/flush touched an out-of-range cursor's slot"


@pytest.mark.parametrize("heads_per_cta", [None, 64], ids=["auto", "whole-group"])
def test_cuda_graph_verify_commit_is_bitwise_eager(heads_per_cta, set_overrides):
    if heads_per_cta is not None:
        set_overrides(verify_heads_per_cta=heads_per_cta)
    layer = Layer(NANO4B, seed=3)
    T, batch = 3, 4
    caches = [gpu_cache(layer, 5, buffer_len=8, max_draft_tokens=4, read_copy_dtype=FP8) for _ in range(2)]
    init = layer.states(5).cuda().float()
    for c in caches:
        c.load(init)
    slots = torch.tensor([2, 0, -1, 4], dtype=torch.int32, device="cuda")
    static_in = [t.cuda() for t in layer.inputs(batch, T)]
    static_acc = torch.zeros(batch, dtype=torch.int32, device="cuda")
    static_out = torch.empty_like(static_in[0])

    def spec(cache, inputs, accepted, out):
        cuda_verify(cache, *inputs, slots, out)
        cuda_commit(cache, accepted, slots)
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
        new = [t.cuda() for t in layer.inputs(batch, T)]
        acc = torch.randint(0, T + 1, (batch,), generator=gen, dtype=torch.int32).cuda()
        for s, n in zip(static_in, new):
            s.copy_(n)
        static_acc.copy_(acc)
        graph.replay()
        eager = spec(caches[1], new, acc, torch.empty_like(static_out))
        assert torch.equal(bits(static_out), bits(eager))
        for a, b in zip(caches[0].cache_tensors, caches[1].cache_tensors):
            assert torch.equal(bits(a), bits(b))
        folded = folded or bool((caches[0].num_committed < cursors).any())
    assert folded, "the replayed rounds must cross a fold"


def test_strided_pool_and_int32_slots_bitwise():
    layer = Layer(SUPER120B, seed=8)
    pool = torch.zeros(5, 3, layer.H, layer.P, layer.N, device="cuda")
    gpu = gpu_cache(layer, 5, buffer_len=6, max_draft_tokens=3, checkpoint=pool[:, 1])
    plain = gpu_cache(layer, 5, buffer_len=6, max_draft_tokens=3)
    init = layer.states(5).cuda().float()
    gpu.load(init)
    plain.load(init)
    slots = torch.tensor([4, 1], dtype=torch.int32, device="cuda")
    gen = torch.Generator().manual_seed(2)
    for _ in range(6):
        inputs = [t.cuda() for t in layer.inputs(2, 3)]
        assert torch.equal(cuda_verify(gpu, *inputs, slots), cuda_verify(plain, *inputs, slots))
        acc = torch.randint(0, 4, (2,), generator=gen, dtype=torch.int32).cuda()
        cuda_commit(gpu, acc, slots)
        cuda_commit(plain, acc.long(), slots.long())
    assert torch.equal(pool[:, 1], plain.checkpoint)
    assert torch.equal(gpu.num_committed, plain.num_committed)
    assert torch.count_nonzero(pool[:, 0]) == 0 and torch.count_nonzero(pool[:, 2]) == 0


def test_bad_inputs_name_the_argument():
    layer = Layer(ODD, seed=10)
    cache = gpu_cache(layer, 3, buffer_len=4, max_draft_tokens=2)
    w = cache.weights
    x, dt, B, C, z = [t.cuda() for t in layer.inputs(2, 5)]
    with pytest.raises(RuntimeError, match=r"mamba2_verify: the number of draft tokens T \(x.size\(1\)\) must be in \[1, min\(L = 4, 16\)\], got 5"):
        torch.ops.replayssm.mamba2_verify(*cache._spec_cache_args(), x, dt, w.A, B, C, torch.empty_like(x), None, None,
                                          None, True, None, -1)
    x, dt, B, C, z = [t.cuda() for t in layer.inputs(2, 2)]
    with pytest.raises(RuntimeError, match=r"mamba2_verify: C must have shape \(2, 2, 3, 64\), got \(2, 2, 3, 32\)"):
        torch.ops.replayssm.mamba2_verify(*cache._spec_cache_args(), x, dt, w.A, B, C[..., :32], torch.empty_like(x),
                                          None, None, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"mamba2_commit: num_accepted must have dtype in \{int32, int64\}, got float32"):
        torch.ops.replayssm.mamba2_commit(*cache._spec_cache_args(), torch.zeros(2, device="cuda"), w.A, 2, None, -1)
    with pytest.raises(RuntimeError, match=r"mamba2_commit: max_draft_tokens must be in \[1, L = 4\], got 5"):
        torch.ops.replayssm.mamba2_commit(*cache._spec_cache_args(), torch.zeros(2, dtype=torch.int32, device="cuda"),
                                          w.A, 5, None, -1)
    with pytest.raises(RuntimeError, match=r"mamba2_flush: slots must have shape \(\*,\), got \(2, 1\)"):
        torch.ops.replayssm.mamba2_flush(*cache._cache_args(), w.A,
                                         torch.zeros(2, 1, dtype=torch.int32, device="cuda"), -1)
    out16 = torch.empty(2, *cache.checkpoint.shape[1:], dtype=torch.float16, device="cuda")
    with pytest.raises(RuntimeError, match=r"mamba2_materialize: out must have dtype in \{float32\}, got float16"):
        torch.ops.replayssm.mamba2_materialize(cache.checkpoint, cache.x_buf, cache.B_buf, cache.dt_buf,
                                               cache.num_committed, w.A, out16, None, -1)
    out64 = torch.empty(2, *cache.checkpoint.shape[1:], dtype=torch.float64, device="cuda")
    with pytest.raises(RuntimeError, match=r"mamba2_materialize: backend='cuda' asked for, but a float64 out has no compiled kernel"):
        ops.mamba2_materialize(cache.checkpoint, cache.x_buf, cache.B_buf, cache.dt_buf, cache.num_committed, w.A,
                               out64, None, -1, backend="cuda")
    with pytest.raises(RuntimeError, match=r"mamba2_commit: A must have dtype in \{float32\}, got float64"):
        torch.ops.replayssm.mamba2_commit(*cache._spec_cache_args(), torch.zeros(2, dtype=torch.int32, device="cuda"),
                                          w.A.double(), 2, None, -1)
