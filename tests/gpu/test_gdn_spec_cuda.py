"""Compiled Gated DeltaNet speculative ops (torch.ops.replayssm.gdn_verify, gdn_commit, gdn_flush,
gdn_materialize) against the fp64 reference (replayssm_cuda.reference.delta_*), on the reference
shapes (qwen4b: H=16 HV=32 K=V=128; qwen122b: HV=64; a TP-sharded H=4 HV=16), K=V=64 and mixed K != V,
over 50+ random spec rounds (random T, random acceptance with none and all in every round) that cross
several folds; pads, unnamed slots and out-of-range cursors untouched; verify never writes the
checkpoint, read copy or cursor; copy_slots mid-window; CUDA graphs; strided pools; long runs whose
error stays flat; bad input.

The ops are called directly (torch.ops.replayssm.*): the caches here are plain tensors, the compiled
side in fp32 / 16-bit, the reference side in fp64 with the same read-copy dtype, both fed the same
16-bit inputs.

Tolerances: outputs are stored in bf16/fp16 and compared by norm-relative error over the valid rows (a
few 16-bit ulps, more with a read copy, whose rounding is the bound). An fp32 checkpoint must stay at
fp32 rounding (1e-5 relative: exponent differences Lambda_t - Lambda_j over a window lose ~1e-6 in
fp32, as in the reference's own fp32 path), 16-bit checkpoints at their own rounding.
"""

import math

import pytest
import torch

from replayssm_cuda import reference

FP8 = torch.float8_e4m3fn
DEVICE = "cuda"

# (H, HV, K, V)
QWEN4B = (16, 32, 128, 128)
QWEN122B = (16, 64, 128, 128)
TP = (4, 16, 128, 128)
SMALL = (2, 4, 64, 64)
K128_V64 = (2, 6, 128, 64)
K64_V128 = (3, 6, 64, 128)

OUT_TOL = {None: 8e-3, torch.bfloat16: 2e-2, torch.float16: 1e-2, FP8: 8e-2}
CKPT_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def bits(t):
    return t.view(torch.uint8) if t.dtype == FP8 else t.contiguous().view(torch.uint8)


def ops():
    return torch.ops.replayssm


class Layer:
    """Weights and random inputs of one GDN layer: q, k (batch, T, H, K), v (batch, T, HV, V), a, b
    (batch, T, HV) in the activation dtype (bf16 / fp16); A_log, dt_bias (HV,) fp32."""

    def __init__(self, dims, act=torch.bfloat16, seed=0):
        self.H, self.HV, self.K, self.V = dims
        self.act = act
        self.gen = torch.Generator().manual_seed(seed)
        g = self.gen
        # decays e^g with g = -exp(A_log) softplus(a + dt_bias) mostly in [-0.6, -0.02]: a window of 16
        # keeps its old entries in play
        self.A_log = torch.log(0.02 + 0.4 * torch.rand(self.HV, generator=g))
        self.dt_bias = 0.5 * torch.randn(self.HV, generator=g)
        self._device_weights = {}

    def weights(self, dtype=torch.float32):
        # Copied to the device once per dtype: a CUDA graph capture may call this, and a host-to-device
        # copy of a pageable tensor cannot be captured.
        if dtype not in self._device_weights:
            self._device_weights[dtype] = (self.A_log.to(DEVICE, dtype), self.dt_bias.to(DEVICE, dtype))
        return self._device_weights[dtype]

    def inputs(self, batch, T):
        g = self.gen
        q = torch.randn(batch, T, self.H, self.K, generator=g)
        k = torch.randn(batch, T, self.H, self.K, generator=g)
        v = torch.randn(batch, T, self.HV, self.V, generator=g)
        a = torch.randn(batch, T, self.HV, generator=g)
        b = torch.randn(batch, T, self.HV, generator=g)
        return [t.to(self.act) for t in (q, k, v, a, b)]

    def states(self, num_slots):
        return 0.5 * torch.randn(num_slots, self.HV, self.V, self.K, generator=self.gen)


class Cache:
    """The cache tensors of one layer (slot-major; docs/DESIGN.md section 7). `checkpoint` may be a view
    into a larger pool (strided slots)."""

    def __init__(self, layer, num_slots, L, ck=torch.float32, rc=None, act=None, aux=torch.float32, checkpoint=None):
        H, HV, K, V = layer.H, layer.HV, layer.K, layer.V
        act = layer.act if act is None else act
        self.L, self.act = L, act
        z = dict(device=DEVICE)
        self.checkpoint = torch.zeros(num_slots, HV, V, K, dtype=ck, **z) if checkpoint is None else checkpoint
        self.read_copy = None if rc is None else torch.zeros(num_slots, HV, V, K, dtype=rc, **z)
        self.read_scale = torch.ones(num_slots, HV, V, **z) if rc == FP8 else None
        self.k_buf = torch.zeros(num_slots, H, L, K, dtype=act, **z)
        self.v_buf = torch.zeros(num_slots, HV, L, V, dtype=act, **z)
        self.g_buf = torch.zeros(num_slots, HV, L, dtype=aux, **z)
        self.beta_buf = torch.zeros(num_slots, HV, L, dtype=aux, **z)
        self.u_buf = torch.zeros(num_slots, HV, L, V, dtype=aux, **z)
        self.num_committed = torch.zeros(num_slots, dtype=torch.int32, **z)
        self.num_verified = torch.zeros(num_slots, dtype=torch.int32, **z)

    def args(self):
        """The cache arguments of step and flush."""
        return (self.checkpoint, self.read_copy, self.read_scale, self.k_buf, self.v_buf, self.g_buf,
                self.beta_buf, self.u_buf, self.num_committed)

    def spec_args(self):
        """The cache arguments of verify and commit."""
        return (*self.args(), self.num_verified)

    def tensors(self):
        return [t for t in self.spec_args() if t is not None]

    def buffers(self):
        return (self.k_buf, self.v_buf, self.g_buf, self.beta_buf, self.u_buf)

    def load(self, states):
        self.checkpoint.copy_(states.to(DEVICE, self.checkpoint.dtype))
        self.num_committed.zero_()
        self.num_verified.zero_()
        if self.read_copy is not None:
            reference.make_read_copy(self.checkpoint, self.read_copy, self.read_scale)


