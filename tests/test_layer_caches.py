"""LayerCaches (the slot management of all layers of a model in one launch) on the CPU: its calls equal
the loop over the layers' own methods, for Mamba-2, GDN and KDA caches with mixed checkpoint and
read-copy dtypes and staggered cursors; the table ops' reference with LayerCaches' fill entries equals
that loop too (what the compiled one-launch path runs on CUDA); bad input names the argument."""

import dataclasses
import re

import pytest
import torch

from families import family, random_states
from replayssm_cuda import LayerCaches

FP8 = torch.float8_e4m3fn

# (family, checkpoint dtype, read copy dtype, activation dtype, buffer_len, max_draft_tokens, staggered_flush)
LAYER_KINDS = [
    ("mamba2", torch.float32, torch.bfloat16, torch.bfloat16, 4, 2, False),
    ("gdn", torch.float32, FP8, torch.bfloat16, 6, 2, True),
    ("kda", torch.bfloat16, None, torch.bfloat16, 4, 1, False),
    ("mamba2", torch.float16, FP8, torch.float16, 8, 1, True),
    ("gdn", torch.bfloat16, None, torch.bfloat16, 2, 1, False),
]


def make_model(num_layers, num_slots, device="cpu", backend="reference", seed=0, pad_slot_id=-1):
    """The caches of a hybrid model's SSM layers (LAYER_KINDS in turn), every byte random."""
    caches = []
    gen = torch.Generator().manual_seed(seed)
    for i in range(num_layers):
        name, ck, rc, act, L, T, staggered = LAYER_KINDS[i % len(LAYER_KINDS)]
        fam = family(name, dtype=ck, act_dtype=act, device=device, seed=seed + i)
        cache = fam.make_cache(num_slots, buffer_len=L, max_draft_tokens=T, read_copy_dtype=rc,
                               staggered_flush=staggered, backend=backend, pad_slot_id=pad_slot_id)
        for t in cache.cache_tensors:
            random_fill(t, gen)
        caches.append(cache)
    return caches


def random_fill(t, gen):
    """Random content, never the reset values (fp8 without NaN bit patterns)."""
    if t.dtype == FP8:
        cpu = torch.randint(1, 0x7e, t.shape, generator=gen, dtype=torch.uint8)
        t.view(torch.uint8).copy_(cpu.to(t.device))
    elif t.dtype == torch.int32:
        t.copy_(torch.randint(1, 9, t.shape, generator=gen, dtype=torch.int32).to(t.device))
    else:
        t.copy_((torch.rand(t.shape, generator=gen, dtype=torch.float64) + 2.0).to(t.device, t.dtype))


def model_bytes(caches):
    return [t.view(torch.uint8).cpu().clone() if t.dtype == FP8 else t.contiguous().view(torch.uint8).cpu().clone()
            for cache in caches for t in cache.cache_tensors]


def assert_same_models(a, b, what):
    for i, (x, y) in enumerate(zip(model_bytes(a), model_bytes(b))):
        assert torch.equal(x, y), f"{what}: cache tensor {i} differs from the per-layer loop"


def reset_loop(caches, slots):
    for cache in caches:
        cache.reset(slots)


def copy_loop(caches, src, dst):
    for cache in caches:
        cache.copy_slots(src, dst)


S = 9
RESET_SLOTS = [None, torch.tensor([3, -1, 0, 3, 8]), torch.tensor([7, 12, -5, 1], dtype=torch.int32),
               torch.tensor([], dtype=torch.int64)]
# Overlapping sources and destinations (a cycle 0 -> 1 -> 2 -> 0 and a swap), pads and out-of-range ids.
COPY_PAIRS = [([0, 1, 2, 5, 6, -1, 4, 30], [1, 2, 0, 6, 5, 3, -1, 7]), ([4], [4]), ([], [])]


def test_one_launch_is_off_on_the_cpu():
    layers = LayerCaches(make_model(3, S))
    assert not layers.one_launch and len(layers) == 3
    assert "3 layers (gdn, kda, mamba2)" in repr(layers) and "one_launch=False" in repr(layers)


