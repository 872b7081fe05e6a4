"""LayerCaches (the slot management of all layers of a model in one launch) on the CPU: its calls equal
the loop over the layers' own methods, for Mamba-2, GDN and KDA caches with mixed checkpoint and
read-copy dtypes and staggered cursors; the table ops' reference with LayerCaches' fill entries equals
that loop too (what the compiled one-launch path runs on CUDA); bad input names the argument."""

import pytest
import torch

from families import family
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