def gpu_cache(layer, num_slots, L, ck=torch.float32, rc=None, **kw):
    return Cache(layer, num_slots, L, ck, rc, **kw)


def ref_cache(layer, num_slots, L, rc=None):
    return Cache(layer, num_slots, L, torch.float64, rc, act=torch.float64, aux=torch.float64)


def load_both(layer, gpu, ref, num_slots):
    init = layer.states(num_slots).to(gpu.checkpoint.dtype)
    gpu.load(init)
    ref.load(init.double())


def cuda_verify(layer, c, q, k, v, a, b, slots, out=None, pad_slot_id=-1, scale=None, l2norm=True):
    A_log, dt_bias = layer.weights()
    if out is None:
        out = torch.full((q.shape[0], q.shape[1], layer.HV, layer.V), float("nan"), dtype=q.dtype, device=DEVICE)
    ops().gdn_verify(*c.spec_args(), q, k, v, a, b, A_log, dt_bias, out, scale, l2norm, slots, pad_slot_id)
    return out


def ref_verify(layer, r, q, k, v, a, b, slots, pad_slot_id=-1, scale=None, l2norm=True):
    A_log, dt_bias = layer.weights(torch.float64)
    q, k, v, a, b = (t.to(DEVICE, torch.float64) for t in (q, k, v, a, b))
    out = torch.zeros(q.shape[0], q.shape[1], layer.HV, layer.V, dtype=torch.float64, device=DEVICE)
    reference.delta_verify(*r.spec_args(), q, k, v, a, b, A_log, dt_bias, out, scale, l2norm, slots, pad_slot_id)
    return out


def cuda_commit(c, accepted, max_draft_tokens, slots, pad_slot_id=-1, l2norm=True):
    ops().gdn_commit(*c.spec_args(), accepted, max_draft_tokens, l2norm, slots, pad_slot_id)


def ref_commit(r, accepted, max_draft_tokens, slots, pad_slot_id=-1, l2norm=True):
    reference.delta_commit(*r.spec_args(), accepted, max_draft_tokens, l2norm, slots, pad_slot_id)


def cuda_flush(c, slots=None, pad_slot_id=-1, l2norm=True):
    ops().gdn_flush(*c.args(), l2norm, slots, pad_slot_id)


def ref_flush(r, slots=None, pad_slot_id=-1, l2norm=True):
    reference.delta_flush(*r.args(), l2norm, slots, pad_slot_id)


def cuda_materialize(c, slots, pad_slot_id=-1, l2norm=True):
    out = torch.full((slots.shape[0], *c.checkpoint.shape[1:]), float("nan"), device=DEVICE)
    ops().gdn_materialize(c.checkpoint, *c.buffers(), c.num_committed, out, l2norm, slots, pad_slot_id)
    return out


def ref_materialize(r, slots, pad_slot_id=-1, l2norm=True):
    out = torch.zeros((slots.shape[0], *r.checkpoint.shape[1:]), dtype=torch.float64, device=DEVICE)
    reference.delta_materialize(r.checkpoint, *r.buffers(), r.num_committed, out, l2norm, slots, pad_slot_id)
    return out


def read_copy_of(c):
    """make_read_copy (reference) of the current checkpoint, to compare bitwise."""
    copy = torch.empty_like(c.read_copy)
    scale = None if c.read_scale is None else torch.empty_like(c.read_scale)
    reference.make_read_copy(c.checkpoint, copy, scale)
    return copy, scale


def spec_round(layer, gpu, ref, slots, T, accepted, max_draft_tokens, out_tol, valid_rows, pad_slot_id=-1,
               scale=None, l2norm=True):
    """One verify + commit on both caches; checks outputs, what verify must not write, and cursors."""
    q, k, v, a, b = layer.inputs(slots.shape[0], T)
    slots_d = slots.to(DEVICE)
    protected = [t for t in (gpu.checkpoint, gpu.read_copy, gpu.read_scale, gpu.num_committed) if t is not None]
    before = [bits(t).clone() for t in protected]
    out = cuda_verify(layer, gpu, *(t.to(DEVICE) for t in (q, k, v, a, b)), slots_d, pad_slot_id=pad_slot_id,
                      scale=scale, l2norm=l2norm)
    for t_before, t in zip(before, protected):
        assert torch.equal(t_before, bits(t)), "verify wrote the checkpoint, read copy or cursor"
    ref_out = ref_verify(layer, ref, q, k, v, a, b, slots_d, pad_slot_id=pad_slot_id, scale=scale, l2norm=l2norm)
    pad_rows = [r for r in range(slots.shape[0]) if r not in valid_rows]
    assert torch.count_nonzero(out[pad_rows]) == 0, "rows that touch nothing get zero output"
    err = rel_err(out[valid_rows], ref_out[valid_rows])
    assert err < out_tol, f"verify output error {err:.3g}"
    cuda_commit(gpu, accepted.to(DEVICE), max_draft_tokens, slots_d, pad_slot_id, l2norm)
    ref_commit(ref, accepted.to(DEVICE), max_draft_tokens, slots_d, pad_slot_id, l2norm)
    assert torch.equal(gpu.num_committed, ref.num_committed), "cursors after commit"
    return err


