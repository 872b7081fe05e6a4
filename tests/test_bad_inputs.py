"""Bad input raises an exception whose message names the argument, what was expected and what was given."""

import pytest
import torch

from families import family
from replayssm_cuda import DeltaRuleWeights, GDNCache, Mamba2Cache, Mamba2Weights, ops


@pytest.fixture
def m2():
    fam = family("mamba2", dtype=torch.float32)
    return fam, fam.make_cache(4, buffer_len=4, max_draft_tokens=2)


def test_wrong_x_shape(m2):
    fam, cache = m2
    x, dt, B, C, z = fam.inputs(2)
    with pytest.raises(ValueError, match=r"mamba2_step: `x` must have shape \(2, 6, 5\), got \(2, 6, 4\)"):
        cache.step(x[..., :4], dt, B, C, z)


def test_wrong_dtype(m2):
    fam, cache = m2
    x, dt, B, C, z = fam.inputs(2)
    with pytest.raises(TypeError, match=r"mamba2_step: `C` must have dtype in \{float32\}, got float16"):
        cache.step(x, dt, B, C.half(), z)


def test_groups_must_divide_heads(m2):
    fam, cache = m2
    x, dt, B, C, z = fam.inputs(2)
    with pytest.raises(ValueError, match=r"number of groups \(B.shape\[-2\] = 4\) must divide the number of heads \(6\)"):
        cache.step(x, dt, torch.cat([B, B], 1), torch.cat([C, C], 1), z)


def test_slots_dtype_and_shape(m2):
    fam, cache = m2
    inputs = fam.inputs(2)
    with pytest.raises(TypeError, match=r"`slots` must have dtype in \{int32, int64\}, got float32"):
        cache.step(*inputs, slots=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"`slots` must have shape \(2\), got \(3,\)"):
        cache.step(*inputs, slots=torch.tensor([0, 1, 2]))


def test_batch_larger_than_pool_without_slots(m2):
    fam, cache = m2
    with pytest.raises(ValueError, match=r"batch \(5\) must be <= num_slots \(4\); pass `slots`"):
        cache.step(*fam.inputs(5))


def test_too_many_draft_tokens(m2):
    fam, cache = m2
    with pytest.raises(ValueError, match=r"verify: T=3 draft tokens exceed max_draft_tokens=2"):
        cache.verify(*fam.inputs(2, 3))


def test_step_staggered_flush_hint_must_be_a_bool(m2):
    fam, cache = m2
    x, dt, B, C, z = fam.inputs(2)
    w = cache.weights
    with pytest.raises(ValueError, match=r"mamba2_step: `staggered_flush` must be a bool, got 1"):
        ops.mamba2_step(cache.checkpoint, cache.read_copy, cache.read_scale, cache.x_buf, cache.B_buf, cache.dt_buf,
                        cache.num_committed, x, dt, w.A, B, C, torch.empty_like(x), w.D, z, w.dt_bias, w.dt_softplus,
                        cache.max_draft_tokens, staggered_flush=1)


def test_non_contiguous_last_dim(m2):
    fam, cache = m2
    x, dt, B, C, z = fam.inputs(2)
    xt = torch.randn(2, 6, 5).transpose(0, 2).contiguous().transpose(0, 2)
    with pytest.raises(ValueError, match=r"`x` must have a contiguous last dimension"):
        cache.step(xt, dt, B, C, z)


def test_num_accepted_dtype(m2):
    fam, cache = m2
    cache.verify(*fam.inputs(2, 2))
    with pytest.raises(TypeError, match=r"mamba2_commit: `num_accepted` must have dtype in \{int32, int64\}, got float32"):
        cache.commit(torch.ones(2))


@pytest.mark.parametrize("kwargs,message", [
    (dict(buffer_len=0), r"`buffer_len` must be an int in \[1, 64\], got 0"),
    (dict(buffer_len=65), r"`buffer_len` must be an int in \[1, 64\], got 65"),
    (dict(buffer_len=4, max_draft_tokens=5), r"`max_draft_tokens` must be an int in \[1, min\(16, buffer_len=4\)\], got 5"),
    (dict(read_copy_dtype=torch.int8), r"`read_copy_dtype` must be None, bfloat16, float16 or float8_e4m3fn, got int8"),
    (dict(buffer_len=1, read_copy_dtype=torch.bfloat16), r"a read copy needs buffer_len >= 2"),
    (dict(checkpoint_dtype=torch.int32), r"`checkpoint_dtype` must be one of float32, bfloat16, float16"),
    (dict(backend="fast"), r"`backend` must be one of \('auto', 'cuda', 'reference'\), got 'fast'"),
])
def test_bad_mamba2_configuration(kwargs, message):
    w = Mamba2Weights(A=-torch.ones(4))
    with pytest.raises(ValueError, match=message):
        Mamba2Cache(2, 4, 8, 8, 2, w, **kwargs)


