"""Commit is safe by construction (reference path, every family): each slot records how many entries its
last verify appended (num_verified), and commit accepts num_accepted clamped to [0, that count], then
zeroes it. A count larger than the drafts, a negative count or a second commit without a verify never
accepts a buffer entry that no verify wrote."""

import pytest
import torch

from families import FAMILY_NAMES, family, random_states, rel_err
from replayssm_cuda import ops


def loaded_pair(name, num_slots=3, buffer_len=8, max_draft_tokens=4, seed=0):
    """Two reference caches of one family holding the same random states."""
    fam = family(name, seed=seed)
    caches = [fam.make_cache(num_slots, buffer_len=buffer_len, max_draft_tokens=max_draft_tokens) for _ in range(2)]
    init = random_states(fam, num_slots)
    for c in caches:
        c.load(init)
    return fam, caches


def counts(*values):
    return torch.tensor(values, dtype=torch.int32)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_num_accepted_beyond_the_drafts_accepts_the_drafts(name):
    """5 after a verify of T = 3 commits the 3 drafts, exactly as commit(3) does."""
    fam, (a, b) = loaded_pair(name, seed=1)
    inputs = fam.inputs(2, 3)
    slots = torch.tensor([2, 0])
    for cache, accepted in ((a, counts(5, 16)), (b, counts(3, 3))):
        cache.verify(*inputs, slots=slots)
        assert cache.num_verified.tolist() == [3, 0, 3]
        cache.commit(accepted, slots=slots)
        assert cache.num_verified.tolist() == [0, 0, 0], "commit consumes the verify"
    assert a.num_committed.tolist() == b.num_committed.tolist() == [3, 0, 3]
    assert torch.equal(a.materialize(), b.materialize())


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_num_accepted_beyond_the_drafts_does_not_fold(name):
    """L = 8, max_draft_tokens = 3, cursor 2, T = 3: accepting 6 would fill the buffer and fold; the 3
    drafts leave the cursor at 5, where the next verify of 3 still fits."""
    fam, (a, b) = loaded_pair(name, num_slots=1, buffer_len=8, max_draft_tokens=3, seed=2)
    first = fam.inputs(1, 2)
    for cache in (a, b):
        cache.verify(*first)
        cache.commit(counts(2))
    inputs = fam.inputs(1, 3)
    checkpoint = a.checkpoint.clone()
    a.verify(*inputs)
    a.commit(counts(6))
    b.verify(*inputs)
    b.commit(counts(3))
    assert a.num_committed.tolist() == [5]
    assert torch.equal(a.checkpoint, checkpoint), "no fold: the clamped count leaves room for the next verify"
    assert torch.equal(a.materialize(), b.materialize())


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_negative_num_accepted_accepts_nothing(name):
    fam, (a, _) = loaded_pair(name, seed=3)
    before = a.materialize()
    a.verify(*fam.inputs(3, 4))
    a.commit(counts(-1, -5, -(2**31)))
    assert a.num_committed.tolist() == [0, 0, 0]
    assert a.num_verified.tolist() == [0, 0, 0]
    assert torch.equal(a.materialize(), before)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_second_commit_without_verify_accepts_nothing(name):
    """verify(3), commit(1), commit(2): the second commit finds nothing verified; the state is commit(1)'s."""
    fam, (a, b) = loaded_pair(name, seed=4)
    inputs = fam.inputs(3, 3)
    for cache in (a, b):
        cache.verify(*inputs)
        cache.commit(counts(1, 1, 1))
    a.commit(counts(2, 2, 2))
    a.commit(torch.full((3,), 3, dtype=torch.int64))
    assert a.num_committed.tolist() == b.num_committed.tolist() == [1, 1, 1]
    assert torch.equal(a.materialize(), b.materialize())


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_commit_before_any_verify_accepts_nothing(name):
    fam, (a, _) = loaded_pair(name, seed=5)
    before = a.materialize()
    a.commit(counts(4, 4, 4))
    assert a.num_committed.tolist() == [0, 0, 0]
    assert torch.equal(a.materialize(), before)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_verify_records_its_appended_entries_per_slot(name):
    """Named rows record T; a row whose cursor leaves no room records 0 (it appended nothing); pad and
    out-of-range rows write nothing; a commit of only some slots consumes only theirs."""
    fam = family(name, seed=6)
    cache = fam.make_cache(4, buffer_len=6, max_draft_tokens=2)
    cache.num_verified.fill_(7)                # stale counts where no row of the verify lands
    cache.num_committed[3] = 5                 # 5 + 2 > 6: no room for 2 drafts
    cache.verify(*fam.inputs(4, 2), slots=torch.tensor([3, -1, 0, 9]))
    assert cache.num_verified.tolist() == [2, 7, 7, 0]
    cache.commit(counts(2, 2), slots=torch.tensor([0, -1]))
    assert cache.num_verified.tolist() == [0, 7, 7, 0]
    assert cache.num_committed.tolist() == [2, 0, 0, 5]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_load_reset_and_copy_slots_keep_the_counts_consistent(name):
    """load and reset leave no verify pending; copy_slots copies a pending one with its buffer."""
    fam, (a, b) = loaded_pair(name, num_slots=4, seed=7)
    inputs = fam.inputs(4, 3)
    a.verify(*inputs)
    a.copy_slots(torch.tensor([1]), torch.tensor([3]))
    assert a.num_verified.tolist() == [3, 3, 3, 3]
    a.reset(torch.tensor([0]))
    a.load(random_states(fam, 1), slots=torch.tensor([2]))
    assert a.num_verified.tolist() == [0, 3, 0, 3]
    c = fam.make_cache(4, buffer_len=8, max_draft_tokens=4)
    c.num_verified.fill_(2)
    c.load(random_states(fam, 2))                     # rows 0, 1 -> slots 0, 1 only
    assert c.num_verified.tolist() == [0, 0, 2, 2]
    a.commit(counts(3, 3, 3, 3))
    assert a.num_committed.tolist() == [0, 3, 0, 3]
    b.verify(*inputs)
    b.commit(counts(0, 3, 0, 0))
    assert rel_err(a.materialize(torch.tensor([3])), b.materialize(torch.tensor([1]))) == 0
    sizes = a.bytes_per_slot()
    assert sizes["num_verified"] == 4 and sizes["total"] == sum(v for k, v in sizes.items() if k != "total")


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_functional_ops_take_num_verified(name):
    """The functional ops (and torch.ops.replayssm.*, whose CPU kernel is the reference) clamp the same
    way: a count larger than the drafts accepts the drafts."""
    fam, (cache, _) = loaded_pair(name, num_slots=2, seed=8)
    inputs = fam.inputs(2, 2)
    num_verified = torch.zeros(2, dtype=torch.int32)
    args = cache._cache_args()
    w = cache.weights
    if name == "mamba2":
        x, dt, B, C, z = inputs
        torch.ops.replayssm.mamba2_verify(*args, num_verified, x, dt, w.A, B, C, torch.empty_like(x), w.D, z,
                                          w.dt_bias, True, None, -1)
        assert num_verified.tolist() == [2, 2]
        ops.mamba2_commit(*args, num_verified, counts(9, -3), w.A, cache.max_draft_tokens, backend="reference")
    else:
        q, k, v, a, b = inputs
        getattr(torch.ops.replayssm, f"{name}_verify")(*args, num_verified, q, k, v, a, b, w.A_log, w.dt_bias,
                                                      torch.empty_like(v), None, True, None, -1)
        assert num_verified.tolist() == [2, 2]
        getattr(ops, f"{name}_commit")(*args, num_verified, counts(9, -3), cache.max_draft_tokens, True,
                                       backend="reference")
    assert cache.num_committed.tolist() == [2, 0]
    assert num_verified.tolist() == [0, 0]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_num_verified_is_checked(name):
    fam, (cache, _) = loaded_pair(name, num_slots=2, seed=9)
    args = cache._cache_args()
    commit = getattr(ops, f"{name}_commit")
    extra = (cache.weights.A,) if name == "mamba2" else ()
    tail = (2,) if name == "mamba2" else (2, True)
    with pytest.raises(TypeError, match=rf"{name}_commit: `num_verified` must have dtype in \{{int32\}}, got int64"):
        commit(*args, torch.zeros(2, dtype=torch.int64), counts(1, 1), *extra, *tail, backend="reference")
    with pytest.raises(ValueError, match=rf"{name}_commit: `num_verified` must have shape \(2\), got \(3,\)"):
        commit(*args, torch.zeros(3, dtype=torch.int32), counts(1, 1), *extra, *tail, backend="reference")
    with pytest.raises(ValueError, match=rf"{name}_commit: `num_verified` must not share memory with num_committed"):
        commit(*args, cache.num_committed, counts(1, 1), *extra, *tail, backend="reference")