SPEC_CONFIGS = [
    # dims, checkpoint dtype, read copy, L, max_draft_tokens, activations
    (QWEN4B, torch.float32, None, 16, 4, torch.bfloat16),
    (QWEN4B, torch.float32, torch.bfloat16, 16, 4, torch.bfloat16),
    (QWEN122B, torch.float32, FP8, 12, 4, torch.bfloat16),
    (TP, torch.float32, None, 8, 8, torch.float16),
    (TP, torch.float32, torch.float16, 2, 1, torch.bfloat16),
    (TP, torch.bfloat16, None, 16, 4, torch.bfloat16),
    (TP, torch.float16, FP8, 16, 4, torch.float16),
    (SMALL, torch.float32, torch.float16, 5, 3, torch.float16),
    (SMALL, torch.bfloat16, FP8, 8, 4, torch.bfloat16),
    (SMALL, torch.float16, None, 6, 2, torch.float16),
    (SMALL, torch.bfloat16, None, 8, 4, torch.float16),       # a 16-bit checkpoint of the other type
    (SMALL, torch.float32, None, 1, 1, torch.bfloat16),       # L = 1: every commit folds
    (K128_V64, torch.float32, None, 64, 16, torch.bfloat16),  # the largest buffer and draft count
    (K64_V128, torch.float32, torch.bfloat16, 32, 16, torch.bfloat16),
    (K64_V128, torch.float32, FP8, 64, 16, torch.float16),
]


@pytest.mark.parametrize("dims,ck,rc,L,Tmax,act", SPEC_CONFIGS)
def test_spec_rounds_match_reference(dims, ck, rc, L, Tmax, act):
    layer = Layer(dims, act, seed=31 * L + Tmax)
    num_slots = 7
    gpu = gpu_cache(layer, num_slots, L, ck, rc)
    ref = ref_cache(layer, num_slots, L, rc)
    load_both(layer, gpu, ref, num_slots)
    slots = torch.tensor([3, -1, 0, 6, 5], dtype=torch.int64)
    valid_rows, named, untouched = [0, 2, 3, 4], [3, 0, 6, 5], [1, 2, 4]
    before = [bits(t[untouched]).clone() for t in gpu.tensors()]
    gen = torch.Generator().manual_seed(7)
    rounds, folds = (50 if L < 64 else 60), 0
    for rnd in range(rounds):
        T = int(torch.randint(1, Tmax + 1, (1,), generator=gen))
        accepted = torch.randint(0, T + 1, (slots.shape[0],), generator=gen, dtype=torch.int32)
        accepted[rnd % 5] = 0
        accepted[(rnd + 2) % 5] = T
        cursors = ref.num_committed.cpu()
        spec_round(layer, gpu, ref, slots, T, accepted, Tmax, OUT_TOL[rc], valid_rows)
        folds += int((ref.num_committed.cpu()[named] < cursors[named] + accepted[valid_rows]).sum())
    assert folds >= 3 * len(named), f"only {folds} folds: the rounds must cross several"
    err = rel_err(gpu.checkpoint[named], ref.checkpoint[named])
    assert err < CKPT_TOL[ck], f"checkpoint error {err:.3g}"
    if rc is not None:
        copy, scale = read_copy_of(gpu)
        assert torch.equal(bits(copy), bits(gpu.read_copy)), "the fold's read copy is make_read_copy's"
        if scale is not None:
            assert torch.equal(scale, gpu.read_scale)
    for t_before, t in zip(before, gpu.tensors()):
        assert torch.equal(t_before, bits(t[untouched])), "a slot no row names changed"
    mat_slots = torch.tensor([5, -1, 3, 0, 6], device=DEVICE)
    state = cuda_materialize(gpu, mat_slots)
    ref_state = ref_materialize(ref, mat_slots)
    assert torch.count_nonzero(state[1]) == 0
    err = rel_err(state[[0, 2, 3, 4]], ref_state[[0, 2, 3, 4]])
    assert err < CKPT_TOL[ck], f"materialize error {err:.3g}"


