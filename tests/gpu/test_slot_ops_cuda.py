"""Compiled cache slot ops (load, reset, copy_slots) against the reference: they move bytes, so the
results must be bitwise equal. Cache tensors of nano4b (H=96 P=80 N=128 G=8), super120b
(H=128 P=64 N=128 G=8) and odd Mamba-2 dims and of GDN/KDA caches; pads and out-of-range ids skipped,
unnamed slots bit-identical, overlapping copy lists as a gather, strided pools, CUDA-graph replay ==
eager, bad input naming the argument."""

import warnings

import pytest
import torch

from replayssm_cuda import DeltaRuleWeights, KDACache, ops
from test_mamba2_cuda import bits

FP8 = torch.float8_e4m3fn
# (H, P, N, G)
NANO4B = (96, 80, 128, 8)
SUPER120B = (128, 64, 128, 8)
ODD = (6, 80, 64, 3)


def random_fill(t, gen):
    """Random content of every byte range (never zeros), fp8 included."""
    if t.dtype == FP8:
        t.view(torch.uint8).copy_(torch.randint(0, 0x7e, t.shape, generator=gen, dtype=torch.uint8))
    elif t.dtype in (torch.int32, torch.int64):
        t.copy_(torch.randint(0, 9, t.shape, generator=gen))
    else:
        t.copy_(torch.rand(t.shape, generator=gen, dtype=torch.float64) + 0.5)


def mamba2_tensors(dims, num_slots, ck=torch.float32, rc=FP8, L=4, seed=0):
    """The cache tensors of one Mamba-2 layer on the GPU, random content: checkpoint, read copy, read
    scale, x_buf, B_buf, dt_buf, num_committed (the order of Mamba2Cache.cache_tensors)."""
    H, P, N, G = dims
    gen = torch.Generator().manual_seed(seed)
    shapes = [((num_slots, H, P, N), ck), ((num_slots, H, P, N), rc), ((num_slots, H, P), torch.float32),
              ((num_slots, H, L, P), torch.bfloat16), ((num_slots, G, L, N), torch.bfloat16),
              ((num_slots, H, L), torch.float32), ((num_slots,), torch.int32)]
    out = []
    for shape, dtype in shapes:
        if dtype is None:
            out.append(None)
            continue
        cpu = torch.empty(shape, dtype=dtype)
        random_fill(cpu, gen)
        out.append(cpu.cuda())
    if rc != FP8:
        out[2] = None
    return out


def assert_bitwise(gpu_tensors, cpu_tensors, what):
    for i, (g, c) in enumerate(zip(gpu_tensors, cpu_tensors)):
        if g is None:
            continue
        assert torch.equal(bits(g.cpu()), bits(c)), f"{what}: tensor {i} differs from the reference"


def cpu_copy(tensors):
    return [None if t is None else t.cpu().clone() for t in tensors]


# ---- copy_slots -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dims", [NANO4B, SUPER120B, ODD], ids=["nano4b", "super120b", "odd"])
@pytest.mark.parametrize("pad_slot_id", [-1, 0])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_copy_slots_is_a_gather_bitwise_equal_to_reference(dims, pad_slot_id, index_dtype):
    tensors = mamba2_tensors(dims, 8, seed=1)
    ref = cpu_copy(tensors)
    # A cycle 1 -> 2 -> 3 -> 1 (every destination is also a source), a chain 4 -> 5, 5 -> 6, pads,
    # an out-of-range id and pairs with slot 0 (the pad id when pad_slot_id == 0).
    src = torch.tensor([1, 2, 3, 4, 5, pad_slot_id, 7, 99, 0], dtype=index_dtype)
    dst = torch.tensor([2, 3, 1, 5, 6, 7, pad_slot_id, 7, 4], dtype=index_dtype)
    ops.copy_slots(tensors, src.cuda(), dst.cuda(), pad_slot_id, backend="cuda")
    ops.copy_slots(ref, src, dst, pad_slot_id, backend="reference")
    assert_bitwise(tensors, ref, "copy_slots")
    # Independent of the reference: the cycle moved whole slots.
    before = mamba2_tensors(dims, 8, seed=1)
    assert torch.equal(bits(tensors[0][2]), bits(before[0][1])) and torch.equal(bits(tensors[0][1]), bits(before[0][3]))
    assert torch.equal(bits(tensors[1][7]), bits(before[1][7])), "pairs with a pad or out-of-range id are skipped"


