"""verify_varlen on the compiled path (Mamba2Cache, GDNCache and KDACache with backend="cuda"): flattened drafts
with cu_seqlens, random per-row counts (a 0 and a max_draft_tokens in every round) and pads in the slot
list, against the fp64 reference over spec rounds that cross folds; bitwise the compiled dense verify
of the block it packs; captured once in a CUDA graph and replayed with other cu_seqlens contents,
bitwise eager; commit accepting at most each row's drafts.

Tolerances, as in test_mamba2_spec_cuda.py and test_gdn_spec_cuda.py (the same kernels, fed the same
bf16 inputs as the fp64 reference): bf16 outputs within a few bf16 ulps (norm-relative over the rows
that name a slot); the fp32 checkpoint at fp32 rounding after the folds."""

import pytest
import torch

from replayssm_cuda import DeltaRuleWeights, GDNCache, KDACache, Mamba2Cache, Mamba2Weights

DEVICE = "cuda"
T_MAX = 4
L = 9            # folds every L - T_MAX + 1 = 6 committed tokens
OUT_TOL = 8e-3
STATE_TOL = {"mamba2": 5e-6, "gdn": 1e-5, "kda": 1e-5}


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


class Mamba2:
    """One Mamba-2 layer (H=6 in 3 groups, P=N=64): weights, fp64 states, bf16 flattened inputs."""
    name = "mamba2"
    H, P, N, G = 6, 64, 64, 3

    def __init__(self, seed):
        self.gen = g = torch.Generator().manual_seed(seed)
        self.A = -(0.5 + torch.rand(self.H, generator=g))
        self.D = torch.randn(self.H, generator=g)
        self.dt_bias = 0.1 * torch.randn(self.H, generator=g)

    def cache(self, num_slots, backend, dtype=torch.float32, act=torch.bfloat16):
        w = Mamba2Weights(A=self.A.to(DEVICE, dtype), D=self.D.to(DEVICE, dtype),
                          dt_bias=self.dt_bias.to(DEVICE, dtype), dt_softplus=True)
        return Mamba2Cache(num_slots, self.H, self.P, self.N, self.G, w, buffer_len=L, max_draft_tokens=T_MAX,
                           checkpoint_dtype=dtype, activation_dtype=act, device=DEVICE, backend=backend)

    def states(self, num_slots):
        return 0.3 * torch.randn(num_slots, self.H, self.P, self.N, generator=self.gen, dtype=torch.float64)

    def inputs(self, total):
        g = self.gen
        x = torch.randn(total, self.H, self.P, generator=g)
        dt = 0.5 * torch.randn(total, self.H, generator=g)
        B = torch.randn(total, self.G, self.N, generator=g)
        C = torch.randn(total, self.G, self.N, generator=g)
        z = torch.randn(total, self.H, self.P, generator=g)
        return [t.to(DEVICE, torch.bfloat16) for t in (x, dt, B, C, z)]

    @staticmethod
    def out_like(inputs):
        return torch.empty_like(inputs[0])


class GDN:
    """One Gated DeltaNet layer (H=2, HV=4, K=V=64): weights, fp64 states, bf16 flattened inputs."""
    name = "gdn"
    cache_class = GDNCache
    H, HV, K, V = 2, 4, 64, 64

    def __init__(self, seed):
        self.gen = g = torch.Generator().manual_seed(seed)
        self.A_log = torch.log(0.02 + 0.4 * torch.rand(self.HV, generator=g))
        self.dt_bias = 0.5 * torch.randn(self.HV, generator=g)

    def cache(self, num_slots, backend, dtype=torch.float32, act=torch.bfloat16):
        w = DeltaRuleWeights(A_log=self.A_log.to(DEVICE, dtype), dt_bias=self.dt_bias.to(DEVICE, dtype))
        return self.cache_class(num_slots, self.H, self.HV, self.K, self.V, w, buffer_len=L, max_draft_tokens=T_MAX,
                        checkpoint_dtype=dtype, activation_dtype=act, device=DEVICE, backend=backend)

    def states(self, num_slots):
        return 0.3 * torch.randn(num_slots, self.HV, self.V, self.K, generator=self.gen, dtype=torch.float64)

    def inputs(self, total):
        g = self.gen
        q = torch.randn(total, self.H, self.K, generator=g)
        k = torch.randn(total, self.H, self.K, generator=g)
        v = torch.randn(total, self.HV, self.V, generator=g)
        a = torch.randn(total, self.HV, generator=g)
        b = torch.randn(total, self.HV, generator=g)
        return [t.to(DEVICE, torch.bfloat16) for t in (q, k, v, a, b)]

    @staticmethod
    def out_like(inputs):
        return torch.empty_like(inputs[2])