@pytest.mark.parametrize("l2norm,scale", [(False, 0.3), (True, 0.05)], ids=["no-l2norm", "scale"])
def test_l2norm_off_and_scale(l2norm, scale):
    """use_qk_l2norm=False (raw keys; inputs scaled down so the state stays bounded) and a given q scale
    reach every kernel: verify's keys and queries, the fold's keys (with and without the u recompute)."""
    for rc in (None, torch.bfloat16):
        layer = Layer(K64_V128, torch.bfloat16, seed=5)
        gpu, ref = gpu_cache(layer, 4, 8, torch.float32, rc), ref_cache(layer, 4, 8, rc)
        load_both(layer, gpu, ref, 4)
        slots = torch.tensor([2, 0, 3])
        gen = torch.Generator().manual_seed(1)
        for _ in range(12):
            q, k, v, a, b = layer.inputs(3, 3)
            if not l2norm:
                q, k = [(t.float() / math.sqrt(layer.K)).to(t.dtype) for t in (q, k)]
            acc = torch.randint(0, 4, (3,), generator=gen, dtype=torch.int32)
            s = slots.to(DEVICE)
            out = cuda_verify(layer, gpu, *(t.to(DEVICE) for t in (q, k, v, a, b)), s, scale=scale, l2norm=l2norm)
            ref_out = ref_verify(layer, ref, q, k, v, a, b, s, scale=scale, l2norm=l2norm)
            assert rel_err(out, ref_out) < OUT_TOL[rc]
            cuda_commit(gpu, acc.to(DEVICE), 3, s, l2norm=l2norm)
            ref_commit(ref, acc.to(DEVICE), 3, s, l2norm=l2norm)
        assert torch.equal(gpu.num_committed, ref.num_committed)
        assert rel_err(gpu.checkpoint, ref.checkpoint) < CKPT_TOL[torch.float32]
        mat = torch.arange(4, device=DEVICE)
        assert rel_err(cuda_materialize(gpu, mat, l2norm=l2norm), ref_materialize(ref, mat, l2norm=l2norm)) < 1e-5


def test_fp32_verify_rounds_like_the_reference():
    """Verify on an fp32 checkpoint computes at fp32 accuracy: its fp16 outputs equal the fp64 reference
    rounded to fp16 except where the exact value lies within a few fp32 errors of a rounding boundary
    (well under 1% of them), and a differing output is never off by one step of the largest output."""
    layer = Layer(QWEN4B, torch.float16, seed=17)
    num_slots, L, Tmax = 7, 16, 8
    gpu, ref = gpu_cache(layer, num_slots, L), ref_cache(layer, num_slots, L)
    load_both(layer, gpu, ref, num_slots)
    slots = torch.tensor([3, -1, 0, 6, 5], dtype=torch.int64)
    valid_rows = [0, 2, 3, 4]
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        accepted = torch.randint(0, 5, (slots.shape[0],), generator=gen, dtype=torch.int32)
        spec_round(layer, gpu, ref, slots, 4, accepted, Tmax, OUT_TOL[None], valid_rows)
    # From here both use the GPU's fp32 checkpoint and buffers, so that only verify is compared.
    ref.checkpoint.copy_(gpu.checkpoint.double())
    for g_t, r_t in zip(gpu.buffers(), ref.buffers()):
        r_t.copy_(g_t.double())
    q, k, v, a, b = layer.inputs(slots.shape[0], Tmax)
    s = slots.to(DEVICE)
    out = cuda_verify(layer, gpu, *(t.to(DEVICE) for t in (q, k, v, a, b)), s)
    ref_out = ref_verify(layer, ref, q, k, v, a, b, s)
    got, want = out[valid_rows].float(), ref_out[valid_rows].to(torch.float16).float()
    differ = (got != want).double().mean().item()
    worst = ((got - want).abs().max() / want.abs().max()).item()
    print(f"fp16 outputs that differ from the rounded reference: {differ:.4%}; largest difference {worst:.3g} "
          "of the largest output")
    assert differ < 0.01, f"{differ:.2%} of the outputs differ from the correctly rounded reference"
    assert worst <= 2.0 ** -10


@pytest.mark.parametrize("rc", [None, torch.bfloat16, FP8])
def test_flush_and_materialize_match_reference(rc):
    layer = Layer(TP, seed=5)
    num_slots, L, Tmax = 6, 8, 4
    gpu, ref = gpu_cache(layer, num_slots, L, rc=rc), ref_cache(layer, num_slots, L, rc)
    load_both(layer, gpu, ref, num_slots)
    slots = torch.tensor([4, 1, 0, 2], dtype=torch.int32)
    gen = torch.Generator().manual_seed(9)
    for _ in range(3):
        accepted = torch.randint(0, 3, (4,), generator=gen, dtype=torch.int32)
        spec_round(layer, gpu, ref, slots, 2, accepted, Tmax, OUT_TOL[rc], [0, 1, 2, 3])
    assert int(ref.num_committed.count_nonzero()) >= 2, "the flush must find committed entries"

    mat_slots = torch.tensor([2, -1, 4, 1, 3, 0], dtype=torch.int64, device=DEVICE)  # slot 3 never named
    state = cuda_materialize(gpu, mat_slots)
    ref_state = ref_materialize(ref, mat_slots)
    assert torch.count_nonzero(state[1]) == 0
    valid = [0, 2, 3, 4, 5]
    assert rel_err(state[valid], ref_state[valid]) < CKPT_TOL[torch.float32]
    assert torch.equal(state[4], gpu.checkpoint[3]), "an empty buffer materializes the checkpoint itself"

    flush_slots = torch.tensor([4, -1, 0], dtype=torch.int64, device=DEVICE)
    others = [1, 2, 3, 5]
    before = [bits(t[others]).clone() for t in gpu.tensors()]
    cuda_flush(gpu, flush_slots)
    ref_flush(ref, flush_slots)
    assert torch.equal(gpu.num_committed, ref.num_committed)
    assert rel_err(gpu.checkpoint[[4, 0]], ref.checkpoint[[4, 0]]) < CKPT_TOL[torch.float32]
    for t_before, t in zip(before, gpu.tensors()):
        assert torch.equal(t_before, bits(t[others])), "flush touched a slot it was not given"
    cuda_flush(gpu)
    ref_flush(ref)
    assert int(gpu.num_committed.count_nonzero()) == 0
    assert rel_err(gpu.checkpoint, ref.checkpoint) < CKPT_TOL[torch.float32]
    # After a flush the materialized state is the checkpoint, bitwise (fp32 checkpoint, empty buffer).
    assert torch.equal(cuda_materialize(gpu, torch.arange(num_slots, device=DEVICE)), gpu.checkpoint)
    if rc is not None:
        copy, scale = read_copy_of(gpu)
        assert torch.equal(bits(copy), bits(gpu.read_copy))
        if scale is not None:
            assert torch.equal(scale, gpu.read_scale)


