"""LayerCaches on the GPU: reset and copy_slots of a 40-layer hybrid model (Mamba-2, GDN, KDA caches with
mixed checkpoint / read-copy dtypes, staggered cursors, layer views of one engine pool) run as ONE
launch and equal the loop over the layers' own methods bit for bit: random slots, pads, out-of-range
ids, overlapping source and destination lists (the gather across all layers), eagerly and replayed in
a CUDA graph; commit, flush and materialize of a Mamba-2 group and of a GDN group likewise, one launch
each (load the per-layer loads). The launches are counted with torch.profiler."""

import warnings

import pytest
import torch

from families import family
from replayssm_cuda import LayerCaches, Mamba2Cache, _extension

FP8 = torch.float8_e4m3fn
NUM_LAYERS = 40
S = 300

# (family, dims, checkpoint dtype, read copy dtype, activation dtype, buffer_len, max_draft_tokens,
# staggered_flush)
LAYER_KINDS = [
    ("mamba2", dict(heads=4, head_dim=64, state_dim=128, groups=1), torch.float32, torch.bfloat16, torch.bfloat16,
     8, 2, True),
    ("gdn", {}, torch.float32, FP8, torch.bfloat16, 6, 2, True),
    ("kda", {}, torch.bfloat16, None, torch.bfloat16, 4, 1, False),
    ("mamba2", {}, torch.float16, FP8, torch.float16, 8, 1, False),
    ("gdn", dict(heads=2, v_heads=4, head_k_dim=128, head_v_dim=128), torch.bfloat16, None, torch.bfloat16, 4, 2,
     False),
]


