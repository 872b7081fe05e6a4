"""Staggered flush: slots that start together fold at different steps, with unchanged outputs and states.

stagger_cursors starts slot s with s % period zero buffer entries. A zero entry is neutral (Mamba-2:
dt = 0; GDN/KDA: g = beta = 0 and k = 0), so the decode is still the conventional recurrence; only the
step at which each slot folds moves. These tests pin both halves of that claim on the reference path.
"""

import pytest
import torch

from families import FAMILY_NAMES, family, random_states, rel_err
from replayssm_cuda import ops
from test_replay_equivalence import run_decode
from test_spec_decoding import spec_rounds


@pytest.mark.parametrize("name", FAMILY_NAMES)
@pytest.mark.parametrize("buffer_len", [2, 5, 16])
def test_staggered_step_equals_conventional_fp64(name, buffer_len):
    fam = family(name, seed=100 + buffer_len)
    cache = fam.make_cache(6, buffer_len=buffer_len, staggered_flush=True)
    assert cache.num_committed.tolist() == [s % buffer_len for s in range(6)]
    init = random_states(fam, 6)
    cache.load(init)
    assert cache.num_committed.tolist() == [s % buffer_len for s in range(6)]
    states = [init[s].clone() for s in range(6)]
    out_err, state_err = run_decode(fam, cache, 3 * buffer_len + 2, 4, torch.tensor([5, 0, 3, 2]), states)
    assert out_err < 1e-12 and state_err < 1e-12, (out_err, state_err)


def test_folds_are_spread_over_the_cycle():
    """16 slots, L = 8, all decoding from step 0: lock-step folds all 16 slots in one step of 8;
    staggered folds exactly 2 per step, and every slot still folds once per 8 tokens."""
    fam = family("mamba2", seed=3)
    slots = torch.arange(16)
    for staggered, expected in [(False, [0] * 7 + [16]), (True, [2] * 8)]:
        cache = fam.make_cache(16, buffer_len=8, staggered_flush=staggered)
        folds_per_step = []
        for _ in range(16):
            before = cache.checkpoint.clone()
            cache.step(*fam.inputs(16), slots=slots)
            changed = (cache.checkpoint != before).flatten(1).any(1)
            folds_per_step.append(int(changed.sum()))
        assert folds_per_step[8:] == expected, (staggered, folds_per_step)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_staggered_spec_rounds_fp64(name):
    """verify/commit with max_draft_tokens = 4: period L - 3, so every slot's first verify still fits."""
    fam = family(name, seed=7)
    cache = fam.make_cache(5, buffer_len=8, max_draft_tokens=4, staggered_flush=True)
    assert cache.flush_period == 5
    assert cache.num_committed.tolist() == [0, 1, 2, 3, 4]
    init = random_states(fam, 5)
    cache.load(init)
    states = [init[s].clone() for s in range(5)]
    spec_rounds(fam, cache, 30, 4, 4, torch.tensor([4, 1, 3, 2]), states, torch.Generator().manual_seed(5), 1e-12)


def test_staggered_matches_lock_step_outputs_fp32():
    """fp32 checkpoint, bf16 read copy: staggered and lock-step caches give the same outputs to fp32 /
    read-copy rounding (they fold at different points, so they are not bitwise equal)."""
    fam = family("mamba2", dtype=torch.float32, seed=9)
    a = fam.make_cache(4, buffer_len=6, read_copy_dtype=torch.bfloat16)
    b = fam.make_cache(4, buffer_len=6, read_copy_dtype=torch.bfloat16, staggered_flush=True)
    init = random_states(fam, 4).float()
    a.load(init)
    b.load(init)
    slots = torch.tensor([0, 1, 2, 3])
    worst = 0.0
    for _ in range(20):
        inputs = fam.inputs(4)
        worst = max(worst, rel_err(a.step(*inputs, slots=slots), b.step(*inputs, slots=slots)))
    assert worst < 2e-2, worst
    assert rel_err(a.materialize(slots=slots), b.materialize(slots=slots)) < 1e-5