def test_commit_over_several_row_chunks():
    """The fold's CTAs find the folding rows 256 at a time: a batch over two chunks, rows in random slot
    order with pads, folds in every round (L = 4, T = 2)."""
    layer = Layer(SMALL, seed=12)
    num_slots, batch, L, T = 600, 519, 4, 2
    gpu, ref = gpu_cache(layer, num_slots, L), ref_cache(layer, num_slots, L)
    load_both(layer, gpu, ref, num_slots)
    gen = torch.Generator().manual_seed(13)
    slots = torch.randperm(num_slots, generator=gen)[:batch]
    slots[::7] = -1
    valid = [r for r in range(batch) if slots[r] >= 0]
    for _ in range(4):
        accepted = torch.randint(0, T + 1, (batch,), generator=gen, dtype=torch.int32)
        spec_round(layer, gpu, ref, slots, T, accepted, T, OUT_TOL[None], valid)
    assert rel_err(gpu.checkpoint, ref.checkpoint) < CKPT_TOL[torch.float32]


@pytest.mark.parametrize("rc", [None, torch.bfloat16], ids=["no-copy", "bf16-copy"])
def test_large_batch_several_heads_per_cta(rc):
    """At a serving batch the verify launch gives each CTA several v-heads (its ring refilled between
    them, the next v-head's entries staged during this one's reduction) and the fold's persistent CTAs
    take several items each: qwen4b, batch 200 of 256 slots, a few rounds."""
    layer = Layer(QWEN4B, torch.bfloat16, seed=21)
    num_slots, batch, L, T = 256, 200, 16, 4
    gpu, ref = gpu_cache(layer, num_slots, L, rc=rc), ref_cache(layer, num_slots, L, rc)
    load_both(layer, gpu, ref, num_slots)
    gen = torch.Generator().manual_seed(22)
    slots = torch.randperm(num_slots, generator=gen)[:batch]
    slots[5::11] = -1
    valid = [r for r in range(batch) if slots[r] >= 0]
    for _ in range(6):
        accepted = torch.randint(0, T + 1, (batch,), generator=gen, dtype=torch.int32)
        spec_round(layer, gpu, ref, slots, T, accepted, T, OUT_TOL[rc], valid)
    named = slots[slots >= 0]
    assert rel_err(gpu.checkpoint[named], ref.checkpoint[named]) < CKPT_TOL[torch.float32]


def test_pad_slot_id_zero_and_slot_order():
    """Engines also pad with slot 0: rows naming it touch nothing; rows in any slot order."""
    layer = Layer(SMALL, torch.float16, seed=4)
    num_slots, L, Tmax = 6, 8, 3
    gpu, ref = gpu_cache(layer, num_slots, L, rc=torch.float16), ref_cache(layer, num_slots, L, torch.float16)
    load_both(layer, gpu, ref, num_slots)
    slots = torch.tensor([5, 0, 2, 0, 1], dtype=torch.int32)
    valid_rows = [0, 2, 4]
    before = [bits(t[[0, 3, 4]]).clone() for t in gpu.tensors()]
    gen = torch.Generator().manual_seed(8)
    for _ in range(15):
        T = int(torch.randint(1, Tmax + 1, (1,), generator=gen))
        accepted = torch.randint(0, T + 1, (5,), generator=gen, dtype=torch.int64)
        spec_round(layer, gpu, ref, slots, T, accepted, Tmax, OUT_TOL[torch.float16], valid_rows, pad_slot_id=0)
    for t_before, t in zip(before, gpu.tensors()):
        assert torch.equal(t_before, bits(t[[0, 3, 4]])), "a pad (slot 0) or unnamed slot changed"
    assert rel_err(gpu.checkpoint[[5, 2, 1]], ref.checkpoint[[5, 2, 1]]) < CKPT_TOL[torch.float32]