@pytest.mark.parametrize("slots", RESET_SLOTS, ids=["all", "pads", "int32-out-of-range", "empty"])
def test_reset_equals_the_per_layer_loop(slots):
    model, loop = make_model(7, S, seed=1), make_model(7, S, seed=1)
    LayerCaches(model).reset(slots)
    reset_loop(loop, slots)
    assert_same_models(model, loop, "reset")


@pytest.mark.parametrize("pairs", COPY_PAIRS, ids=["gather", "self", "empty"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_copy_slots_equals_the_per_layer_loop(pairs, index_dtype):
    src, dst = (torch.tensor(p, dtype=index_dtype) for p in pairs)
    model, loop = make_model(7, S, seed=2), make_model(7, S, seed=2)
    LayerCaches(model).copy_slots(src, dst)
    copy_loop(loop, src, dst)
    assert_same_models(model, loop, "copy_slots")


@pytest.mark.parametrize("slots", RESET_SLOTS, ids=["all", "pads", "int32-out-of-range", "empty"])
def test_fill_slots_table_with_the_reset_fills_equals_the_loop(slots):
    """The compiled path's one call: fill_slots_table with LayerCaches' fill entries (scales 1,
    staggered cursors slot % flush_period) is every layer's reset()."""
    model, loop = make_model(7, S, seed=3), make_model(7, S, seed=3)
    tensors, values, periods = LayerCaches(model)._table_entries()
    assert any(periods) and any(values)
    torch.ops.replayssm.fill_slots_table(tensors, torch.zeros(0, dtype=torch.int64), values, periods, slots, -1)
    reset_loop(loop, slots)
    assert_same_models(model, loop, "fill_slots_table")


def test_copy_slots_table_equals_the_loop():
    src, dst = (torch.tensor(p) for p in COPY_PAIRS[0])
    model, loop = make_model(7, S, seed=4), make_model(7, S, seed=4)
    tensors, _, _ = LayerCaches(model)._table_entries()
    torch.ops.replayssm.copy_slots_table(tensors, torch.zeros(0, dtype=torch.int64), src, dst, -1)
    copy_loop(loop, src, dst)
    assert_same_models(model, loop, "copy_slots_table")


def test_a_pad_id_of_the_caches_is_skipped():
    src, dst = torch.tensor([0, 7, 2]), torch.tensor([7, 1, 3])
    model, loop = make_model(4, S, seed=5, pad_slot_id=7), make_model(4, S, seed=5, pad_slot_id=7)
    layers = LayerCaches(model)
    layers.copy_slots(src, dst)
    layers.reset(torch.tensor([7, 4]))
    copy_loop(loop, src, dst)
    reset_loop(loop, torch.tensor([7, 4]))
    assert_same_models(model, loop, "pad_slot_id=7")


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------

def test_bad_caches():
    model = make_model(2, S)
    with pytest.raises(TypeError, match=r"LayerCaches: `caches` must be a list of layer caches .*got Mamba2Cache"):
        LayerCaches(model[0])
    with pytest.raises(ValueError, match=r"LayerCaches: `caches` must hold at least one layer cache, got an empty"):
        LayerCaches([])
    with pytest.raises(TypeError, match=r"LayerCaches: `caches\[1\]` must be a Mamba2Cache, GDNCache or KDACache, "
                                        r"got Tensor"):
        LayerCaches([model[0], model[0].checkpoint])
    with pytest.raises(ValueError, match=r"`caches\[2\]` must be a different cache from every other, got the cache "
                                         r"of caches\[0\] again"):
        LayerCaches([model[0], model[1], model[0]])
    with pytest.raises(ValueError, match=r"`caches\[1\]` must have num_slots = 9 like caches\[0\], got 5"):
        LayerCaches([model[0], make_model(1, 5)[0]])
    with pytest.raises(ValueError, match=r"`caches\[1\]` must have pad_slot_id = -1 like caches\[0\], got 0"):
        LayerCaches([model[0], make_model(1, S, pad_slot_id=0)[0]])


def test_bad_slot_lists_are_refused_before_anything_is_written():
    model, untouched = make_model(3, S, seed=6), make_model(3, S, seed=6)
    layers = LayerCaches(model)
    with pytest.raises(TypeError, match=r"reset: `slots` must be a torch.Tensor .* got list"):
        layers.reset([0, 1])
    with pytest.raises(TypeError, match=r"reset: `slots` must have dtype in \{int32, int64\}, got float32"):
        layers.reset(torch.tensor([0.0]))
    with pytest.raises(TypeError, match=r"copy_slots: `dst_slots` must be a torch.Tensor .* got tuple"):
        layers.copy_slots(torch.tensor([0]), (1,))
    with pytest.raises(ValueError, match=r"copy_slots: `dst_slots` must have shape \(2,?\), got \(1,\)"):
        layers.copy_slots(torch.tensor([0, 1]), torch.tensor([2]))
    assert_same_models(model, untouched, "after refused calls")


def test_table_ops_check_their_fills():
    model = make_model(2, S)
    tensors, values, periods = LayerCaches(model)._table_entries()
    table = torch.zeros(0, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"fill_slots_table: `fill_values` must hold one entry per cache tensor "
                                         rf"\({len(tensors)}\), got {len(tensors) - 1} entries"):
        torch.ops.replayssm.fill_slots_table(tensors, table, values[1:], periods, None, -1)
    bad = [0.0] * len(tensors)
    bad[0] = 2.0
    tensors_bf16 = [model[1].checkpoint.bfloat16(), *tensors[1:]]
    with pytest.raises(ValueError, match=r"`fill_values\[0\]` must be 0 for a bfloat16 cache_tensors\[0\] "
                                         r"\(a non-zero fill needs a float32 tensor\), got 2.0"):
        torch.ops.replayssm.fill_slots_table(tensors_bf16, table, bad, periods, None, -1)
    bad_periods = [3] + [0] * (len(tensors) - 1)
    with pytest.raises(ValueError, match=r"`fill_periods\[0\]` = 3 needs an int32 \(num_slots,\) cursor tensor, got "
                                         r"cache_tensors\[0\] of dtype float32"):
        torch.ops.replayssm.fill_slots_table(tensors, table, values, bad_periods, None, -1)
    with pytest.raises(TypeError, match=r"copy_slots_table: `slot_table` must have dtype in \{int64\}, got int32"):
        torch.ops.replayssm.copy_slots_table(tensors, table.int(), torch.tensor([0]), torch.tensor([1]), -1)


# --------------------------------------------------------------------------------------------------
# Commit, flush and materialize of a Mamba-2 or GDN group (one launch each on CUDA); load (the per-layer
# loads)
# --------------------------------------------------------------------------------------------------

# Mamba-2: (checkpoint dtype, read copy dtype, activation dtype, buffer_len, max_draft_tokens, staggered_flush,
# rounding); GDN the same without rounding (its caches have none).
MAMBA2_KINDS = [
    (torch.float32, torch.bfloat16, torch.bfloat16, 8, 2, False, False),
    (torch.float16, FP8, torch.float16, 8, 3, True, False),
    (torch.bfloat16, None, torch.bfloat16, 6, 2, True, True),
]
GDN_KINDS = [
    (torch.float32, FP8, torch.bfloat16, 8, 2, False, False),
    (torch.bfloat16, None, torch.bfloat16, 6, 3, True, False),
    (torch.float16, torch.float16, torch.float16, 4, 1, False, False),
]
FOLD_KINDS = [("mamba2", k) for k in MAMBA2_KINDS] + [("gdn", k) for k in GDN_KINDS]
KIND_IDS = ["mamba2-fp32-bf16copy", "mamba2-fp16-fp8copy-staggered", "mamba2-bf16-staggered-rounding",
            "gdn-fp32-fp8copy", "gdn-bf16-staggered", "gdn-fp16-fp16copy"]


def make_fold_model(name, kind, num_layers, num_slots, seed=0, verified=True):
    """A group of one family: every layer one configuration, random states and buffers, cursors in
    [0, L - T] and (verified) a pending verify of T entries in every slot."""
    ck, rc, act, L, T, staggered, rounding = kind
    gen = torch.Generator().manual_seed(seed)
    caches = []
    for i in range(num_layers):
        fam = family(name, dtype=ck, act_dtype=act, seed=seed + i)
        extra = dict(stochastic_rounding=rounding, seed=seed + i) if name == "mamba2" else {}
        cache = fam.make_cache(num_slots, buffer_len=L, max_draft_tokens=T, read_copy_dtype=rc,
                               staggered_flush=staggered, **extra)
        cache.load(random_states(fam, num_slots).float())
        if name == "mamba2":
            for t in (cache.x_buf, cache.B_buf):
                t.copy_((torch.rand(t.shape, generator=gen) - 0.5).to(t.dtype))
            cache.dt_buf.copy_(torch.rand(cache.dt_buf.shape, generator=gen) * 0.5)
        else:
            for t in (cache.k_buf, cache.v_buf, cache.u_buf):
                t.copy_((torch.rand(t.shape, generator=gen) - 0.5).to(t.dtype))
            cache.g_buf.copy_(-0.5 * torch.rand(cache.g_buf.shape, generator=gen))
            cache.beta_buf.copy_(torch.rand(cache.beta_buf.shape, generator=gen))
        cache.num_committed.copy_(torch.randint(0, L - T + 1, (num_slots,), generator=gen, dtype=torch.int32))
        if verified:
            cache.num_verified.copy_(torch.full((num_slots,), T, dtype=torch.int32))
        caches.append(cache)
    return caches


def make_mamba2_model(kind, num_layers, num_slots, seed=0, verified=True):
    return make_fold_model("mamba2", kind, num_layers, num_slots, seed, verified)


def layer_op_args(layers):
    return (torch.zeros(0, dtype=torch.int64), *layers._layer_lists)


def layer_op(name, kind):
    return getattr(torch.ops.replayssm, f"{name}_{kind}_layers")


def flags(name, layers):
    """The per-family arguments of the *_layers ops before slots (GDN: use_qk_l2norm)."""
    return (layers.caches[0].weights.use_qk_l2norm,) if name == "gdn" else ()


FOLD_SLOTS = [None, torch.tensor([3, -1, 0, 8, 5, 12]), torch.tensor([2, 7], dtype=torch.int32)]


@pytest.mark.parametrize("name, kind", FOLD_KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("slots", FOLD_SLOTS, ids=["all", "pads", "int32"])
def test_commit_layers_equals_the_per_layer_loop(name, kind, slots):
    """{family}_commit_layers (the op LayerCaches.commit launches once on CUDA; here its reference) and
    LayerCaches.commit equal each layer's own commit with the same num_accepted."""
    batch = S if slots is None else slots.shape[0]
    accepted = torch.randint(-1, kind[4] + 2, (batch,), generator=torch.Generator().manual_seed(3))
    op_model, model, loop = (make_fold_model(name, kind, 4, S, seed=4) for _ in range(3))
    op_layers = LayerCaches(op_model)
    assert op_layers.fold_family == name
    layer_op(name, "commit")(*layer_op_args(op_layers), accepted, kind[4], *flags(name, op_layers), slots, -1)
    LayerCaches(model).commit(accepted, slots)
    for cache in loop:
        cache.commit(accepted, slots)
    assert_same_models(op_model, loop, f"{name}_commit_layers")
    assert_same_models(model, loop, "LayerCaches.commit")
    assert all(torch.equal(a.error_word, b.error_word) for a, b in zip(op_model, loop))


@pytest.mark.parametrize("name, kind", FOLD_KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("slots", FOLD_SLOTS, ids=["all", "pads", "int32"])
def test_flush_layers_equals_the_per_layer_loop(name, kind, slots):
    op_model, model, loop = (make_fold_model(name, kind, 3, S, seed=5) for _ in range(3))
    op_layers = LayerCaches(op_model)
    layer_op(name, "flush")(*layer_op_args(op_layers), *flags(name, op_layers), slots, -1)
    LayerCaches(model).flush(slots)
    for cache in loop:
        cache.flush(slots)
    assert_same_models(op_model, loop, f"{name}_flush_layers")
    assert_same_models(model, loop, "LayerCaches.flush")


@pytest.mark.parametrize("name, kind", FOLD_KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("slots", FOLD_SLOTS, ids=["all", "pads", "int32"])
def test_materialize_layers_and_load_equal_the_per_layer_loop(name, kind, slots):
    model, loop = make_fold_model(name, kind, 3, S, seed=6), make_fold_model(name, kind, 3, S, seed=6)
    layers = LayerCaches(model)
    states = layers.materialize(slots)
    batch = S if slots is None else slots.shape[0]
    assert states.shape == (3, batch, *model[0].checkpoint.shape[1:]) and states.dtype == torch.float32
    for i, cache in enumerate(loop):
        assert torch.equal(states[i], cache.materialize(slots)), f"layer {i}"
    out = torch.empty_like(states)
    layer_op(name, "materialize")(*layer_op_args(layers), out, *flags(name, layers), slots, -1)
    assert torch.equal(out, states)
    assert_same_models(model, loop, "materialize changes nothing")

    # load: the layers' states rolled by one slot, into the same slots
    new_states = states.roll(1, dims=1).contiguous() + 0.25
    layers.load(new_states, slots)
    for i, cache in enumerate(loop):
        cache.load(new_states[i], slots)
    assert_same_models(model, loop, "LayerCaches.load")
    layers.load(list(new_states), slots)  # a list of per-layer states: the same
    assert_same_models(model, loop, "LayerCaches.load of a list")


def test_a_mixed_group_loops_the_fold_ops_and_materializes_a_list():
    model, loop = make_model(5, S, seed=7), make_model(5, S, seed=7)
    layers = LayerCaches(model)
    assert layers.fold_family is None and not layers.one_launch_fold
    layers.flush()
    for cache in loop:
        cache.flush()
    assert_same_models(model, loop, "flush of a mixed group")
    states = layers.materialize()
    assert isinstance(states, list) and [s.shape for s in states] == [c.materialize().shape for c in loop]
    assert layers.fold_loop_reason == "the layers are of several families (gdn, kda, mamba2)"


def test_a_kda_group_loops_the_fold_ops():
    """KDA has no kernels (its ops run the reference), so no layer table: its group loops, silently."""
    kda = [c for c in make_model(15, S, seed=8) if c.family == "kda"]
    layers = LayerCaches(kda)
    assert layers.fold_family is None and layers.fold_loop_reason == "kda layers have no layer table"
    assert isinstance(layers.materialize(), list)


@pytest.mark.parametrize("field, change, match", [
    ("head_dim", {"head_dim": 4}, r"caches\[1\]\.head_dim = 4, caches\[0\]\.head_dim = 5"),
    ("buffer_len", {"buffer_len": 6}, r"caches\[1\]\.buffer_len = 6, caches\[0\]\.buffer_len = 8"),
    ("read_copy", {"read_copy_dtype": None}, r"differ in having a read copy: caches\[1\] has not"),
    ("read_copy_dtype", {"read_copy_dtype": torch.float16},
     r"differ in the dtype of read_copy: caches\[1\]\.read_copy has torch.float16"),
])
def test_mamba2_layers_that_differ_loop_and_say_why(field, change, match):
    def make(**kw):
        fam = family("mamba2", dtype=torch.float32, act_dtype=torch.bfloat16, head_dim=kw.pop("head_dim", 5))
        args = dict(buffer_len=8, max_draft_tokens=2, read_copy_dtype=torch.bfloat16)
        args.update(kw)
        return fam.make_cache(S, **args)
    with pytest.warns(RuntimeWarning, match=r"LayerCaches: commit, flush and materialize loop over the "
                                            r"layers: the layers .*" + match):
        layers = LayerCaches([make(), make(**change)])
    assert not layers.one_launch_fold and re.search(match, layers.fold_loop_reason)
    states = layers.materialize()   # one tensor when the state shapes agree, else a list; the loop's either way
    for i, cache in enumerate(layers.caches):
        assert torch.equal(states[i], cache.materialize())


@pytest.mark.parametrize("field, change, match", [
    ("head_k_dim", {"head_k_dim": 4}, r"caches\[1\]\.head_k_dim = 4, caches\[0\]\.head_k_dim = 8"),
    ("use_qk_l2norm", {"use_qk_l2norm": False},
     r"caches\[1\]\.weights\.use_qk_l2norm = False, caches\[0\]\.weights\.use_qk_l2norm = True"),
    ("read_copy_dtype", {"read_copy_dtype": torch.bfloat16},
     r"differ in the dtype of read_copy: caches\[1\]\.read_copy has torch.bfloat16"),
])
def test_gdn_layers_that_differ_loop_and_say_why(field, change, match):
    def make(**kw):
        fam = family("gdn", dtype=torch.float32, act_dtype=torch.bfloat16, head_k_dim=kw.pop("head_k_dim", 8))
        fam.weights = dataclasses.replace(fam.weights, use_qk_l2norm=kw.pop("use_qk_l2norm", True))
        args = dict(buffer_len=8, max_draft_tokens=2, read_copy_dtype=FP8)
        args.update(kw)
        return fam.make_cache(S, **args)
    with pytest.warns(RuntimeWarning, match=r"LayerCaches: commit, flush and materialize loop over the "
                                            r"layers: the layers .*" + match):
        layers = LayerCaches([make(), make(**change)])
    assert layers.fold_family is None and not layers.one_launch_fold and re.search(match, layers.fold_loop_reason)
    states = layers.materialize()   # layers of two shapes: one state each
    assert isinstance(states, list) and len(states) == 2


def test_layer_ops_name_the_layer_and_the_list():
    model = make_mamba2_model(MAMBA2_KINDS[0], 3, S)
    table, *lists = layer_op_args(LayerCaches(model))
    bad = [list(t) for t in lists]
    bad[0][2] = bad[0][2][:, :, :, :2]
    with pytest.raises(ValueError, match=r"mamba2_flush_layers: layer 2's `checkpoints` must have layer 0's shape"):
        torch.ops.replayssm.mamba2_flush_layers(table, *bad, None, -1)
    bad = [list(t) for t in lists]
    bad[3] = bad[3][:2]
    with pytest.raises(ValueError, match=r"mamba2_flush_layers: `x_bufs` must hold one tensor per layer \(3\), got 2"):
        torch.ops.replayssm.mamba2_flush_layers(table, *bad, None, -1)
    with pytest.raises(ValueError, match=r"LayerCaches.load: `states` must be a \(layers = 3, batch, \.\.\.\) tensor"):
        LayerCaches(model).load(torch.zeros(2, 1, 6, 5, 4))


def test_gdn_layer_ops_name_the_layer_and_the_list():
    model = make_fold_model("gdn", GDN_KINDS[0], 3, S)
    table, *lists = layer_op_args(LayerCaches(model))
    bad = [list(t) for t in lists]
    bad[3][1] = bad[3][1][:, :, :4]
    with pytest.raises(ValueError, match=r"gdn_flush_layers: layer 1's `k_bufs` must have layer 0's shape"):
        torch.ops.replayssm.gdn_flush_layers(table, *bad, True, None, -1)
    bad = [list(t) for t in lists]
    bad[7] = bad[7][:1]
    with pytest.raises(ValueError, match=r"gdn_commit_layers: `u_bufs` must hold one tensor per layer \(3\), got 1"):
        torch.ops.replayssm.gdn_commit_layers(table, *bad, torch.ones(2, dtype=torch.int32), 2, True, None, -1)
    with pytest.raises(ValueError, match=r"gdn_materialize_layers: `out` must have shape"):
        torch.ops.replayssm.gdn_materialize_layers(table, *lists, torch.empty(2, S, 4, 6, 8), True, None, -1)