def test_copy_slots_many_pairs_strided_pool():
    """Many pairs (small staging chunks), duplicated sources, a checkpoint that is a strided pool view
    and a 2-byte-aligned slot pool (scalar granules)."""
    H, P, N = 2, 64, 64
    S = 700
    gen = torch.Generator().manual_seed(2)
    pool = torch.empty(S, 3, H, P, N)
    random_fill(pool, gen)
    pool = pool.cuda()
    odd = torch.empty(S, 2 * 7 + 1, dtype=torch.bfloat16)      # slot = 7 bf16 at offset 1: 2-byte aligned
    random_fill(odd, gen)
    odd = odd.cuda()
    tensors = [pool[:, 1], odd[:, 1:8], torch.randint(0, 9, (S,), dtype=torch.int32, generator=gen).cuda()]
    ref = cpu_copy(tensors)
    src = torch.randint(0, S, (600,), generator=gen)
    dst = torch.randperm(S, generator=gen)[:600]
    pool_before = pool.cpu()
    ops.copy_slots(tensors, src.cuda(), dst.cuda(), backend="cuda")
    ops.copy_slots(ref, src, dst, backend="reference")
    assert_bitwise(tensors, ref, "copy_slots")
    assert torch.equal(pool[:, 0].cpu(), pool_before[:, 0]) and torch.equal(pool[:, 2].cpu(), pool_before[:, 2])


# ---- reset ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dims", [NANO4B, SUPER120B, ODD], ids=["nano4b", "super120b", "odd"])
@pytest.mark.parametrize("slots", [[2, -1, 99, 5], None], ids=["named", "all"])
def test_reset_bitwise_equal_to_reference(dims, slots):
    tensors = mamba2_tensors(dims, 7, ck=torch.bfloat16, rc=FP8, seed=3)
    ref = cpu_copy(tensors)
    ck, rc, rs, *bufs, nc = tensors
    sl = None if slots is None else torch.tensor(slots, dtype=torch.int64)
    ops.reset(ck, rc, rs, bufs, nc, None if sl is None else sl.cuda(), -1, backend="cuda")
    rck, rrc, rrs, *rbufs, rnc = ref
    ops.reset(rck, rrc, rrs, rbufs, rnc, sl, -1, backend="reference")
    assert_bitwise(tensors, ref, "reset")
    named = range(7) if slots is None else [2, 5]
    for s in named:
        assert torch.count_nonzero(ck[s]) == 0 and torch.all(rs[s] == 1) and int(nc[s]) == 0
    if slots is not None:
        assert torch.count_nonzero(ck[0]) > 0, "an unnamed slot stays"


# ---- load -----------------------------------------------------------------------------------------

LOAD_CONFIGS = [
    # dims, checkpoint dtype, read copy, states dtype
    (NANO4B, torch.float32, None, torch.float32),
    (NANO4B, torch.float32, torch.bfloat16, torch.float32),
    (SUPER120B, torch.float32, FP8, torch.float32),
    (SUPER120B, torch.bfloat16, FP8, torch.float32),
    (ODD, torch.float16, None, torch.float32),
    (ODD, torch.bfloat16, None, torch.bfloat16),
    (ODD, torch.float32, torch.float16, torch.float32),
]


@pytest.mark.parametrize("dims,ck,rc,states_dtype", LOAD_CONFIGS)
@pytest.mark.parametrize("with_slots", [True, False])
def test_load_bitwise_equal_to_reference(dims, ck, rc, states_dtype, with_slots):
    H, P, N, _ = dims
    tensors = mamba2_tensors(dims, 6, ck=ck, rc=rc if rc is not None else torch.bfloat16, seed=4)
    if rc is None:
        tensors[1] = None
    ref = cpu_copy(tensors)
    gen = torch.Generator().manual_seed(5)
    # Large values too: fp16 conversion overflows to inf as torch's .to() does.
    states = (3 * torch.randn(4, H, P, N, generator=gen)).to(states_dtype)
    states[0, 0, 0, :4] = torch.tensor([1e5, -1e5, 0.0, 3e38]).to(states_dtype)
    slots = torch.tensor([5, -1, 1, 42], dtype=torch.int32) if with_slots else None
    ck_t, rc_t, rs_t, *_, nc_t = tensors
    ops.load(ck_t, rc_t, rs_t, nc_t, states.cuda(), None if slots is None else slots.cuda(), -1, backend="cuda")
    rck, rrc, rrs, *_, rnc = ref
    ops.load(rck, rrc, rrs, rnc, states, slots, -1, backend="reference")
    assert_bitwise(tensors, ref, "load")
    named = [5, 1] if with_slots else [0, 1, 2, 3]
    assert all(int(nc_t[s]) == 0 for s in named)


# ---- families and the cache objects ----------------------------------------------------------------

def test_kda_cache_fork_reset_load_on_the_device():
    """The cache methods of another family run the compiled ops (backend='auto' with a compiled op never
    warns) and agree bitwise with the reference cache."""
    kw = dict(num_slots=5, num_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=64, buffer_len=4,
              read_copy_dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(6)
    w = DeltaRuleWeights(A_log=torch.randn(4, generator=gen), dt_bias=torch.randn(4, 64, generator=gen))
    gpu = KDACache(weights=DeltaRuleWeights(w.A_log.cuda(), w.dt_bias.cuda()), device="cuda", **kw)
    ref = KDACache(weights=w, device="cpu", backend="reference", **kw)
    for g, r in zip(gpu.cache_tensors, ref.cache_tensors):
        random_fill(r, gen)
        g.copy_(r)
    states = torch.randn(2, 4, 64, 64, generator=gen)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)     # a reference fallback would warn
        gpu.copy_slots(torch.tensor([1, 3], device="cuda"), torch.tensor([3, 0], device="cuda"))
        gpu.reset(torch.tensor([2], device="cuda"))
        gpu.load(states.cuda(), torch.tensor([4, -1], device="cuda"))
    ref.copy_slots(torch.tensor([1, 3]), torch.tensor([3, 0]))
    ref.reset(torch.tensor([2]))
    ref.load(states, torch.tensor([4, -1]))
    assert_bitwise(gpu.cache_tensors, ref.cache_tensors, "KDACache")