def test_out_of_range_cursors_touch_nothing():
    layer = Layer(SMALL, seed=6)
    num_slots, L, T = 6, 8, 3
    gpu, ref = gpu_cache(layer, num_slots, L), ref_cache(layer, num_slots, L)
    load_both(layer, gpu, ref, num_slots)
    # slot 1: past the buffer; slot 3: negative; slot 4: room for fewer than T entries; slot 0: fine
    for c in (gpu, ref):
        c.num_committed[torch.tensor([1, 3, 4])] = torch.tensor([L + 1, -3, L - 2], dtype=torch.int32, device=DEVICE)
    slots = torch.tensor([1, 3, 4, 0], device=DEVICE)
    before = [bits(t[[1, 3, 4]]).clone() for t in gpu.tensors()]
    before_out_of_range = [bits(t[[1, 3]]).clone() for t in gpu.tensors()]
    q, k, v, a, b = layer.inputs(4, T)
    out = cuda_verify(layer, gpu, *(t.to(DEVICE) for t in (q, k, v, a, b)), slots)
    ref_out = ref_verify(layer, ref, q, k, v, a, b, slots)
    assert torch.count_nonzero(out[:3]) == 0 and torch.count_nonzero(ref_out[:3]) == 0
    assert rel_err(out[3], ref_out[3]) < OUT_TOL[None]
    for t_before, t in zip(before, gpu.tensors()):
        assert torch.equal(t_before, bits(t[[1, 3, 4]])), "verify touched a slot with no room"
    # Commit: the out-of-range cursors (slots 1, 3) touch nothing; slot 4 (w = L - 2 <= L) is legal and
    # folds by the flush-early rule, as in the reference.
    accepted = torch.full((4,), T, dtype=torch.int32, device=DEVICE)
    cuda_commit(gpu, accepted, T, slots)
    ref_commit(ref, accepted, T, slots)
    assert torch.equal(gpu.num_committed, ref.num_committed)
    assert rel_err(gpu.checkpoint[[4, 0]], ref.checkpoint[[4, 0]]) < CKPT_TOL[torch.float32]
    cuda_flush(gpu, torch.tensor([1, 3], device=DEVICE))
    state = cuda_materialize(gpu, torch.tensor([1, 3], device=DEVICE))
    assert torch.count_nonzero(state) == 0, "materialize of an out-of-range cursor gives zeros"
    for t_before, t in zip(before_out_of_range, gpu.tensors()):
        assert torch.equal(t_before, bits(t[[1, 3]])), "commit/flush touched an out-of-range cursor's slot"


def test_batch_zero():
    layer = Layer(SMALL, seed=2)
    gpu = gpu_cache(layer, 3, 4, rc=FP8)
    gpu.load(layer.states(3))
    before = [bits(t).clone() for t in gpu.tensors()]
    empty = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    q, k, v, a, b = (t.to(DEVICE) for t in layer.inputs(0, 2))
    out = cuda_verify(layer, gpu, q, k, v, a, b, empty)
    assert out.shape[0] == 0
    cuda_commit(gpu, torch.zeros(0, dtype=torch.int32, device=DEVICE), 2, empty)
    cuda_flush(gpu, empty)
    assert cuda_materialize(gpu, empty).shape[0] == 0
    torch.cuda.synchronize()
    for t_before, t in zip(before, gpu.tensors()):
        assert torch.equal(t_before, bits(t))


def test_copy_slots_mid_window():
    """Forks in the middle of a window (copy_slots of every cache tensor, cursors > 0) go on exactly as
    their sources would: the copies verify, commit and fold like the reference's copies."""
    layer = Layer(TP, seed=14)
    num_slots, L, Tmax = 8, 8, 3
    gpu, ref = gpu_cache(layer, num_slots, L, rc=FP8), ref_cache(layer, num_slots, L, FP8)
    load_both(layer, gpu, ref, num_slots)
    slots = torch.tensor([0, 2, 5, 7])
    gen = torch.Generator().manual_seed(15)
    for _ in range(3):
        accepted = torch.randint(1, 3, (4,), generator=gen, dtype=torch.int32)
        spec_round(layer, gpu, ref, slots, 2, accepted, Tmax, OUT_TOL[FP8], [0, 1, 2, 3])
    assert int(gpu.num_committed[slots].min()) > 0, "the forks must copy a window with entries"
    src = torch.tensor([2, 5, 0], device=DEVICE)
    dst = torch.tensor([1, 6, 2], device=DEVICE)   # 2 is a source and a destination: a gather
    sources = [bits(t[src]).clone() for t in gpu.tensors()]
    ops().copy_slots(gpu.tensors(), src, dst, -1)
    reference.copy_slots(ref.tensors(), src, dst, -1)
    for s, t in zip(sources, gpu.tensors()):
        assert torch.equal(s, bits(t[dst])), "copy_slots gathers every cache tensor"
    slots = torch.tensor([1, 6, 2, 7, 5])
    for _ in range(12):
        T = int(torch.randint(1, Tmax + 1, (1,), generator=gen))
        accepted = torch.randint(0, T + 1, (5,), generator=gen, dtype=torch.int32)
        spec_round(layer, gpu, ref, slots, T, accepted, Tmax, OUT_TOL[FP8], [0, 1, 2, 3, 4])
    named = [1, 6, 2, 7, 5]
    assert rel_err(gpu.checkpoint[named], ref.checkpoint[named]) < CKPT_TOL[torch.float32]