class KDA(GDN):
    """One Kimi Delta Attention layer (GDN's dims): the decay per v-head and key channel, so dt_bias (HV, K)
    and a (total, HV, K)."""
    name = "kda"
    cache_class = KDACache

    def __init__(self, seed):
        super().__init__(seed)
        self.dt_bias = 0.5 * torch.randn(self.HV, self.K, generator=self.gen)

    def inputs(self, total):
        q, k, v, _, b = super().inputs(total)
        a = torch.randn(total, self.HV, self.K, generator=self.gen).to(DEVICE, torch.bfloat16)
        return [q, k, v, a, b]


FAMILIES = {"mamba2": Mamba2, "gdn": GDN, "kda": KDA}


def cu_of(counts, dtype=torch.int32):
    return torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=dtype, device=DEVICE)


def random_counts(batch, gen, most=None):
    """Draft counts in [0, T_MAX] with a 0 and a T_MAX among them, summing to at most `most`."""
    while True:
        counts = torch.randint(0, T_MAX + 1, (batch,), generator=gen).tolist()
        counts[0], counts[-1] = 0, T_MAX
        counts = [counts[p] for p in torch.randperm(batch, generator=gen).tolist()]
        if most is None or sum(counts) <= most:
            return counts


def random_accepted(counts, gen):
    return torch.tensor([int(torch.randint(0, n + 1, (1,), generator=gen)) for n in counts], dtype=torch.int32,
                        device=DEVICE)


def token_rows(counts):
    """The row of every flattened token."""
    return [r for r, n in enumerate(counts) for _ in range(n)]


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("name", FAMILIES)
def test_varlen_rounds_match_reference(name, index_dtype):
    fam = FAMILIES[name](seed=1)
    gpu = fam.cache(8, "cuda")
    ref = fam.cache(8, "reference", dtype=torch.float64, act=torch.float64)
    init = fam.states(8)
    gpu.load(init.to(DEVICE, torch.float32))
    ref.load(init.to(DEVICE))
    slots = torch.tensor([5, -1, 0, 7, 2, 3, -1, 6], dtype=index_dtype, device=DEVICE)
    named = [int(s) >= 0 for s in slots.tolist()]
    gen = torch.Generator().manual_seed(2)
    folded = False
    for _ in range(12):
        counts = random_counts(slots.shape[0], gen)
        cu = cu_of(counts, index_dtype)
        flat = fam.inputs(sum(counts))
        y = gpu.verify_varlen(*flat, cu_seqlens=cu, slots=slots)
        y_ref = ref.verify_varlen(*(t.double() for t in flat), cu_seqlens=cu, slots=slots)
        valid = torch.tensor([named[r] for r in token_rows(counts)], dtype=torch.bool, device=DEVICE)
        assert torch.count_nonzero(y[~valid]) == 0, "a pad row's tokens get zero output"
        err = rel_err(y[valid], y_ref[valid])
        assert err < OUT_TOL, f"verify_varlen output error {err:.3g}"
        cursors = gpu.num_committed.clone()
        accepted = random_accepted(counts, gen)
        gpu.commit(accepted, slots=slots)
        ref.commit(accepted, slots=slots)
        assert torch.equal(gpu.num_committed, ref.num_committed), "cursors after commit"
        folded = folded or bool((gpu.num_committed < cursors).any())
    assert folded, "the rounds must cross a fold"
    err = rel_err(gpu.materialize(), ref.materialize())
    assert err < STATE_TOL[name], f"state error {err:.3g}"


def pack_by_hand(flat, counts):
    dense = []
    for t in flat:
        block = torch.zeros(len(counts), T_MAX, *t.shape[1:], dtype=t.dtype, device=DEVICE)
        for r, (n, start) in enumerate(zip(counts, [0, *torch.tensor(counts).cumsum(0).tolist()])):
            block[r, :n] = t[start:start + n]
        dense.append(block)
    return dense