def make_model(seed, num_layers=NUM_LAYERS, pool_layers=0):
    """The caches of a hybrid model on the GPU, every byte random. The first `pool_layers` are Mamba-2
    layers whose checkpoints are views of one (S, pool_layers, H, P, N) engine pool."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    caches = []
    pool = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # family ops of odd dims run the reference
        for i in range(num_layers):
            name, dims, ck, rc, act, L, T, staggered = LAYER_KINDS[i % len(LAYER_KINDS)]
            kw = dict(buffer_len=L, max_draft_tokens=T, read_copy_dtype=rc, staggered_flush=staggered,
                      backend="auto")
            if i < pool_layers:
                name, dims, ck = "mamba2", dict(heads=4, head_dim=64, state_dim=128, groups=1), torch.float32
                if pool is None:
                    pool = torch.zeros(S, pool_layers, 4, 64, 128, device="cuda")
                kw["checkpoint"] = pool[:, i]
            fam = family(name, dtype=ck, act_dtype=act, device="cuda", seed=seed + i, **dims)
            cache = fam.make_cache(S, **kw)
            for t in cache.cache_tensors:
                random_fill(t, gen)
            caches.append(cache)
    return caches


def random_fill(t, gen):
    if t.dtype == FP8:
        t.view(torch.uint8).copy_(torch.randint(1, 0x7e, t.shape, generator=gen, device="cuda", dtype=torch.uint8))
    elif t.dtype == torch.int32:
        t.copy_(torch.randint(1, 9, t.shape, generator=gen, device="cuda", dtype=torch.int32))
    else:
        t.copy_(torch.rand(t.shape, generator=gen, device="cuda") + 2.0)


def assert_same_models(a, b, what):
    for i, (ca, cb) in enumerate(zip(a, b)):
        for j, (x, y) in enumerate(zip(ca.cache_tensors, cb.cache_tensors)):
            if x.dtype == FP8:
                x, y = x.view(torch.uint8), y.view(torch.uint8)
            assert torch.equal(x, y), f"{what}: layer {i} cache tensor {j} differs from the per-layer loop"


def reset_loop(caches, slots):
    for cache in caches:
        cache.reset(slots)


def copy_loop(caches, src, dst):
    for cache in caches:
        cache.copy_slots(src, dst)


def reset_slots(kind, batch, seed):
    gen = torch.Generator().manual_seed(seed)
    if kind == "all":
        return None
    slots = torch.randint(0, S, (batch,), generator=gen)
    slots[::7] = -1                     # pads
    slots[3::11] = S + 5                # out of range: skipped
    slots[5::13] = slots[0]             # a slot named twice
    return slots.to("cuda", torch.int32 if kind == "int32" else torch.int64)


def gather_pairs(batch, seed):
    """`batch` pairs whose sources and destinations overlap (a permutation of one set of slots: chains
    and cycles), with pads and out-of-range ids; every named destination once."""
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(S, generator=gen)[:batch]
    src, dst = chosen.clone(), chosen[torch.randperm(batch, generator=gen)]
    src[::9] = -1
    dst[4::10] = -1
    src[6::17] = S + 2
    return src.cuda(), dst.cuda()


@pytest.fixture(scope="module")
def twin_models():
    return make_model(seed=11, pool_layers=4), make_model(seed=11, pool_layers=4)


def refill(models, seed):
    for model in models:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        for cache in model:
            for t in cache.cache_tensors:
                random_fill(t, gen)


def test_the_model_runs_one_launch(twin_models):
    layers = LayerCaches(twin_models[0])
    assert layers.one_launch, "every cache runs its slot ops compiled, so LayerCaches must launch once"


@pytest.mark.parametrize("kind", ["all", "int64", "int32"])
@pytest.mark.parametrize("batch", [64, 256])
def test_reset_equals_the_per_layer_loop(twin_models, kind, batch):
    model, loop = twin_models
    refill(twin_models, seed=batch)
    slots = reset_slots(kind, batch, seed=batch)
    LayerCaches(model).reset(slots)
    reset_loop(loop, slots)
    assert_same_models(model, loop, f"reset {kind} batch {batch}")


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("batch", [1, 64, 256])
def test_copy_slots_is_a_gather_over_all_layers(twin_models, batch, index_dtype):
    model, loop = twin_models
    refill(twin_models, seed=batch + 1)
    src, dst = (t.to(index_dtype) for t in gather_pairs(batch, seed=batch))
    LayerCaches(model).copy_slots(src, dst)
    copy_loop(loop, src, dst)
    assert_same_models(model, loop, f"copy_slots batch {batch}")


def test_cuda_graph_replay_equals_the_eager_loop(twin_models):
    model, loop = twin_models
    layers = LayerCaches(model)
    slots = reset_slots("int64", 64, seed=3)
    src, dst = gather_pairs(256, seed=4)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):       # warm-up outside the capture
        layers.copy_slots(src, dst)
        layers.reset(slots)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layers.copy_slots(src, dst)
        layers.reset(slots)
    for round_ in range(2):
        refill(twin_models, seed=100 + round_)
        # New slot lists in the captured tensors: the graph reads them on the device.
        slots.copy_(reset_slots("int64", 64, seed=5 + round_))
        new_src, new_dst = gather_pairs(256, seed=6 + round_)
        src.copy_(new_src)
        dst.copy_(new_dst)
        graph.replay()
        copy_loop(loop, src, dst)
        reset_loop(loop, slots)
        torch.cuda.synchronize()
        assert_same_models(model, loop, f"graph replay {round_}")


def _cuda_events(fn):
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def test_one_launch_per_call_where_the_loop_launches_per_layer(twin_models):
    model, loop = twin_models
    layers = LayerCaches(model)
    slots = reset_slots("int64", 64, seed=7)
    src, dst = gather_pairs(64, seed=8)
    reset_events = _cuda_events(lambda: layers.reset(slots))
    copy_events = _cuda_events(lambda: layers.copy_slots(src, dst))
    assert len(reset_events) == 1 and "fill_slots_table" in reset_events[0], reset_events
    assert len(copy_events) == 1 and "copy_slots_table" in copy_events[0], copy_events
    staggered = sum(c.staggered_flush and c.flush_period > 1 for c in loop)
    assert len(_cuda_events(lambda: reset_loop(loop, slots))) == NUM_LAYERS + staggered
    assert len(_cuda_events(lambda: copy_loop(loop, src, dst))) == NUM_LAYERS


def test_caches_that_share_slot_bytes_are_refused():
    model = make_model(seed=12, num_layers=1)
    first = model[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # A second cache on the same checkpoint memory: its slots are the first one's.
        twin = Mamba2Cache(S, 4, 64, 128, 1, first.weights, buffer_len=8, max_draft_tokens=2,
                           read_copy_dtype=torch.bfloat16, device="cuda", checkpoint=first.checkpoint)
    with pytest.raises(RuntimeError, match=r"slot_table: cache_tensors must own disjoint slot bytes .* share slot "
                                           r"bytes"):
        LayerCaches([first, twin])


def test_bad_input_on_the_compiled_path_names_the_argument(twin_models):
    layers = LayerCaches(twin_models[0])
    with pytest.raises(RuntimeError, match=r"fill_slots_table: slots"):
        layers.reset(torch.tensor([0.0, 1.0], device="cuda"))
    with pytest.raises(RuntimeError, match=r"copy_slots_table: src_slots"):
        layers.copy_slots(torch.tensor([0, 1]), torch.tensor([2, 3], device="cuda"))
    with pytest.raises(RuntimeError, match=r"copy_slots_table: dst_slots"):
        layers.copy_slots(torch.tensor([0, 1], device="cuda"), torch.tensor([2], device="cuda"))
    other = LayerCaches(twin_models[1][:3])
    with pytest.raises(RuntimeError, match=r"copy_slots_table: slot_table must be the contiguous"):
        torch.ops.replayssm.copy_slots_table(layers._tensors, other._table, torch.tensor([0], device="cuda"),
                                             torch.tensor([1], device="cuda"), -1)


# ---- commit, flush, materialize of a Mamba-2 group: one launch each; load: the per-layer loads -------

# (checkpoint dtype, read copy dtype, buffer_len, max_draft_tokens, staggered_flush, stochastic_rounding)
MAMBA2_KINDS = [
    (torch.float32, torch.bfloat16, 16, 4, True, False),
    (torch.bfloat16, FP8, 16, 3, False, True),
    (torch.float32, None, 8, 2, False, False),
]
MAMBA2_IDS = ["fp32-bf16copy-staggered", "bf16-fp8copy-rounding", "fp32-nocopy"]
MAMBA2_DIMS = dict(heads=8, head_dim=64, state_dim=128, groups=2)


# Fewer layers than the hybrid model above: each fold test holds two groups and their states (~4 GB at
# 12 layers), and the GPU suite runs several tests at once (pytest-xdist); 40 layers ran out of memory at 16.
MAMBA2_LAYERS = 12


def make_mamba2_model(kind, seed, num_layers=MAMBA2_LAYERS):
    """A Mamba-2 group on the GPU: random states, buffers, cursors in [0, L - T] and pending verifies of
    0..T entries."""
    ck, rc, L, T, staggered, rounding = kind
    gen = torch.Generator(device="cuda").manual_seed(seed)
    caches = []
    for i in range(num_layers):
        fam = family("mamba2", dtype=ck, act_dtype=torch.bfloat16, device="cuda", seed=seed + i, **MAMBA2_DIMS)
        cache = fam.make_cache(S, buffer_len=L, max_draft_tokens=T, read_copy_dtype=rc, staggered_flush=staggered,
                               stochastic_rounding=rounding, seed=seed + i, backend="cuda")
        cache.load(0.3 * torch.randn(S, *cache.checkpoint.shape[1:], device="cuda", generator=gen))
        for t in (cache.x_buf, cache.B_buf):
            t.copy_(torch.rand(t.shape, device="cuda", generator=gen) - 0.5)
        cache.dt_buf.copy_(0.5 * torch.rand(cache.dt_buf.shape, device="cuda", generator=gen))
        cache.num_committed.copy_(torch.randint(0, L - T + 1, (S,), device="cuda", generator=gen, dtype=torch.int32))
        cache.num_verified.copy_(torch.randint(0, T + 1, (S,), device="cuda", generator=gen, dtype=torch.int32))
        caches.append(cache)
    return caches


def fold_rows(batch, seed, T):
    """Rows on distinct random slots with a few pads, and num_accepted in [-1, T + 1] (clamped)."""
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(S, generator=gen)[:batch]
    slots[torch.randperm(batch, generator=gen)[: batch // 8]] = -1
    accepted = torch.randint(-1, T + 2, (batch,), generator=gen)
    return slots.cuda(), accepted.int().cuda()


@pytest.mark.parametrize("kind", MAMBA2_KINDS, ids=MAMBA2_IDS)
@pytest.mark.parametrize("batch", [8, 64, 256])
def test_mamba2_fold_ops_equal_the_per_layer_loop(kind, batch):
    model, loop = make_mamba2_model(kind, seed=20), make_mamba2_model(kind, seed=20)
    layers = LayerCaches(model)
    assert layers.one_launch_fold, layers
    slots, accepted = fold_rows(batch, seed=21, T=kind[3])
    layers.commit(accepted, slots)
    for cache in loop:
        cache.commit(accepted, slots)
    assert_same_models(model, loop, "commit")
    for a, b in zip(model, loop):
        # the error word keeps the first misuse to land: which row that is depends on CTA timing, so the code
        # is compared, and the recorded count is checked to be a misuse (outside [0, verified])
        assert torch.equal(a.error_word[0], b.error_word[0])
        code, _, value, limit = a.error_word.tolist()
        assert code == 0 or not 0 <= value <= limit, a.error_word
        if a.rounding_seed is not None:
            assert torch.equal(a.rounding_seed, b.rounding_seed)
    states = layers.materialize(slots)
    for i, cache in enumerate(loop):
        assert torch.equal(states[i], cache.materialize(slots)), f"materialize: layer {i}"
    layers.flush(slots)
    for cache in loop:
        cache.flush(slots)
    assert_same_models(model, loop, "flush")
    new_states = states.roll(1, dims=1).contiguous() * 0.5
    layers.load(new_states, slots)
    for i, cache in enumerate(loop):
        cache.load(new_states[i], slots)
    assert_same_models(model, loop, "load")
    layers.flush()   # every slot
    for cache in loop:
        cache.flush()
    assert_same_models(model, loop, "flush of every slot")


def test_mamba2_fold_ops_replay_in_a_cuda_graph():
    kind = MAMBA2_KINDS[0]
    model, loop = make_mamba2_model(kind, seed=30), make_mamba2_model(kind, seed=30)
    layers = LayerCaches(model)
    slots, accepted = fold_rows(64, seed=31, T=kind[3])
    states = layers.materialize(slots)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):       # warm-up outside the capture (on copies of the model)
        warm = LayerCaches(make_mamba2_model(kind, seed=30, num_layers=2))
        warm.commit(accepted, slots)
        warm.flush(slots)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layers.commit(accepted, slots)
        layers.materialize(slots, out=states)
        layers.flush(slots)
        layers.load(states, slots)
    for round_ in range(2):
        new_slots, new_accepted = fold_rows(64, seed=32 + round_, T=kind[3])
        slots.copy_(new_slots)
        accepted.copy_(new_accepted)
        for cache in model + loop:   # a pending verify in every slot again
            cache.num_verified.fill_(kind[3])
        graph.replay()
        for i, cache in enumerate(loop):
            cache.commit(accepted, slots)
            expect = cache.materialize(slots)
            cache.flush(slots)
            cache.load(expect, slots)
        torch.cuda.synchronize()
        assert_same_models(model, loop, f"graph replay {round_}")


def test_mamba2_fold_ops_launch_once_where_the_loop_launches_per_layer():
    kind = MAMBA2_KINDS[0]
    model = make_mamba2_model(kind, seed=40)
    layers = LayerCaches(model)
    slots, accepted = fold_rows(64, seed=41, T=kind[3])
    states = layers.materialize(slots)
    counts = {"commit": len(_cuda_events(lambda: layers.commit(accepted, slots))),
              "flush": len(_cuda_events(lambda: layers.flush(slots))),
              "materialize": len(_cuda_events(lambda: layers.materialize(slots, out=states)))}
    # commit and flush: the fold and the cursor kernel.
    assert counts == {"commit": 2, "flush": 2, "materialize": 1}, counts
    loop_commit = len(_cuda_events(lambda: [c.commit(accepted, slots) for c in model]))
    assert loop_commit == 2 * MAMBA2_LAYERS
    # load runs the per-layer loads: the launches of the loop over the layers' own load().
    loop_load = len(_cuda_events(lambda: [c.load(states[i], slots) for i, c in enumerate(model)]))
    assert len(_cuda_events(lambda: layers.load(states, slots))) == loop_load


def test_mamba2_layer_table_refuses_other_tensors():
    kind = MAMBA2_KINDS[2]
    layers = LayerCaches(make_mamba2_model(kind, seed=50, num_layers=3))
    other = LayerCaches(make_mamba2_model(kind, seed=51, num_layers=2))
    with pytest.raises(RuntimeError, match=r"mamba2_flush_layers: layer_table must be the contiguous \(50,\) int64"):
        torch.ops.replayssm.mamba2_flush_layers(other._layer_table, *layers._layer_lists, None, -1)
    lists = [list(t) for t in layers._layer_lists]
    lists[0][1] = lists[0][1][:, :4]
    with pytest.raises(RuntimeError, match=r"mamba2_flush_layers: layer 1's checkpoints must have layer 0's shape"):
        torch.ops.replayssm.mamba2_flush_layers(layers._layer_table, *lists, None, -1)


# ---- commit, flush, materialize of a GDN group: one launch each; load: the per-layer loads -------------

# (checkpoint dtype, read copy dtype, buffer_len, max_draft_tokens, staggered_flush, dims). 12 layers of
# 300 slots: about 1 GB a model at K = V = 128 (two models a test).
GDN_KINDS = [
    (torch.float32, torch.bfloat16, 16, 4, True, dict(heads=2, v_heads=4, head_k_dim=128, head_v_dim=128)),
    (torch.bfloat16, FP8, 16, 3, False, dict(heads=2, v_heads=4, head_k_dim=128, head_v_dim=128)),
    (torch.float32, None, 8, 2, False, dict(heads=2, v_heads=8, head_k_dim=64, head_v_dim=64)),
]
GDN_IDS = ["fp32-bf16copy-staggered-k128", "bf16-fp8copy-k128", "fp32-nocopy-k64"]
GDN_LAYERS = 12


def make_gdn_model(kind, seed, num_layers=GDN_LAYERS):
    """A GDN group on the GPU: random states, buffers (decays g < 0, beta in (0, 1)), cursors in [0, L - T]
    and pending verifies of 0..T entries."""
    ck, rc, L, T, staggered, dims = kind
    gen = torch.Generator(device="cuda").manual_seed(seed)
    caches = []
    for i in range(num_layers):
        fam = family("gdn", dtype=ck, act_dtype=torch.bfloat16, device="cuda", seed=seed + i, **dims)
        cache = fam.make_cache(S, buffer_len=L, max_draft_tokens=T, read_copy_dtype=rc, staggered_flush=staggered,
                               backend="cuda")
        cache.load(0.3 * torch.randn(S, *cache.checkpoint.shape[1:], device="cuda", generator=gen))
        for t in (cache.k_buf, cache.v_buf, cache.u_buf):
            t.copy_(torch.rand(t.shape, device="cuda", generator=gen) - 0.5)
        cache.g_buf.copy_(-0.5 * torch.rand(cache.g_buf.shape, device="cuda", generator=gen))
        cache.beta_buf.copy_(torch.rand(cache.beta_buf.shape, device="cuda", generator=gen))
        cache.num_committed.copy_(torch.randint(0, L - T + 1, (S,), device="cuda", generator=gen, dtype=torch.int32))
        cache.num_verified.copy_(torch.randint(0, T + 1, (S,), device="cuda", generator=gen, dtype=torch.int32))
        caches.append(cache)
    return caches


@pytest.mark.parametrize("kind", GDN_KINDS, ids=GDN_IDS)
@pytest.mark.parametrize("batch", [8, 64, 256])
def test_gdn_fold_ops_equal_the_per_layer_loop(kind, batch):
    model, loop = make_gdn_model(kind, seed=60), make_gdn_model(kind, seed=60)
    layers = LayerCaches(model)
    assert layers.one_launch_fold and layers.fold_family == "gdn", layers
    slots, accepted = fold_rows(batch, seed=61, T=kind[3])
    layers.commit(accepted, slots)
    for cache in loop:
        cache.commit(accepted, slots)
    assert_same_models(model, loop, "commit")
    for a, b in zip(model, loop):
        # the first misuse to land depends on CTA timing: the code is compared, the count is a misuse
        assert torch.equal(a.error_word[0], b.error_word[0])
        code, _, value, limit = a.error_word.tolist()
        assert code == 0 or not 0 <= value <= limit, a.error_word
    states = layers.materialize(slots)
    assert states.shape == (GDN_LAYERS, batch, *model[0].checkpoint.shape[1:])
    for i, cache in enumerate(loop):
        assert torch.equal(states[i], cache.materialize(slots)), f"materialize: layer {i}"
    layers.flush(slots)
    for cache in loop:
        cache.flush(slots)
    assert_same_models(model, loop, "flush")
    new_states = states.roll(1, dims=1).contiguous() * 0.5
    layers.load(new_states, slots)
    for i, cache in enumerate(loop):
        cache.load(new_states[i], slots)
    assert_same_models(model, loop, "load")
    layers.flush()   # every slot
    for cache in loop:
        cache.flush()
    assert_same_models(model, loop, "flush of every slot")


def test_gdn_fold_ops_replay_in_a_cuda_graph():
    kind = GDN_KINDS[0]
    model, loop = make_gdn_model(kind, seed=70), make_gdn_model(kind, seed=70)
    layers = LayerCaches(model)
    slots, accepted = fold_rows(64, seed=71, T=kind[3])
    states = layers.materialize(slots)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):       # warm-up outside the capture (on copies of the model)
        warm = LayerCaches(make_gdn_model(kind, seed=70, num_layers=2))
        warm.commit(accepted, slots)
        warm.flush(slots)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layers.commit(accepted, slots)
        layers.materialize(slots, out=states)
        layers.flush(slots)
        layers.load(states, slots)
    for round_ in range(2):
        new_slots, new_accepted = fold_rows(64, seed=72 + round_, T=kind[3])
        slots.copy_(new_slots)
        accepted.copy_(new_accepted)
        for cache in model + loop:   # a pending verify in every slot again
            cache.num_verified.fill_(kind[3])
        graph.replay()
        for cache in loop:
            cache.commit(accepted, slots)
            expect = cache.materialize(slots)
            cache.flush(slots)
            cache.load(expect, slots)
        torch.cuda.synchronize()
        assert_same_models(model, loop, f"graph replay {round_}")


def test_gdn_fold_ops_launch_once_where_the_loop_launches_per_layer():
    model = make_gdn_model(GDN_KINDS[2], seed=80)
    layers = LayerCaches(model)
    slots, accepted = fold_rows(64, seed=81, T=GDN_KINDS[2][3])
    states = layers.materialize(slots)
    counts = {"commit": len(_cuda_events(lambda: layers.commit(accepted, slots))),
              "flush": len(_cuda_events(lambda: layers.flush(slots))),
              "materialize": len(_cuda_events(lambda: layers.materialize(slots, out=states)))}
    assert counts == {"commit": 2, "flush": 2, "materialize": 1}, counts   # the fold and the cursor kernel
    assert len(_cuda_events(lambda: [c.commit(accepted, slots) for c in model])) == 2 * GDN_LAYERS


def test_gdn_layer_table_refuses_other_tensors():
    kind = GDN_KINDS[2]
    layers = LayerCaches(make_gdn_model(kind, seed=90, num_layers=3))
    other = LayerCaches(make_gdn_model(kind, seed=91, num_layers=2))
    with pytest.raises(RuntimeError, match=r"gdn_flush_layers: layer_table must be the contiguous \(50,\) int64 "
                                           r"table that replayssm_cuda._C.gdn_layer_table built"):
        torch.ops.replayssm.gdn_flush_layers(other._layer_table, *layers._layer_lists, True, None, -1)
    lists = [list(t) for t in layers._layer_lists]
    lists[0][1] = lists[0][1][:, :4]
    with pytest.raises(RuntimeError, match=r"gdn_flush_layers: layer 1's checkpoints must have layer 0's shape"):
        torch.ops.replayssm.gdn_flush_layers(layers._layer_table, *lists, True, None, -1)
    lists = [list(t) for t in layers._layer_lists]
    lists[3][1] = lists[3][0]
    with pytest.raises(RuntimeError, match=r"gdn_layer_table: layer 1's k_bufs shares its memory"):
        _extension._C.gdn_layer_table(*lists)
