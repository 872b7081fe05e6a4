"""Speculative decoding: verify T drafts, commit a random number of them, repeat. The outputs of the
accepted tokens and the materialized state equal the conventional recurrence over the accepted stream."""

import pytest
import torch

from families import FAMILY_NAMES, family, random_states, rel_err


def spec_rounds(fam, cache, rounds, T, batch, slots, states, gen, tol):
    for _ in range(rounds):
        inputs = fam.inputs(batch, T)
        ckpt_before = cache.checkpoint.clone()
        copy_before = None if cache.read_copy is None else cache.read_copy.view(torch.uint8).clone()
        cursors_before = cache.num_committed.clone()
        y = cache.verify(*inputs, slots=slots)
        # verify never writes the checkpoint, the read copy or the cursors
        assert torch.equal(cache.checkpoint, ckpt_before)
        assert torch.equal(cache.num_committed, cursors_before)
        if copy_before is not None:
            assert torch.equal(cache.read_copy.view(torch.uint8), copy_before)
        accepted = torch.randint(0, T + 1, (batch,), generator=gen, dtype=torch.int32)
        for r in range(batch):
            for t in range(int(accepted[r])):
                y_ref = fam.oracle_step(states[int(slots[r])], fam.token(inputs, r, t))
                assert rel_err(y[r, t], y_ref) < tol
        cache.commit(accepted, slots=slots)
        L, Tmax = cache.buffer_len, cache.max_draft_tokens
        assert bool((cache.num_committed + Tmax <= L).all()), "flush-early rule: the next verify must fit"
    materialized = cache.materialize(slots=slots)
    for r in range(batch):
        assert rel_err(materialized[r], states[int(slots[r])]) < tol


# L = T = 4 folds at every commit on purpose (the edge of the flush-early rule): the cache's warning
# that such a buffer saves nothing is expected there.
@pytest.mark.filterwarnings("ignore:.*buffer_len == max_draft_tokens:UserWarning")
@pytest.mark.parametrize("name", FAMILY_NAMES)
@pytest.mark.parametrize("buffer_len,T", [(16, 4), (5, 3), (4, 4)])
def test_verify_commit_random_acceptance_fp64(name, buffer_len, T):
    fam = family(name, seed=buffer_len * 10 + T)
    cache = fam.make_cache(4, buffer_len=buffer_len, max_draft_tokens=T)
    init = random_states(fam, 4)
    cache.load(init)
    states = [init[s].clone() for s in range(4)]
    spec_rounds(fam, cache, 50, T, 3, torch.tensor([1, 3, 0]), states, torch.Generator().manual_seed(1), 1e-12)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_verify_commit_with_read_copy(name):
    """bf16 read copy: outputs within bf16 read error; the checkpoint stays exact (fp32 level)."""
    fam = family(name, dtype=torch.float32, seed=11)
    cache = fam.make_cache(3, buffer_len=8, max_draft_tokens=4, read_copy_dtype=torch.bfloat16)
    init = random_states(fam, 3).float()
    cache.load(init)
    states = [init[s].double() for s in range(3)]
    spec_rounds(fam, cache, 50, 4, 2, torch.tensor([2, 0]), states, torch.Generator().manual_seed(2), 2e-2)
    cache.flush()
    for s in (0, 2):
        assert rel_err(cache.checkpoint[s], states[s]) < 2e-5   # folds recompute from the full-precision checkpoint


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_step_and_verify_interleave(name):
    """Plain steps and spec rounds can alternate on the same cache."""
    fam = family(name, seed=5)
    cache = fam.make_cache(2, buffer_len=6, max_draft_tokens=3)
    states = [torch.zeros(fam.state_shape, dtype=torch.float64) for _ in range(2)]
    slots = torch.tensor([1, 0])
    gen = torch.Generator().manual_seed(3)
    for round_ in range(12):
        if round_ % 3 == 0:
            inputs = fam.inputs(2)
            y = cache.step(*inputs, slots=slots)
            for r in range(2):
                assert rel_err(y[r], fam.oracle_step(states[int(slots[r])], fam.token(inputs, r))) < 1e-12
        else:
            spec_rounds(fam, cache, 1, 3, 2, slots, states, gen, 1e-12)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_commit_zero_and_full(name):
    """Accepting nothing leaves the state where it was; accepting all T equals T steps."""
    fam = family(name, seed=9)
    a = fam.make_cache(1, buffer_len=8, max_draft_tokens=4)
    b = fam.make_cache(1, buffer_len=8, max_draft_tokens=4)
    init = random_states(fam, 1)
    a.load(init)
    b.load(init)
    inputs = fam.inputs(1, 4)
    a.verify(*inputs)
    a.commit(torch.zeros(1, dtype=torch.int32))
    assert int(a.num_committed[0]) == 0
    assert rel_err(a.materialize(), init) < 1e-14
    a.verify(*inputs)
    a.commit(torch.full((1,), 4, dtype=torch.int32))
    for t in range(4):
        b.step(*(v[:, t] for v in inputs))
    assert rel_err(a.materialize(), b.materialize()) < 1e-13


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_bf16_activations_with_fp32_checkpoint(name):
    """The serving configuration: bf16 activations and buffers, fp32 checkpoint and fp32 buffer scalars.
    Outputs stay at bf16-input precision against the fp64 recurrence fed the same bf16 inputs."""
    fam = family(name, dtype=torch.float32, act_dtype=torch.bfloat16, seed=13)
    cache = fam.make_cache(3, buffer_len=6, max_draft_tokens=2, read_copy_dtype=torch.bfloat16)
    assert (cache.dt_buf if name == "mamba2" else cache.u_buf).dtype == torch.float32
    init = random_states(fam, 3).float()
    cache.load(init)
    states = [init[s].double() for s in range(3)]
    spec_rounds(fam, cache, 20, 2, 2, torch.tensor([2, 0]), states, torch.Generator().manual_seed(4), 3e-2)