@pytest.mark.parametrize("rc", [None, FP8], ids=["no-copy", "fp8-copy"])
def test_cuda_graph_verify_commit_is_bitwise_eager(rc):
    layer = Layer(QWEN4B, seed=3)
    T, batch, num_slots = 3, 4, 5
    caches = [gpu_cache(layer, num_slots, 8, rc=rc) for _ in range(2)]
    init = layer.states(num_slots)
    for c in caches:
        c.load(init)
    slots = torch.tensor([2, 0, -1, 4], dtype=torch.int32, device=DEVICE)
    static_in = [t.to(DEVICE) for t in layer.inputs(batch, T)]
    static_acc = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    static_out = torch.empty(batch, T, layer.HV, layer.V, dtype=layer.act, device=DEVICE)

    def spec(c, inputs, accepted, out):
        cuda_verify(layer, c, *inputs, slots, out)
        cuda_commit(c, accepted, 4, slots)
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
        new = [t.to(DEVICE) for t in layer.inputs(batch, T)]
        acc = torch.randint(0, T + 1, (batch,), generator=gen, dtype=torch.int32).to(DEVICE)
        for s, n in zip(static_in, new):
            s.copy_(n)
        static_acc.copy_(acc)
        graph.replay()
        eager = spec(caches[1], new, acc, torch.empty_like(static_out))
        assert torch.equal(bits(static_out), bits(eager))
        for a, b in zip(caches[0].tensors(), caches[1].tensors()):
            assert torch.equal(bits(a), bits(b))
        folded = folded or bool((caches[0].num_committed < cursors).any())
    assert folded, "the replayed rounds must cross a fold"


def test_strided_pool_and_int32_slots_bitwise():
    """A checkpoint that is a view into a larger pool (non-contiguous slot stride) and int32 slots /
    accepted counts give the bits of a plain checkpoint with int64 ones; the pool's other parts stay 0."""
    layer = Layer(TP, seed=8)
    pool = torch.zeros(5, 3, layer.HV, layer.V, layer.K, device=DEVICE)
    gpu = gpu_cache(layer, 5, 6, checkpoint=pool[:, 1])
    plain = gpu_cache(layer, 5, 6)
    init = layer.states(5)
    gpu.load(init)
    plain.load(init)
    slots = torch.tensor([4, 1], dtype=torch.int32, device=DEVICE)
    gen = torch.Generator().manual_seed(2)
    for _ in range(6):
        inputs = [t.to(DEVICE) for t in layer.inputs(2, 3)]
        assert torch.equal(cuda_verify(layer, gpu, *inputs, slots), cuda_verify(layer, plain, *inputs, slots.long()))
        acc = torch.randint(0, 4, (2,), generator=gen, dtype=torch.int32).to(DEVICE)
        cuda_commit(gpu, acc, 3, slots)
        cuda_commit(plain, acc.long(), 3, slots.long())
    assert torch.equal(pool[:, 1], plain.checkpoint)
    assert torch.equal(gpu.num_committed, plain.num_committed)
    assert torch.count_nonzero(pool[:, 0]) == 0 and torch.count_nonzero(pool[:, 2]) == 0


