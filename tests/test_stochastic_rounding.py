"""Stochastic rounding of 16-bit checkpoints, on the reference (the spec the kernels are tested against):
the Philox4x32-10 generator against the Random123 known answers, the rounding rule (unbiased, exact
values kept, NaN/inf/saturation), the counter layout (bits of an element depend on seed, offset and its
coordinates only), the offset each op advances, the argument checks, and why the feature exists: a
bf16 checkpoint whose per-fold increments are below half an ulp is stuck under round-to-nearest and
tracks the fp64 state under stochastic rounding."""

import pytest
import torch

from replayssm_cuda import Mamba2Cache, Mamba2Weights, ops
from replayssm_cuda import reference as R

HALF16 = (torch.bfloat16, torch.float16)


def _hex(words):
    return [f"{int(w):08x}" for w in words]


# ---- Philox4x32-10 ---------------------------------------------------------------------------------

# Random123's kat_vectors (philox4x32 10): counter, key -> output.
KAT = [
    ((0, 0, 0, 0), (0, 0), "6627e8d5 e169c58d bc57ac4c 9b00dbd8"),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, "408f276d 41c83b0e a20bc7c6 6d5451fd"),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0), "d16cfe09 94fdcceb 5001e420 24126ea1"),
]


@pytest.mark.parametrize("counter,key,want", KAT)
def test_philox_known_answers(counter, key, want):
    assert _hex(R.philox4x32_10(counter, key)) == want.split()


def test_philox_broadcasts_over_tensors():
    c0 = torch.tensor([0, 0x243F6A88], dtype=torch.int64)
    c1 = torch.tensor([0, 0x85A308D3], dtype=torch.int64)
    c2 = torch.tensor([0, 0x13198A2E], dtype=torch.int64)
    c3 = torch.tensor([0, 0x03707344], dtype=torch.int64)
    k0 = torch.tensor([0, 0xA4093822], dtype=torch.int64)
    k1 = torch.tensor([0, 0x299F31D0], dtype=torch.int64)
    words = R.philox4x32_10((c0, c1, c2, c3), (k0, k1))
    assert _hex(w[0] for w in words) == KAT[0][2].split()
    assert _hex(w[1] for w in words) == KAT[2][2].split()


# ---- the rounding rule -----------------------------------------------------------------------------

def _grid_neighbours(v, dtype):
    """The two 16-bit values around fp32 v (towards zero first), as fp64."""
    bits = torch.zeros_like(v, dtype=torch.int64)
    lo = R.stochastic_round(v, dtype, bits).double()                  # r = 0 never rounds away
    hi = R.stochastic_round(v, dtype, bits + 0xFFFF).double()         # r = 2^16 - 1: away unless exact
    return lo, hi


@pytest.mark.parametrize("dtype", HALF16)
def test_unbiased(dtype):
    g = torch.Generator().manual_seed(1)
    # Values strictly between grid points, in the normal range of both types and across binades.
    v = (torch.rand(64, generator=g) * 3 + 0.5) * torch.exp2(torch.randint(-10, 10, (64,), generator=g).float())
    v = v * torch.where(torch.rand(64, generator=g) < 0.5, -1.0, 1.0)
    draws = 4096
    bits = torch.randint(0, 2**16, (draws, 64), generator=g, dtype=torch.int64)
    rounded = R.stochastic_round(v.expand(draws, 64), dtype, bits).double()
    lo, hi = _grid_neighbours(v, dtype)
    assert torch.all((rounded == lo) | (rounded == hi)), "SR picks one of the two neighbours"
    frac = ((v.double() - lo) / (hi - lo)).abs()
    sigma = (hi - lo).abs() * torch.sqrt(frac * (1 - frac) / draws)
    err = (rounded.mean(0) - v.double()).abs()
    assert torch.all(err <= 5 * sigma + 1e-12), f"mean off by {(err / sigma).max():.1f} sigma"


@pytest.mark.parametrize("dtype", HALF16)
def test_probability_is_the_fraction_for_every_16_bit_pattern(dtype):
    # With all 2^16 patterns the count of round-aways is exactly frac * 2^16 (fraction below 16 bits).
    v = torch.tensor([1.0 + 3 * 2**-10 + 2**-12, -(2.0 + 5 * 2**-8 + 2**-11), 300.3], dtype=torch.float32)
    bits = torch.arange(2**16, dtype=torch.int64)[:, None].expand(2**16, 3)
    rounded = R.stochastic_round(v.expand(2**16, 3), dtype, bits).double()
    lo, hi = _grid_neighbours(v, dtype)
    frac = (v.double() - lo) / (hi - lo)
    assert torch.equal((rounded == hi).sum(0).double(), frac * 2**16)


