"""Slots, pad rows, strided pools and the cache-management ops (load, reset, copy_slots, flush,
materialize, memory accounting)."""

import pytest
import torch

from families import FAMILY_NAMES, family, random_states, rel_err


def snapshot(cache):
    return [t.view(torch.uint8).clone() if t.dtype == torch.float8_e4m3fn else t.clone() for t in cache.cache_tensors]


def slot_bits(cache, tensors, slot):
    return [t[slot] for t in tensors]


@pytest.mark.parametrize("name", FAMILY_NAMES)
@pytest.mark.parametrize("pad_slot_id", [-1, 0])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_pad_rows_and_unnamed_slots_untouched(name, pad_slot_id, index_dtype):
    fam = family(name, dtype=torch.float32, seed=21)
    cache = fam.make_cache(6, buffer_len=4, max_draft_tokens=2, read_copy_dtype=torch.float8_e4m3fn,
                           pad_slot_id=pad_slot_id)
    cache.load(random_states(fam, 6).float())
    for _ in range(3):                                   # give every slot a non-trivial buffer
        cache.step(*fam.inputs(6), slots=torch.arange(6, dtype=index_dtype))
    named = [2, 5]                                        # slot 0 is the pad id when pad_slot_id == 0
    slots = torch.tensor([2, pad_slot_id, 5, 99], dtype=index_dtype)   # 99: out of range, must be ignored
    before = snapshot(cache)
    for call in range(6):
        if call % 2 == 0:
            y = cache.step(*fam.inputs(4), slots=slots)
            assert torch.count_nonzero(y[[1, 3]]) == 0, "pad and out-of-range rows get zero output"
        else:
            y = cache.verify(*fam.inputs(4, 2), slots=slots)
            assert torch.count_nonzero(y[[1, 3]]) == 0
            cache.commit(torch.tensor([1, 2, 2, 2], dtype=torch.int32), slots=slots)
    after = snapshot(cache)
    for s in range(6):
        if s in named:
            continue
        for t_before, t_after in zip(slot_bits(cache, before, s), slot_bits(cache, after, s)):
            assert torch.equal(t_before, t_after), f"slot {s} was touched"
    assert any(not torch.equal(a, b) for a, b in zip(slot_bits(cache, before, 2), slot_bits(cache, after, 2)))


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_materialize_flush_load_reset(name):
    fam = family(name, seed=31)
    cache = fam.make_cache(4, buffer_len=8)
    init = random_states(fam, 4)
    cache.load(init)
    states = [init[s].clone() for s in range(4)]
    slots = torch.tensor([0, 2, 3])
    for _ in range(5):
        inputs = fam.inputs(3)
        cache.step(*inputs, slots=slots)
        for r in range(3):
            fam.oracle_step(states[int(slots[r])], fam.token(inputs, r))
    before = snapshot(cache)
    m = cache.materialize(slots=slots)
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(cache))), "materialize changes nothing"
    for r in range(3):
        assert rel_err(m[r], states[int(slots[r])]) < 1e-12
    cache.flush(slots=torch.tensor([2]))
    assert cache.num_committed.tolist() == [5, 0, 0, 5]
    assert rel_err(cache.checkpoint[2], states[2]) < 1e-12
    assert rel_err(cache.materialize(slots=slots), m) < 1e-12, "flush does not change the materialized state"
    cache.flush()
    assert cache.num_committed.tolist() == [0, 0, 0, 0]
    cache.reset(slots=torch.tensor([3]))
    assert torch.count_nonzero(cache.checkpoint[3]) == 0 and int(cache.num_committed[3]) == 0
    assert rel_err(cache.checkpoint[0], states[0]) < 1e-12


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_copy_slots_carries_buffer_and_cursor(name):
    """Fork a sequence mid-window: both copies then decode identically to the original."""
    fam = family(name, seed=41)
    cache = fam.make_cache(4, buffer_len=8, read_copy_dtype=torch.bfloat16, checkpoint_dtype=torch.float32)
    cache.load(random_states(fam, 4).float())
    for _ in range(3):
        cache.step(*fam.inputs(1), slots=torch.tensor([1]))
    cache.copy_slots(torch.tensor([1]), torch.tensor([3]))
    assert int(cache.num_committed[3]) == 3
    inputs = fam.inputs(1)
    both = tuple(torch.cat([v, v]) for v in inputs)
    y = cache.step(*both, slots=torch.tensor([1, 3]))
    # The same math on the same data; the CPU reference's batched reductions may round a row
    # differently by ~1 ulp depending on its position in the batch, hence 1e-13 rather than bitwise.
    assert rel_err(y[0], y[1]) < 1e-13
    assert rel_err(cache.materialize(slots=torch.tensor([1])), cache.materialize(slots=torch.tensor([3]))) < 1e-13


def test_copy_slots_skips_pad_and_out_of_range_pairs_and_gathers():
    """A pair naming pad_slot_id or a slot outside the pool is skipped; overlapping pairs read every
    source before writing (a 1 -> 2 -> 3 -> 1 cycle rotates the slots)."""
    from replayssm_cuda import reference
    t = torch.arange(5 * 3, dtype=torch.float32).reshape(5, 3)
    orig = t.clone()
    reference.copy_slots([t, None], torch.tensor([1, 2, 3, 0, -1, 7]), torch.tensor([2, 3, 1, -1, 4, 0]))
    assert torch.equal(t[2], orig[1]) and torch.equal(t[3], orig[2]) and torch.equal(t[1], orig[3])
    assert torch.equal(t[0], orig[0]), "pair (0 -> pad) skipped"
    assert torch.equal(t[4], orig[4]), "pairs (pad -> 4) and (7 -> 0) skipped"
    u = orig.clone()
    reference.copy_slots([u], torch.tensor([0, 4]), torch.tensor([4, 0]), pad_slot_id=0)
    assert torch.equal(u, orig), "with pad_slot_id=0 both pairs name the pad slot"


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_strided_slot_pool(name):
    """The checkpoint may be a view into an engine's pool with a non-contiguous slot stride."""
    fam = family(name, seed=51, dtype=torch.float32)
    pool = torch.zeros(5, 3, *fam.state_shape)            # (slots, layers, ...): use layer 1
    view = pool[:, 1]
    assert not view.is_contiguous()
    cache = fam.make_cache(5, buffer_len=3, checkpoint=view)
    plain = fam.make_cache(5, buffer_len=3)
    init = random_states(fam, 5).float()
    cache.load(init)
    plain.load(init)
    for _ in range(7):
        inputs = fam.inputs(2)
        assert torch.equal(cache.step(*inputs, slots=torch.tensor([4, 1])), plain.step(*inputs, slots=torch.tensor([4, 1])))
    assert torch.equal(pool[:, 1], plain.checkpoint)
    assert torch.count_nonzero(pool[:, 0]) == 0 and torch.count_nonzero(pool[:, 2]) == 0


def test_bytes_per_slot():
    fam = family("mamba2", heads=96, head_dim=80, state_dim=128, groups=8, dtype=torch.float32)
    cache = fam.make_cache(1, buffer_len=16, read_copy_dtype=torch.float8_e4m3fn, activation_dtype=torch.bfloat16)
    sizes = cache.bytes_per_slot()
    assert sizes["checkpoint"] == 96 * 80 * 128 * 4
    assert sizes["read_copy"] == 96 * 80 * 128
    assert sizes["read_scale"] == 96 * 80 * 4
    assert sizes["x_buf"] == 96 * 16 * 80 * 2 and sizes["B_buf"] == 8 * 16 * 128 * 2 and sizes["dt_buf"] == 96 * 16 * 4
    assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total")