@pytest.mark.parametrize("rc", [None, torch.bfloat16], ids=["fp32", "fp32+bf16-copy"])
def test_long_run_error_stays_flat(rc):
    """4096 decode steps as verify(T=1) + commit(1) (L = 16: a fold every 16 tokens, 256 folds) against
    the conventional recurrence in fp64 (the reference with no read copy): the materialized state's
    relative error stays at fp32 rounding and does not grow with the folds, also with a bf16 read copy
    (the folds recompute u from the fp32 checkpoint, so the copy's rounding never reaches it); the
    outputs' error stays at the copy's precision."""
    layer = Layer((2, 4, 128, 128), torch.bfloat16, seed=40)
    num_slots, L, steps = 3, 16, 4096
    gpu, ref = gpu_cache(layer, num_slots, L, rc=rc), ref_cache(layer, num_slots, L, None)
    load_both(layer, gpu, ref, num_slots)
    slots = torch.tensor([2, 0, 1], device=DEVICE)
    ones = torch.ones(3, dtype=torch.int32, device=DEVICE)
    state_errs, out_errs = [], []
    for step in range(steps):
        q, k, v, a, b = layer.inputs(3, 1)
        out = cuda_verify(layer, gpu, *(t.to(DEVICE) for t in (q, k, v, a, b)), slots)
        ref_out = ref_verify(layer, ref, q, k, v, a, b, slots)
        cuda_commit(gpu, ones, 1, slots)
        ref_commit(ref, ones, 1, slots)
        out_errs.append(rel_err(out, ref_out))
        if step % 64 == 63:
            state_errs.append(rel_err(cuda_materialize(gpu, slots), ref_materialize(ref, slots)))
    assert torch.equal(gpu.num_committed, ref.num_committed)
    quarter = len(state_errs) // 4
    first, last = max(state_errs[:quarter]), max(state_errs[-quarter:])
    print(f"state error: first quarter {first:.3g}, last quarter {last:.3g}; output error max {max(out_errs):.3g}")
    assert last < 1e-5, f"state error {last:.3g} above fp32 rounding"
    assert last < 3 * first + 1e-6, f"state error grows: {first:.3g} -> {last:.3g}"
    assert max(out_errs) < OUT_TOL[rc]
    first_out = max(out_errs[: steps // 4])
    assert max(out_errs[-steps // 4:]) < 2 * first_out + 1e-3, "output error grows with the folds"


def test_verify_heads_per_cta_override_changes_no_bit():
    """verify_heads_per_cta (the launch overrides, shared with mamba2_verify) sets the v-heads a verify CTA
    takes (the largest divisor of HV <= the value): every choice gives the rule's bits."""
    from replayssm_cuda import launch_overrides
    layer = Layer(QWEN4B, torch.bfloat16, seed=23)
    slots = torch.tensor([2, 0, -1, 3], device=DEVICE)
    q, k, v, a, b = (t.to(DEVICE) for t in layer.inputs(4, 4))
    init = layer.states(4)
    results = []
    for forced in (0, 1, 3, 8, 64):                # 3 takes 2 v-heads, 64 all 32
        c = gpu_cache(layer, 4, 16, rc=torch.bfloat16)
        c.load(init)
        c.num_committed.copy_(torch.tensor([1, 5, 0, 7], dtype=torch.int32))   # windows of zero (neutral) entries
        with launch_overrides(verify_heads_per_cta=forced):
            out = cuda_verify(layer, c, q, k, v, a, b, slots)
        results.append([bits(out)] + [bits(t) for t in c.buffers()])
    for forced, got in zip((1, 3, 8, 64), results[1:]):
        assert all(torch.equal(x, y) for x, y in zip(got, results[0])), f"verify_heads_per_cta={forced}"


def test_bad_inputs_name_the_argument():
    layer = Layer(SMALL, seed=10)
    c = gpu_cache(layer, 3, 4)
    A_log, dt_bias = layer.weights()
    q, k, v, a, b = (t.to(DEVICE) for t in layer.inputs(2, 5))
    out = torch.empty(2, 5, layer.HV, layer.V, dtype=layer.act, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"gdn_verify: the number of draft tokens T \(q.size\(1\)\) must be in \[1, min\(L = 4, 16\)\], got 5"):
        ops().gdn_verify(*c.spec_args(), q, k, v, a, b, A_log, dt_bias, out, None, True, None, -1)
    q, k, v, a, b = (t.to(DEVICE) for t in layer.inputs(2, 2))
    out = torch.empty(2, 2, layer.HV, layer.V, dtype=layer.act, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"gdn_verify: k must have shape \(2, 2, 2, 64\), got \(2, 2, 2, 32\)"):
        ops().gdn_verify(*c.spec_args(), q, k[..., :32], v, a, b, A_log, dt_bias, out, None, True, None, -1)
    # The inputs take the cache's activation dtype (k_buf's); the message names the one that differs.
    with pytest.raises(RuntimeError, match=r"gdn_verify: q must have the cache's activation dtype \(k_buf's, bfloat16\), got float16"):
        ops().gdn_verify(*c.spec_args(), q.half(), k, v, a, b, A_log, dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_verify: v must have the cache's activation dtype \(k_buf's, bfloat16\), got float16"):
        ops().gdn_verify(*c.spec_args(), q, k, v.half(), a, b, A_log, dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_verify: A_log must have dtype in \{float32\}, got float64"):
        ops().gdn_verify(*c.spec_args(), q, k, v, a, b, A_log.double(), dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_commit: num_accepted must have dtype in \{int32, int64\}, got float32"):
        ops().gdn_commit(*c.spec_args(), torch.zeros(2, device=DEVICE), 2, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_commit: max_draft_tokens must be in \[1, L = 4\], got 5"):
        ops().gdn_commit(*c.spec_args(), torch.zeros(2, dtype=torch.int32, device=DEVICE), 5, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_flush: slots must have shape \(\*,\), got \(2, 1\)"):
        ops().gdn_flush(*c.args(), True, torch.zeros(2, 1, dtype=torch.int32, device=DEVICE), -1)
    out16 = torch.empty(2, *c.checkpoint.shape[1:], dtype=torch.float16, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"gdn_materialize: out must have dtype in \{float32\}, got float16"):
        ops().gdn_materialize(c.checkpoint, *c.buffers(), c.num_committed, out16, True, None, -1)
    wide = torch.zeros(3, layer.HV, layer.V, 96, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"gdn_flush: checkpoint \(head_k_dim K = size\(3\), head_v_dim V = size\(2\)\) must have \(K, V\) in \{\(64, 64\), \(64, 128\), \(128, 64\), \(128, 128\)\}, got \(96, 64\)"):
        ops().gdn_flush(wide, None, None, *c.buffers(), c.num_committed, True, None, -1)
    odd = Layer((4, 6, 64, 64), seed=1)
    oc = gpu_cache(odd, 3, 4)
    with pytest.raises(RuntimeError, match=r"gdn_flush: the number of v-heads \(checkpoint.size\(1\) = 6\) must be a multiple of the number of q/k heads \(k_buf.size\(1\)\), got 4"):
        ops().gdn_flush(*oc.args(), True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_verify: v must start on a 16-byte boundary"):
        v_odd = torch.empty(2 * 2 * layer.HV * layer.V + 1, dtype=layer.act, device=DEVICE)[1:].view(2, 2, layer.HV, layer.V)
        ops().gdn_verify(*c.spec_args(), q, k, v_odd, a, b, A_log, dt_bias, out, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"gdn_commit: read_scale is required with a float8_e4m3fn read_copy"):
        fp8 = gpu_cache(layer, 3, 4, rc=FP8)
        ops().gdn_commit(fp8.checkpoint, fp8.read_copy, None, *fp8.buffers(), fp8.num_committed, fp8.num_verified,
                         torch.zeros(2, dtype=torch.int32, device=DEVICE), 2, True, None, -1)