@pytest.mark.parametrize("dtype", HALF16)
def test_exact_values_and_specials(dtype):
    g = torch.Generator().manual_seed(2)
    exact = torch.randn(1000, generator=g).to(dtype).float()
    for r in (0, 1, 0x8000, 0xFFFF):
        bits = torch.full(exact.shape, r, dtype=torch.int64)
        assert torch.equal(R.stochastic_round(exact, dtype, bits).float(), exact)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan")])
    bits = torch.full(specials.shape, 0xFFFF, dtype=torch.int64)
    out = R.stochastic_round(specials, dtype, bits).float()
    assert torch.equal(out[:2].view(torch.int32), specials[:2].view(torch.int32)), "signed zeros stay"
    assert torch.isnan(out[4])
    if dtype == torch.bfloat16:
        assert torch.equal(out[2:4], specials[2:4])
    else:  # fp16 saturates like every fp16 store of this package
        assert out[2].item() == 65504.0 and out[3].item() == -65504.0
        assert R.stochastic_round(torch.tensor([70000.0]), dtype, torch.tensor([0xFFFF])).item() == 65504.0


def test_fp16_below_the_normal_range():
    # fp16 subnormals (spacing 2^-24) and values below 2^-24: still the nearest two, mean close to v.
    g = torch.Generator().manual_seed(3)
    v = torch.tensor([3.3e-7, 2.5e-8, 1e-8, 4.1e-6, 6.0e-5], dtype=torch.float32)
    draws = 20000
    bits = torch.randint(0, 2**16, (draws, v.numel()), generator=g, dtype=torch.int64)
    rounded = R.stochastic_round(v.expand(draws, -1), torch.float16, bits).double()
    lo = R.stochastic_round(v, torch.float16, torch.zeros(v.shape, dtype=torch.int64)).double()
    spacing = torch.exp2(torch.floor(torch.log2(v.double())) - 10).clamp(min=2**-24)
    hi = lo + spacing
    assert torch.all((rounded == lo) | (rounded == hi))
    sigma = (hi - lo) / (2 * draws**0.5)
    # The probability is the fraction truncated to 16 bits: a bias below 2^-16 of the spacing.
    assert torch.all((rounded.mean(0) - v.double()).abs() <= 5 * sigma + (hi - lo) * 2**-16)


# ---- counter layout and offsets --------------------------------------------------------------------

def test_bits_depend_on_seed_offset_and_coordinates_only():
    H, P, N = 3, 5, 20   # N not a multiple of 8: the last draw of a row is cut
    a = R.rounding_bits(7, 11, torch.tensor([4, 0, 9]), H, P, N)
    b = R.rounding_bits(7, 11, torch.tensor([9, 4]), H, P, N)
    assert a.shape == (3, H, P, N) and int(a.max()) < 2**16 and int(a.min()) >= 0
    assert torch.equal(a[0], b[1]) and torch.equal(a[2], b[0]), "a slot's bits do not depend on its row"
    assert torch.equal(a, R.rounding_bits(7, 11, torch.tensor([4, 0, 9]), H, P, N)), "deterministic"
    for other in (R.rounding_bits(8, 11, torch.tensor([4, 0, 9]), H, P, N),
                  R.rounding_bits(7, 12, torch.tensor([4, 0, 9]), H, P, N),
                  R.rounding_bits(7 + 2**32, 11, torch.tensor([4, 0, 9]), H, P, N)):
        assert (other != a).float().mean() > 0.99, "another seed or offset gives other bits"
    assert (a[0] != a[2]).float().mean() > 0.99 and (a[:, 0] != a[:, 1]).float().mean() > 0.99