def test_load_and_reset_restagger_the_named_slots_only():
    fam = family("mamba2", seed=4)
    cache = fam.make_cache(8, buffer_len=4, staggered_flush=True, pad_slot_id=7)
    for _ in range(3):
        cache.step(*fam.inputs(8), slots=torch.arange(8))
    before = cache.num_committed.clone()
    x_before = cache.x_buf.clone()
    cache.reset(torch.tensor([1, 7, 6]))          # 7 is the pad id: skipped
    cache.load(random_states(fam, 2), torch.tensor([2, 7]))
    for s in range(8):
        if s in (1, 2, 6):
            assert int(cache.num_committed[s]) == s % 4
            assert not bool(cache.x_buf[s].any()) and not bool(cache.dt_buf[s].any())
        else:
            assert int(cache.num_committed[s]) == int(before[s])
            assert torch.equal(cache.x_buf[s], x_before[s])


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_load_without_slots_restaggers_the_loaded_rows_only(name):
    """load(states) without slots fills slots 0 .. batch - 1; the slots after them keep their cursors
    and buffered tokens (they may hold live sequences)."""
    fam = family(name, seed=5)
    cache = fam.make_cache(8, buffer_len=4, staggered_flush=True)
    for _ in range(3):
        cache.step(*fam.inputs(8), slots=torch.arange(8))
    before = [t.clone() for t in cache.cache_tensors]
    cache.load(random_states(fam, 3))
    assert cache.num_committed[:3].tolist() == [s % 4 for s in range(3)]
    for t, b in zip(cache.cache_tensors, before):
        assert torch.equal(t[3:], b[3:])


def test_stagger_cursors_errors():
    nc = torch.zeros(4, dtype=torch.int32)
    buf = torch.zeros(4, 2, 8, 3)
    with pytest.raises(ValueError, match=r"stagger_cursors: `period` must be an int in \[1, buffer_len=8\], got 9"):
        ops.stagger_cursors([buf], nc, 9)
    with pytest.raises(ValueError, match=r"stagger_cursors: `period` must be an int in \[1, buffer_len=8\], got 0"):
        ops.stagger_cursors([buf], nc, 0)
    with pytest.raises(ValueError, match=r"stagger_cursors: buffers\[0\] must be \(num_slots=4"):
        ops.stagger_cursors([torch.zeros(3, 2, 8)], nc, 2)
    with pytest.raises(TypeError, match=r"stagger_cursors: `num_committed` must have dtype in \{int32\}, got int64"):
        ops.stagger_cursors([buf], nc.long(), 2)
    fam = family("mamba2")
    with pytest.raises(ValueError, match="`staggered_flush` must be a bool, got 1"):
        fam.make_cache(2, staggered_flush=1)


# L = max_draft_tokens = 4 gives period 1 on purpose: the cache's warning that every step folds is expected.
@pytest.mark.filterwarnings("ignore:.*buffer_len == max_draft_tokens:UserWarning")
@pytest.mark.parametrize("buffer_len,max_draft_tokens", [(1, 1), (4, 4)])
def test_period_one_is_lock_step(buffer_len, max_draft_tokens):
    """A fold period of one token (L = 1: every step is the conventional update; or max_draft_tokens = L:
    every commit folds) leaves nothing to stagger: cursors start at 0 and the cache decodes as without it."""
    fam = family("mamba2", seed=12)
    a = fam.make_cache(5, buffer_len=buffer_len, max_draft_tokens=max_draft_tokens, staggered_flush=True)
    b = fam.make_cache(5, buffer_len=buffer_len, max_draft_tokens=max_draft_tokens)
    assert a.flush_period == 1 and a.num_committed.tolist() == [0] * 5
    init = random_states(fam, 5)
    a.load(init)
    b.load(init)
    slots = torch.tensor([4, 0, 2])
    for _ in range(6):
        inputs = fam.inputs(3)
        assert torch.equal(a.step(*inputs, slots=slots), b.step(*inputs, slots=slots))
    assert torch.equal(a.checkpoint, b.checkpoint) and torch.equal(a.num_committed, b.num_committed)