# ---- CUDA graphs ----------------------------------------------------------------------------------

def test_slot_ops_cuda_graph_replay_is_bitwise_eager():
    dims = SUPER120B
    H, P, N, _ = dims
    caches = [mamba2_tensors(dims, 6, seed=7) for _ in range(2)]
    src = torch.tensor([1, 2, 3], dtype=torch.int32, device="cuda")
    dst = torch.tensor([2, 3, 1], dtype=torch.int32, device="cuda")
    reset_slots = torch.tensor([4, -1], dtype=torch.int64, device="cuda")
    load_slots = torch.tensor([0, 5], dtype=torch.int64, device="cuda")
    states = torch.randn(2, H, P, N, device="cuda")

    def sequence(t):
        ck, rc, rs, *bufs, nc = t
        torch.ops.replayssm.copy_slots([x for x in t if x is not None], src, dst, -1)
        torch.ops.replayssm.reset(ck, rc, rs, bufs, nc, reset_slots, -1)
        torch.ops.replayssm.load(ck, rc, rs, nc, states, load_slots, -1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        sequence(caches[0])
        sequence(caches[1])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sequence(caches[0])
    for _ in range(3):
        states.normal_()
        graph.replay()
        sequence(caches[1])
        for a, b in zip(caches[0], caches[1]):
            if a is not None:
                assert torch.equal(bits(a), bits(b))


# ---- bad input ------------------------------------------------------------------------------------

def test_bad_inputs_name_the_argument():
    tensors = mamba2_tensors(ODD, 4, seed=8)
    live = [t for t in tensors if t is not None]
    idx = torch.tensor([0, 1], device="cuda")
    with pytest.raises(RuntimeError, match=r"copy_slots: cache_tensors\[0\] must be contiguous inside a slot .*got strides"):
        torch.ops.replayssm.copy_slots([live[0].transpose(2, 3)], idx, idx, -1)
    with pytest.raises(RuntimeError, match=r"copy_slots: cache_tensors\[1\] must have num_slots = 4 slots in dim 0, got shape \(3, "):
        torch.ops.replayssm.copy_slots([live[0], live[1][:3]], idx, idx, -1)
    with pytest.raises(RuntimeError, match=r"copy_slots: src_slots must have dtype int32 or int64, got float32"):
        torch.ops.replayssm.copy_slots(live, idx.float(), idx, -1)
    with pytest.raises(RuntimeError, match=r"copy_slots: dst_slots must have the same shape as src_slots \(2,\), got \(3,\)"):
        torch.ops.replayssm.copy_slots(live, idx, torch.tensor([0, 1, 2], device="cuda"), -1)
    with pytest.raises(RuntimeError, match=r"copy_slots: dst_slots must have the same shape as src_slots \(2,\), got \(1,\)"):
        ops.copy_slots(live, idx, idx[:1], backend="cuda")      # the compiled path checks once, in C++
    ck, rc, rs, *bufs, nc = tensors
    with pytest.raises(RuntimeError, match=r"reset: read_scale must have dtype float32, got float16"):
        torch.ops.replayssm.reset(ck, rc, rs.half(), bufs, nc, None, -1)
    with pytest.raises(RuntimeError, match=r"reset: buffers\[1\] must be a CUDA tensor, got a tensor on cpu"):
        torch.ops.replayssm.reset(ck, rc, rs, [bufs[0], bufs[1].cpu()], nc, None, -1)
    H, P, N, _ = ODD
    states = torch.randn(2, H, P, N, device="cuda")
    with pytest.raises(RuntimeError, match=r"load: states must have dtype float32, got float16"):
        torch.ops.replayssm.load(ck, rc, rs, nc, states.half(), None, -1)
    with pytest.raises(RuntimeError, match=r"load: states must have shape \(batch, 6, 80, 64\) like the checkpoint's slots, got \(2, 6, 80, 32\)"):
        torch.ops.replayssm.load(ck, rc, rs, nc, states[..., :32], None, -1)
    with pytest.raises(RuntimeError, match=r"load: read_scale is required when read_copy is float8_e4m3fn"):
        torch.ops.replayssm.load(ck, rc, None, nc, states, None, -1)
    with pytest.raises(RuntimeError, match=r"load: backend='cuda' asked for, but float16 states for a float32 checkpoint"):
        ops.load(ck, rc, rs, nc, states.half(), backend="cuda")
    with pytest.raises(RuntimeError, match=r"load: states must be contiguous inside a row"):
        torch.ops.replayssm.load(ck, rc, rs, nc, states.transpose(2, 3).contiguous().transpose(2, 3), None, -1)