def test_bits_layout_is_one_draw_per_8_elements():
    seed, offset, slot, head, p, n = 0x1234_5678_9ABC_DEF0, 42, 6, 2, 3, 13
    words = R.philox4x32_10(((p << 16) | (n // 8), head, slot, offset),
                            (seed & 0xFFFFFFFF, seed >> 32))
    want = (int(words[(n % 8) // 2]) >> (16 * (n % 2))) & 0xFFFF
    assert int(R.rounding_bits(seed, offset, torch.tensor([slot]), 4, 8, 16)[0, head, p, n]) == want


class Layer:
    def __init__(self, H=4, P=8, N=16, G=2, seed=0):
        self.H, self.P, self.N, self.G = H, P, N, G
        self.gen = torch.Generator().manual_seed(seed)
        self.weights = Mamba2Weights(A=-(0.5 + torch.rand(H, generator=self.gen)), D=torch.randn(H, generator=self.gen),
                                     dt_bias=0.1 * torch.randn(H, generator=self.gen))

    def inputs(self, batch, act=torch.bfloat16):
        g = self.gen
        return [t.to(act) for t in (torch.randn(batch, self.H, self.P, generator=g),
                                    0.5 * torch.randn(batch, self.H, generator=g),
                                    torch.randn(batch, self.G, self.N, generator=g),
                                    torch.randn(batch, self.G, self.N, generator=g),
                                    torch.randn(batch, self.H, self.P, generator=g))]


@pytest.mark.parametrize("dtype", HALF16)
def test_update_rounds_by_slot_not_by_row(dtype):
    layer = Layer(seed=4)
    init = (0.3 * torch.randn(6, layer.H, layer.P, layer.N, generator=layer.gen)).to(dtype)
    x, dt, B, C, z = layer.inputs(3)
    w = layer.weights
    results = []
    for perm in ([0, 1, 2], [2, 0, 1]):
        state = init.clone()
        seed = torch.tensor([99, 5], dtype=torch.int64)
        out = torch.empty_like(x)
        slots = torch.tensor([4, 1, 3])[perm]
        ops.mamba2_update(state, x[perm], dt[perm], w.A, B[perm], C[perm], out, w.D, z[perm], w.dt_bias, True,
                          slots, -1, seed, backend="reference")
        assert seed.tolist() == [99, 6], "one call moves the offset by one"
        results.append(state)
    assert torch.equal(results[0], results[1])
    rne = init.clone()
    ops.mamba2_update(rne, x, dt, w.A, B, C, torch.empty_like(x), w.D, z, w.dt_bias, True, torch.tensor([4, 1, 3]),
                      -1, backend="reference")
    differ = (results[0][[4, 1, 3]] != rne[[4, 1, 3]]).float().mean()
    assert 0.05 < differ < 0.7, "SR leaves some values where round-to-nearest puts them, not all"
    assert torch.equal(results[0][[0, 2, 5]], init[[0, 2, 5]]), "slots no row names are untouched"


def _cache(layer, dtype, sr, seed=0, **kw):
    return Mamba2Cache(6, layer.H, layer.P, layer.N, layer.G, layer.weights, buffer_len=kw.pop("buffer_len", 4),
                       checkpoint_dtype=dtype, backend="reference", stochastic_rounding=sr, seed=seed, **kw)


@pytest.mark.parametrize("dtype", HALF16)
def test_cache_ops_advance_the_offset_and_repeat_per_seed(dtype):
    layer = Layer(seed=5)
    init = 0.3 * torch.randn(6, layer.H, layer.P, layer.N, generator=layer.gen)
    steps = [layer.inputs(2) for _ in range(9)]
    slots = torch.tensor([5, 2])
    finals = {}
    for name, seed in (("a", 3), ("a again", 3), ("b", 4)):
        cache = _cache(layer, dtype, True, seed=seed, max_draft_tokens=2)
        cache.load(init.to(dtype))
        for i, (x, dt, B, C, z) in enumerate(steps):
            cache.step(x, dt, B, C, z, slots=slots)
            assert cache.rounding_seed.tolist() == [seed, i + 1]
        cache.verify(*[t[:, None] for t in steps[0][:4]], steps[0][4][:, None], slots=slots)
        cache.commit(torch.tensor([1, 0]), slots=slots)
        cache.flush()
        assert cache.rounding_seed.tolist() == [seed, len(steps) + 2]
        finals[name] = cache.checkpoint.clone()
    assert torch.equal(finals["a"], finals["a again"])
    assert not torch.equal(finals["a"], finals["b"])


def test_cache_without_sr_is_unchanged_and_l1_uses_the_update():
    layer = Layer(seed=6)
    init = 0.3 * torch.randn(6, layer.H, layer.P, layer.N, generator=layer.gen)
    plain, sr = _cache(layer, torch.bfloat16, False), _cache(layer, torch.bfloat16, True, buffer_len=1)
    assert plain.rounding_seed is None
    sr.load(init.bfloat16())
    x, dt, B, C, z = layer.inputs(2)
    sr.step(x, dt, B, C, z, slots=torch.tensor([0, 3]))
    assert sr.rounding_seed.tolist() == [0, 1]


def test_argument_checks_name_the_argument():
    layer = Layer(seed=7)
    with pytest.raises(ValueError, match=r"Mamba2Cache: stochastic_rounding=True needs checkpoint_dtype bfloat16 or float16, got float32"):
        _cache(layer, torch.float32, True)
    with pytest.raises(ValueError, match=r"Mamba2Cache: `seed` must be an int"):
        _cache(layer, torch.bfloat16, True, seed=2**63)
    cache = _cache(layer, torch.bfloat16, True)
    x, dt, B, C, z = layer.inputs(2)
    w = layer.weights
    fp32 = torch.zeros(6, layer.H, layer.P, layer.N)
    seed = torch.tensor([1, 0], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"mamba2_update: `rounding_seed` \(stochastic rounding\) is only for a bfloat16 or float16 state, got a float32 state"):
        ops.mamba2_update(fp32, x, dt, w.A, B, C, torch.empty_like(x), rounding_seed=seed, backend="reference")
    with pytest.raises(ValueError, match=r"mamba2_flush: `rounding_seed` .* got a float64 checkpoint"):
        ops.mamba2_flush(fp32.double(), None, None, cache.x_buf, cache.B_buf, cache.dt_buf.double(),
                         cache.num_committed, w.A, rounding_seed=seed, backend="reference")
    args = (*cache._cache_args(), x, dt, w.A, B, C, torch.empty_like(x))
    with pytest.raises(TypeError, match=r"mamba2_step: `rounding_seed` must have dtype in \{int64\}, got int32"):
        ops.mamba2_step(*args, rounding_seed=seed.int(), backend="reference")
    with pytest.raises(ValueError, match=r"mamba2_step: `rounding_seed` must have shape \(2\), got \(3,\)"):
        ops.mamba2_step(*args, rounding_seed=torch.zeros(3, dtype=torch.int64), backend="reference")
    with pytest.raises(ValueError, match=r"mamba2_commit: `rounding_seed` must have shape"):
        ops.mamba2_commit(*cache._spec_cache_args(), torch.tensor([1, 1]), w.A, 1, rounding_seed=seed[:1],
                          backend="reference")


# ---- why: increments below half an ulp -------------------------------------------------------------

def test_sr_tracks_the_fp64_state_where_round_to_nearest_is_stuck():
    """State ~1.0 in bf16 (ulp 2^-7), each fold adding ~2e-3 < half an ulp: round-to-nearest drops every
    increment and stays at 1.0; stochastic rounding keeps them on average and follows fp64."""
    H, P, N, G, L, folds = 2, 16, 16, 1, 4, 256
    g = torch.Generator().manual_seed(8)
    weights = Mamba2Weights(A=torch.full((H,), -1e-4), dt_softplus=False)
    ref_weights = Mamba2Weights(A=weights.A.double(), dt_softplus=False)
    kw = dict(buffer_len=L, backend="reference")
    exact = Mamba2Cache(2, H, P, N, G, ref_weights, checkpoint_dtype=torch.float64, activation_dtype=torch.float64, **kw)
    rne = Mamba2Cache(2, H, P, N, G, weights, checkpoint_dtype=torch.bfloat16, **kw)
    sr = Mamba2Cache(2, H, P, N, G, weights, checkpoint_dtype=torch.bfloat16, stochastic_rounding=True, seed=1, **kw)
    for c in (exact, rne, sr):
        c.load(torch.ones(2, H, P, N, dtype=torch.float64))
    for _ in range(folds * L):
        x = (0.005 + 0.01 * torch.rand(2, H, P, generator=g)).bfloat16()     # dt x B ~ 5e-4 per token
        dt = torch.full((2, H), 0.1).bfloat16()
        B = (0.4 + 0.2 * torch.rand(2, G, N, generator=g)).bfloat16()
        C = torch.randn(2, G, N, generator=g).bfloat16()
        exact.step(x.double(), dt.double(), B.double(), C.double())
        rne.step(x, dt, B, C)
        sr.step(x, dt, B, C)
    assert sr.rounding_seed.tolist() == [1, folds * L]
    want = exact.checkpoint
    assert want.min() > 1.4, "the exact state grew by ~0.5"
    rne_err = rne.checkpoint.double() - want
    sr_err = sr.checkpoint.double() - want
    assert torch.equal(rne.checkpoint.double(), torch.ones_like(want)), "round-to-nearest is stuck at 1.0"
    assert rne_err.mean() < -0.4
    assert sr_err.mean().abs() < 0.01, f"SR mean error {sr_err.mean():.4f}"
    assert sr_err.pow(2).mean().sqrt() < 0.1, f"SR rms error {sr_err.pow(2).mean().sqrt():.4f}"
