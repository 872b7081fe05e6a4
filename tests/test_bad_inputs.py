"""Bad input raises an exception whose message names the argument, what was expected and what was given."""

import re
import warnings

import pytest
import torch

from families import family
from replayssm_cuda import DeltaRuleWeights, GDNCache, Mamba2Cache, Mamba2Weights, ops
from replayssm_cuda.__main__ import main


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


def test_gdn_kernel_limits_are_named():
    """What the compiled GDN kernels (capabilities()["gdn"]) do not take is said in words, so a valid call
    they cannot run goes to the reference (with the reason in the warning) instead of a C++ error."""
    ck = torch.zeros(2, 4, 128, 64)                           # (slots, HV, V, K)
    q = torch.zeros(1, 2, 64, dtype=torch.bfloat16)
    k_buf = torch.zeros(2, 2, 8, 64, dtype=torch.bfloat16)
    g, beta, u = torch.zeros(2, 4, 8), torch.zeros(2, 4, 8), torch.zeros(2, 4, 8, 128)
    bufs = (g, beta, u)
    w = (torch.zeros(4), torch.zeros(4))
    assert ops.gdn_kernel_limit(ck, None, q, weights=w) is None
    assert ops.gdn_kernel_limit(ck, None, k_buf, buffers=bufs, weights=w, T=16) is None
    assert "(head_v_dim, head_k_dim) = (128, 32) has no compiled kernel" in \
        ops.gdn_kernel_limit(torch.zeros(2, 4, 128, 32), None, q)
    assert "a float64 checkpoint" in ops.gdn_kernel_limit(ck.double(), None, k_buf, buffers=bufs)
    assert "float32 activations" in ops.gdn_kernel_limit(ck, None, q.float())
    rc = torch.zeros_like(ck, dtype=torch.bfloat16)
    assert "a bfloat16 read copy of a bfloat16 checkpoint" in ops.gdn_kernel_limit(ck.bfloat16(), rc, k_buf,
                                                                                   buffers=bufs)
    assert "a float64 u_buf" in ops.gdn_kernel_limit(ck, None, k_buf, buffers=(g, beta, u.double()))
    long = (torch.zeros(2, 4, 65), torch.zeros(2, 4, 65), torch.zeros(2, 4, 65, 128))
    assert "buffer_len = 65 exceeds" in ops.gdn_kernel_limit(ck, None, k_buf, buffers=long)
    assert "T = 17 tokens exceed" in ops.gdn_kernel_limit(ck, None, k_buf, buffers=bufs, T=17)
    assert "a float64 dt_bias" in ops.gdn_kernel_limit(ck, None, q, weights=(w[0], w[1].double()))
    assert "a float64 out" in ops.gdn_kernel_limit(ck, None, k_buf, buffers=bufs, out=torch.zeros(1, 4, 128, 64,
                                                                                                 dtype=torch.float64))
    snaps = torch.zeros(1, 2, 4, 128, 64, dtype=torch.bfloat16)
    assert "bfloat16 snapshots of a float32 state" in ops.gdn_kernel_limit(ck, None, q, snapshots=snaps)


def test_gdn_cache_chooses_its_path_from_the_kernel_limits():
    """GDNCache and KDACache ask once, at construction, what the compiled kernels take (KDA runs GDN's
    kernels: the same shapes and dtypes; an op this build does not compile is _choose_paths' to report)."""
    kinds = ("update", "step", "verify", "commit", "flush", "materialize")
    fam = family("gdn", heads=1, v_heads=2, head_k_dim=64, head_v_dim=128, dtype=torch.float32,
                 act_dtype=torch.bfloat16)
    cache = fam.make_cache(2, buffer_len=4, max_draft_tokens=2, read_copy_dtype=torch.float8_e4m3fn)
    assert all(cache._family_limit(kind) is None for kind in kinds)
    small = family("gdn", heads=1, v_heads=2, head_k_dim=32, head_v_dim=64, dtype=torch.float32,
                   act_dtype=torch.bfloat16).make_cache(2, buffer_len=4)
    assert "(head_v_dim, head_k_dim) = (64, 32) has no compiled kernel" in small._family_limit("step")
    fp64 = family("gdn", heads=1, v_heads=2, head_k_dim=64, head_v_dim=64).make_cache(2, buffer_len=4)
    assert "a float64 checkpoint" in fp64._family_limit("verify")
    kda = family("kda", heads=1, v_heads=2, head_k_dim=128, head_v_dim=128, dtype=torch.float32,
                 act_dtype=torch.bfloat16).make_cache(2, buffer_len=4, max_draft_tokens=2)
    assert all(kda._family_limit(kind) is None for kind in kinds)
    kda_small = family("kda", dtype=torch.float32, act_dtype=torch.bfloat16).make_cache(2, buffer_len=4)
    assert "(head_v_dim, head_k_dim) = (6, 8) has no compiled kernel" in kda_small._family_limit("update")