def test_bad_weights():
    with pytest.raises(ValueError, match=r"Mamba2Cache: `weights.A` must have shape \(4\), got \(3,\)"):
        Mamba2Cache(2, 4, 8, 8, 2, Mamba2Weights(A=-torch.ones(3)))
    with pytest.raises(ValueError, match=r"`num_groups` must divide num_heads=4, got 3"):
        Mamba2Cache(2, 4, 8, 8, 3, Mamba2Weights(A=-torch.ones(4)))
    with pytest.raises(ValueError, match=r"GDNCache: `buffer_len` must be an int in \[1, 16\], got 32"):
        GDNCache(2, 2, 4, 8, 8, DeltaRuleWeights(A_log=torch.zeros(4), dt_bias=torch.zeros(4)), buffer_len=32)
    with pytest.raises(ValueError, match=r"GDNCache: `weights.dt_bias` must have shape \(4\), got \(4, 8\)"):
        GDNCache(2, 2, 4, 8, 8, DeltaRuleWeights(A_log=torch.zeros(4), dt_bias=torch.zeros(4, 8)))
    with pytest.raises(ValueError, match=r"`num_v_heads` \(4\) must be a multiple of `num_heads`, got num_heads=3"):
        GDNCache(2, 3, 4, 8, 8, DeltaRuleWeights(A_log=torch.zeros(4), dt_bias=torch.zeros(4)))


def test_cuda_backend_without_cuda_is_an_error():
    with pytest.raises(ValueError, match=r"backend='cuda' needs device='cuda', got device='cpu'"):
        Mamba2Cache(2, 4, 8, 8, 2, Mamba2Weights(A=-torch.ones(4)), backend="cuda")
    ck = torch.zeros(2, 1, 2, 8)
    with pytest.raises(ValueError, match=r"make_read_copy: backend='cuda' needs CUDA tensors, got tensors on cpu"):
        ops.make_read_copy(ck, torch.zeros_like(ck, dtype=torch.bfloat16), backend="cuda")


def test_read_copy_arguments():
    ck = torch.zeros(2, 1, 2, 8)
    with pytest.raises(ValueError, match=r"make_read_copy: `read_copy` must have shape \(2, 1, 2, 8\), got \(2, 1, 2, 4\)"):
        ops.make_read_copy(ck, torch.zeros(2, 1, 2, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"make_read_copy: `read_scale` is required, got None"):
        ops.make_read_copy(ck, torch.zeros(2, 1, 2, 8, dtype=torch.float8_e4m3fn))
    with pytest.raises(ValueError, match=r"`read_scale` is only for an fp8 read copy, got a bfloat16 read copy"):
        ops.make_read_copy(ck, torch.zeros(2, 1, 2, 8, dtype=torch.bfloat16), torch.ones(2, 1, 2))


def test_delta_gate_shape():
    fam = family("kda", dtype=torch.float32)
    cache = fam.make_cache(2, buffer_len=4)
    q, k, v, a, b = fam.inputs(2)
    with pytest.raises(ValueError, match=r"kda_step: `a` must have shape \(2, 4, 8\), got \(2, 4\)"):
        cache.step(q, k, v, a[..., 0], b)


def test_mamba2_kernel_limits_are_named():
    """What the compiled Mamba-2 kernels were not built for is said in words (auto then runs the
    reference with that reason in its warning; backend='cuda' raises it)."""
    ck = torch.zeros(2, 4, 80, 128)
    x = torch.zeros(1, 4, 80, dtype=torch.bfloat16)
    assert ops.mamba2_kernel_limit(ck, None, x) is None
    assert "(96, 128) has no compiled kernel" in ops.mamba2_kernel_limit(torch.zeros(2, 4, 96, 128), None, x)
    assert "float32 activations" in ops.mamba2_kernel_limit(ck, None, x.float())
    assert "a float64 checkpoint" in ops.mamba2_kernel_limit(ck.double(), None, x)
    rc = torch.zeros(2, 4, 80, 128, dtype=torch.bfloat16)
    assert "a bfloat16 read copy of a bfloat16 checkpoint" in ops.mamba2_kernel_limit(ck.bfloat16(), rc, x)