@pytest.mark.parametrize("name", FAMILIES)
def test_varlen_is_the_dense_verify_of_its_block_bitwise(name):
    fam = FAMILIES[name](seed=3)
    caches = [fam.cache(6, "cuda") for _ in range(2)]
    init = fam.states(6).to(DEVICE, torch.float32)
    for c in caches:
        c.load(init)
    slots = torch.tensor([3, -1, 0, 5], dtype=torch.int32, device=DEVICE)
    counts = [2, 3, 4, 0]
    flat = fam.inputs(sum(counts))
    dense = caches[0].verify(*pack_by_hand(flat, counts), slots=slots)
    y = caches[1].verify_varlen(*flat, cu_seqlens=cu_of(counts), slots=slots)
    assert torch.equal(y, torch.cat([dense[r, :n] for r, n in enumerate(counts)]))
    for a, b in zip(caches[0].cache_tensors[:-1], caches[1].cache_tensors[:-1]):
        assert torch.equal(a, b)
    # ... except the verified counts (cache_tensors' last): each named slot's row's drafts, not the block's T
    assert caches[1].cache_tensors[-1] is caches[1].num_verified
    assert caches[1].num_verified[[3, 0, 5]].tolist() == [2, 4, 0]


@pytest.mark.parametrize("name", FAMILIES)
def test_cuda_graph_replays_new_cu_seqlens_bitwise_eager(name):
    """One capture of verify_varlen + commit with static inputs of 10 tokens for 4 rows; every replay
    writes new draft counts (summing to at most 10: the rest is padding) into cu_seqlens."""
    fam = FAMILIES[name](seed=4)
    caches = [fam.cache(5, "cuda") for _ in range(2)]
    init = fam.states(5).to(DEVICE, torch.float32)
    for c in caches:
        c.load(init)
    batch, total = 4, 10
    slots = torch.tensor([2, 0, -1, 4], dtype=torch.int32, device=DEVICE)
    static_in = fam.inputs(total)
    static_cu = cu_of([4, 2, 0, 3])
    static_acc = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    static_out = fam.out_like(static_in)

    def spec(cache, inputs, cu, accepted, out):
        cache.verify_varlen(*inputs, cu_seqlens=cu, slots=slots, out=out)
        cache.commit(accepted, slots=slots)
        return out

    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):      # warm-up on a side stream, as graph capture requires
        spec(caches[0], static_in, static_cu, static_acc, static_out)
        spec(caches[1], static_in, static_cu, static_acc, fam.out_like(static_in))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        spec(caches[0], static_in, static_cu, static_acc, static_out)
    gen = torch.Generator().manual_seed(5)
    folded = False
    for _ in range(12):
        cursors = caches[0].num_committed.clone()
        counts = random_counts(batch, gen, most=total)
        cu, acc, new = cu_of(counts), random_accepted(counts, gen), fam.inputs(total)
        for s, n in zip(static_in, new):
            s.copy_(n)
        static_cu.copy_(cu)
        static_acc.copy_(acc)
        graph.replay()
        eager = spec(caches[1], new, cu, acc, fam.out_like(static_in))
        assert torch.equal(static_out, eager)
        assert torch.count_nonzero(static_out[sum(counts):]) == 0, "tokens after the last row get zero output"
        for a, b in zip(caches[0].cache_tensors, caches[1].cache_tensors):
            assert torch.equal(a, b)
        folded = folded or bool((caches[0].num_committed < cursors).any())
    assert folded, "the replayed rounds must cross a fold"


@pytest.mark.parametrize("name", FAMILIES)
def test_commit_accepts_at_most_the_rows_drafts(name):
    """Accepting T_MAX in every row after a varlen verify commits each row's own draft count."""
    fam = FAMILIES[name](seed=6)
    cache = fam.cache(6, "cuda")
    cache.load(fam.states(6).to(DEVICE, torch.float32))
    slots = torch.tensor([4, -1, 0, 2], dtype=torch.int32, device=DEVICE)
    counts = [3, 2, 0, 1]
    cache.verify_varlen(*fam.inputs(sum(counts)), cu_seqlens=cu_of(counts), slots=slots)
    cache.commit(torch.full((4,), T_MAX, dtype=torch.int32, device=DEVICE), slots=slots)
    assert cache.num_committed.tolist() == [0, 0, 1, 0, 3, 0]