# --------------------------------------------------------------------------------------------------
# Sharp edges of the API: each is an error (or a warning) that names what is wrong
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wrong", ["x", "B", "C", "z"])
def test_activation_dtype_mismatch_is_an_error_naming_the_tensor(wrong):
    """No silent cast into the cache's buffers: every activation must have activation_dtype."""
    fam = family("mamba2", dtype=torch.float32, act_dtype=torch.bfloat16)
    cache = fam.make_cache(4, buffer_len=4, max_draft_tokens=2)
    inputs = dict(zip("x dt B C z".split(), fam.inputs(2)))
    got = {"x": torch.float32, "B": torch.float16, "C": torch.float32, "z": torch.float16}[wrong]
    inputs[wrong] = inputs[wrong].to(got)
    want = rf"mamba2_step: `{wrong}` must have dtype in \{{bfloat16\}}, got {str(got)[6:]}"
    with pytest.raises(TypeError, match=want):
        cache.step(**inputs)
    drafts = dict(zip("x dt B C z".split(), fam.inputs(2, 2)))
    drafts[wrong] = drafts[wrong].to(got)
    with pytest.raises(TypeError, match=want.replace("step", "verify")):
        cache.verify(**drafts)


def test_activation_dtype_mismatch_in_the_functional_ops():
    fam = family("mamba2", dtype=torch.float32, act_dtype=torch.bfloat16)
    cache = fam.make_cache(4, buffer_len=4, max_draft_tokens=2)
    x, dt, B, C, z = fam.inputs(2)
    w = cache.weights
    with pytest.raises(TypeError, match=r"mamba2_step: `x` must have dtype in \{bfloat16\}, got float32"):
        ops.mamba2_step(*cache._cache_args(), x.float(), dt, w.A, B.float(), C.float(), x.float(), w.D, z.float(),
                        w.dt_bias, True, 2)
    for name in ("gdn", "kda"):
        fam = family(name, dtype=torch.float32, act_dtype=torch.float16)
        cache = fam.make_cache(4, buffer_len=4)
        q, k, v, a, b = fam.inputs(2)
        with pytest.raises(TypeError, match=rf"{name}_step: `q` must have dtype in \{{float16\}}, got float32"):
            cache.step(q.float(), k, v, a, b)
        with pytest.raises(TypeError, match=rf"{name}_step: `v` must have dtype in \{{float16\}}, got bfloat16"):
            cache.step(q, k, v.bfloat16(), a, b)


@pytest.mark.parametrize("value", [0.5, float("nan")])
def test_positive_A_is_rejected(value):
    A = -torch.ones(4)
    A[2] = value
    with pytest.raises(ValueError, match=r"Mamba2Cache: `weights.A` must be <= 0 \(a decay rate, A = -exp\(A_log\)\), "
                                         r"got .* at head 2"):
        Mamba2Cache(2, 4, 8, 8, 2, Mamba2Weights(A=A))
    Mamba2Cache(2, 4, 8, 8, 2, Mamba2Weights(A=torch.zeros(4)))     # no decay is allowed