# ---- the error word: misuse is recorded on the device and raised by check() ----------------------

@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_check_names_the_op_row_and_value(name):
    fam, (cache, _) = loaded_pair(name, num_slots=4, seed=10)
    cache.check()                                            # nothing recorded
    cache.verify(*fam.inputs(2, 3), slots=torch.tensor([0, 1]))
    cache.commit(counts(3, 5), slots=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=rf"{name}_commit row 1: num_accepted = 5 is outside \[0, 3\] \(the entries "
                                         r"the slot's last verify appended\); it was clamped"):
        cache.check()
    cache.check()                                            # check() cleared it
    assert cache.num_committed.tolist() == [3, 3, 0, 0]
    cache.commit(counts(-2), slots=torch.tensor([2]))
    with pytest.raises(ValueError, match=rf"{name}_commit row 0: num_accepted = -2 is outside \[0, 0\]"):
        cache.check()
    cache.commit(counts(0, 1), slots=torch.tensor([0, 1]))   # no verify since the last commit
    with pytest.raises(ValueError, match=rf"{name}_commit row 1: num_accepted = 1 is outside \[0, 0\]"):
        cache.check()


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_check_reports_slot_ids_out_of_range(name):
    """A slot id neither in [0, num_slots) nor the pad id is recorded (the row still acts as a pad); the
    pad id is not; the first violation wins until check() clears it."""
    fam, (cache, _) = loaded_pair(name, num_slots=4, seed=11)
    cache.verify(*fam.inputs(3, 2), slots=torch.tensor([0, -1, 2]))
    cache.commit(counts(2, 2, 2), slots=torch.tensor([0, -1, 2]))
    cache.check()
    cache.verify(*fam.inputs(3, 2), slots=torch.tensor([0, 4, -7]))
    cache.commit(counts(9, 0, 0), slots=torch.tensor([0, 1, 2]))      # a later violation: not recorded
    with pytest.raises(ValueError, match=rf"{name}_verify row 1: slot id 4 is neither in \[0, num_slots=4\) nor "
                                         r"pad_slot_id=-1; the row was treated as a pad"):
        cache.check()
    cache.commit(counts(0, 0), slots=torch.tensor([1, -3]))
    with pytest.raises(ValueError, match=rf"{name}_commit row 1: slot id -3 is neither in \[0, num_slots=4\)"):
        cache.check()


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_validate_checks_after_every_op(name):
    """validate=True raises at the op that misused the cache (after it ran, clamped); correct use never
    raises."""
    fam = family(name, seed=12)
    cache = fam.make_cache(3, buffer_len=8, max_draft_tokens=4, validate=True)
    cache.load(random_states(fam, 3))
    gen = torch.Generator().manual_seed(3)
    for _ in range(10):
        T = int(torch.randint(1, 5, (1,), generator=gen))
        cache.verify(*fam.inputs(3, T))
        cache.commit(torch.randint(0, T + 1, (3,), generator=gen, dtype=torch.int32))
    cache.step(*fam.inputs(3))
    cache.flush()
    cache.verify(*fam.inputs(3, 2))
    with pytest.raises(ValueError, match=rf"{name}_commit row 2: num_accepted = 3 is outside \[0, 2\]"):
        cache.commit(counts(2, 2, 3))
    assert cache.num_committed.tolist() == [2, 2, 2]
    with pytest.raises(ValueError, match=r"`validate` must be a bool, got 1"):
        fam.make_cache(3, validate=1)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_error_word_is_checked(name):
    fam, (cache, _) = loaded_pair(name, num_slots=2, seed=13)
    commit = getattr(ops, f"{name}_commit")
    extra = (cache.weights.A,) if name == "mamba2" else ()
    tail = (2, None, -1, None) if name == "mamba2" else (2, True, None, -1)
    with pytest.raises(TypeError, match=rf"{name}_commit: `error_word` must have dtype in \{{int32\}}, got int64"):
        commit(*cache._spec_cache_args(), counts(1, 1), *extra, *tail, torch.zeros(4, dtype=torch.int64),
               backend="reference")
    with pytest.raises(ValueError, match=rf"{name}_commit: `error_word` must have shape \(4\), got \(3,\)"):
        commit(*cache._spec_cache_args(), counts(1, 1), *extra, *tail, torch.zeros(3, dtype=torch.int32),
               backend="reference")