def test_buffer_len_equal_to_max_draft_tokens_warns_that_every_step_folds():
    w = Mamba2Weights(A=-torch.ones(4))
    with pytest.warns(UserWarning, match=r"Mamba2Cache: buffer_len == max_draft_tokens == 4: every step folds"):
        Mamba2Cache(2, 4, 8, 8, 2, w, buffer_len=4, max_draft_tokens=4)
    with pytest.warns(UserWarning, match=r"GDNCache: buffer_len == max_draft_tokens == 2"):
        GDNCache(2, 2, 4, 8, 8, DeltaRuleWeights(A_log=torch.zeros(4), dt_bias=torch.zeros(4)), buffer_len=2,
                 max_draft_tokens=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Mamba2Cache(2, 4, 8, 8, 2, w, buffer_len=1)                 # the conventional update: no buffer
        Mamba2Cache(2, 4, 8, 8, 2, w, buffer_len=5, max_draft_tokens=4)


def _cache_calls(fam, cache):
    """Every cache method that takes slots, with a list for them."""
    slots = [0, 1]
    return {
        "step": lambda: cache.step(*fam.inputs(2), slots=slots),
        "verify": lambda: cache.verify(*fam.inputs(2, 1), slots=slots),
        "commit": lambda: cache.commit(torch.ones(2, dtype=torch.int32), slots=slots),
        "flush": lambda: cache.flush(slots=slots),
        "materialize": lambda: cache.materialize(slots=slots),
        "load": lambda: cache.load(torch.zeros(2, *fam.state_shape, dtype=fam.dtype), slots=slots),
        "reset": lambda: cache.reset(slots=slots),
        "copy_slots": lambda: cache.copy_slots(slots, torch.tensor([2, 3])),
    }


@pytest.mark.parametrize("name", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("buffer_len", [1, 4])
def test_list_slots_are_the_same_type_error_everywhere(name, buffer_len):
    fam = family(name, dtype=torch.float32)
    cache = fam.make_cache(4, buffer_len=buffer_len, max_draft_tokens=1, staggered_flush=buffer_len > 1)
    for method, call in _cache_calls(fam, cache).items():
        arg = "src_slots" if method == "copy_slots" else "slots"
        with pytest.raises(TypeError, match=rf"^\w+: `{arg}` must be a torch.Tensor \(int32 or int64, on the cache's "
                                            rf"device\) or None, got list$"):
            call()


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_list_slots_in_the_functional_ops(backend):
    fam = family("mamba2", dtype=torch.float32)
    cache = fam.make_cache(4, buffer_len=4, max_draft_tokens=2)
    x, dt, B, C, z = fam.inputs(2)
    w = cache.weights
    message = r"`slots` must be a torch.Tensor \(int32 or int64, on the cache's device\) or None, got list"
    with pytest.raises(TypeError, match="mamba2_step: " + message):
        ops.mamba2_step(*cache._cache_args(), x, dt, w.A, B, C, x.clone(), None, None, None, True, 2, [0, 1],
                        backend=backend)
    with pytest.raises(TypeError, match="mamba2_update: " + message):
        ops.mamba2_update(cache.checkpoint, x, dt, w.A, B, C, x.clone(), slots=[0, 1], backend=backend)
    with pytest.raises(TypeError, match="make_read_copy: " + message):
        ops.make_read_copy(cache.checkpoint, torch.zeros_like(cache.checkpoint, dtype=torch.bfloat16), None, [0],
                           backend=backend)
    with pytest.raises(TypeError, match="copy_slots: `dst_slots` must be a torch.Tensor"):
        ops.copy_slots(cache.cache_tensors, torch.tensor([0]), [1], backend=backend)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda_gives_our_message():
    why = "a CPU-only build" if torch.version.cuda is None else "sees no CUDA GPU"
    with pytest.raises(RuntimeError, match=rf"Mamba2Cache: device='cuda' needs CUDA, but torch .* {why}; pass "
                                           rf"device='cpu'"):
        Mamba2Cache(2, 4, 8, 8, 2, Mamba2Weights(A=-torch.ones(4)), device="cuda")
    with pytest.raises(RuntimeError, match=r"GDNCache: device='cuda:1' needs CUDA"):
        GDNCache(2, 2, 4, 8, 8, DeltaRuleWeights(A_log=torch.zeros(4), dt_bias=torch.zeros(4)), device="cuda:1")


@pytest.mark.parametrize("args", [["--steps", "-1"], ["--spec-rounds", "-3"], ["--steps", "two"]])
def test_demo_rejects_negative_counts(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", *args])
    assert exit_info.value.code == 2
    assert re.search(rf"argument {args[0]}: must be an int >= 0, got '?{re.escape(args[1])}'?", capsys.readouterr().err)
