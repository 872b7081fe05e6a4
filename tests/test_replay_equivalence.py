"""Replay == the conventional recurrence: outputs and materialized states, over several full buffer
cycles, for every family and buffer length, against the independent fp64 loops in oracle.py."""

import pytest
import torch

from families import FAMILY_NAMES, family, random_states, rel_err
from replayssm_cuda import reference


def run_decode(fam, cache, steps, batch, slots, states, check_every=1):
    """Decode `steps` tokens through cache.step and the oracle side by side; return the worst
    relative output error and the materialized-state error at the end."""
    worst = 0.0
    for step in range(steps):
        inputs = fam.inputs(batch)
        y = cache.step(*inputs, slots=slots)
        for r in range(batch):
            y_ref = fam.oracle_step(states[int(slots[r])], fam.token(inputs, r))
            if step % check_every == 0:
                worst = max(worst, rel_err(y[r], y_ref))
    materialized = cache.materialize(slots=slots)
    state_err = max(rel_err(materialized[r], states[int(slots[r])]) for r in range(batch))
    return worst, state_err


@pytest.mark.parametrize("name", FAMILY_NAMES)
@pytest.mark.parametrize("buffer_len", [1, 2, 5, 16])
def test_step_equals_conventional_fp64(name, buffer_len):
    """fp64 cache: the replay algebra itself, to 1e-12, over 3 full cycles plus a partial one."""
    fam = family(name, seed=buffer_len)
    cache = fam.make_cache(5, buffer_len=buffer_len)
    init = random_states(fam, 5)
    cache.load(init.to(cache.checkpoint.dtype))
    states = [init[s].clone() for s in range(5)]
    slots = torch.tensor([3, 0, 4])
    out_err, state_err = run_decode(fam, cache, 3 * buffer_len + 2, 3, slots, states)
    assert out_err < 1e-12 and state_err < 1e-12, (out_err, state_err)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_buffer_len_64_fp64(name):
    """L = 64 (Mamba-2's largest; the delta rule's functional ops accept it too), 3 cycles."""
    fam = family(name, seed=64)
    if name == "mamba2":
        cache = fam.make_cache(2, buffer_len=64)
        states = [torch.zeros(fam.state_shape, dtype=torch.float64) for _ in range(2)]
        out_err, state_err = run_decode(fam, cache, 3 * 64 + 1, 2, torch.tensor([1, 0]), states, check_every=7)
        assert out_err < 1e-12 and state_err < 1e-12
        return
    # GDN/KDA caches cap L at 16; drive the functional reference with a 64-entry buffer directly.
    S, L = 2, 64
    ck = torch.zeros(S, *fam.state_shape, dtype=torch.float64)
    k_buf = torch.zeros(S, fam.H, L, fam.K, dtype=torch.float64)
    v_buf = torch.zeros(S, fam.HV, L, fam.V, dtype=torch.float64)
    g_buf = torch.zeros((S, fam.HV, L, fam.K) if fam.kda else (S, fam.HV, L), dtype=torch.float64)
    beta_buf = torch.zeros(S, fam.HV, L, dtype=torch.float64)
    u_buf = torch.zeros(S, fam.HV, L, fam.V, dtype=torch.float64)
    nc = torch.zeros(S, dtype=torch.int32)
    states = [torch.zeros(fam.state_shape, dtype=torch.float64) for _ in range(S)]
    w = fam.weights
    worst = 0.0
    for step in range(3 * L + 1):
        q, k, v, a, b = fam.inputs(S)
        out = torch.empty_like(v)
        reference.delta_step(ck, None, None, k_buf, v_buf, g_buf, beta_buf, u_buf, nc, q, k, v, a, b,
                             w.A_log, w.dt_bias, out, None, True, 1, None, -1)
        for r in range(S):
            worst = max(worst, rel_err(out[r], fam.oracle_step(states[r], fam.token((q, k, v, a, b), r))))
    assert nc.tolist() == [1, 1]
    assert worst < 1e-12


@pytest.mark.parametrize("name", FAMILY_NAMES)
@pytest.mark.parametrize("buffer_len", [1, 5, 16])
def test_step_fp32_checkpoint_at_rounding_level(name, buffer_len):
    """fp32 checkpoint, no read copy: error at fp32 rounding level vs the fp64 oracle."""
    fam = family(name, dtype=torch.float32, seed=100 + buffer_len)
    cache = fam.make_cache(4, buffer_len=buffer_len)
    init = random_states(fam, 4)
    cache.load(init.float())
    states = [init[s].float().double() for s in range(4)]
    out_err, state_err = run_decode(fam, cache, 3 * buffer_len + 3, 4, torch.arange(4), states)
    assert out_err < 2e-5 and state_err < 2e-5, (out_err, state_err)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_buffer_len_1_is_the_conventional_update(name):
    """L = 1: the cache's step is the conventional update, bit for bit."""
    fam = family(name, dtype=torch.float32, seed=7)
    cache = fam.make_cache(3, buffer_len=1)
    state = random_states(fam, 3).float()
    cache.load(state.clone())
    slots = torch.tensor([2, 1])
    update = getattr(reference, "mamba2_update" if name == "mamba2" else "delta_update")
    w = fam.weights
    for _ in range(4):
        inputs = fam.inputs(2)
        y = cache.step(*inputs, slots=slots)
        out = torch.empty_like(y)
        if name == "mamba2":
            x, dt, B, C, z = inputs
            update(state, x, dt, w.A, B, C, out, w.D, z, w.dt_bias, w.dt_softplus, slots, -1)
        else:
            update(state, *inputs, w.A_log, w.dt_bias, out, None, True, slots, -1)
        assert torch.equal(y, out)
        assert torch.equal(cache.checkpoint, state)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_odd_shapes(name):
    """Batch 1, heads per group 3 (Mamba-2: H=6, G=2, P=80), v-heads per k-head 3 (delta rule)."""
    if name == "mamba2":
        fam = family(name, heads=6, head_dim=80, state_dim=16, groups=2, dtype=torch.float32, seed=3)
    else:
        fam = family(name, heads=1, v_heads=3, head_k_dim=16, head_v_dim=12, dtype=torch.float32, seed=3)
    cache = fam.make_cache(3, buffer_len=5)
    states = [torch.zeros(fam.state_shape, dtype=torch.float64) for _ in range(3)]
    out_err, state_err = run_decode(fam, cache, 12, 1, torch.tensor([2]), states)
    assert out_err < 2e-5 and state_err < 2e-5
    assert int(cache.num_committed[2]) == 12 % 5


def test_mamba2_update_snapshots_is_token_by_token_update():
    """The conventional speculative baseline: snapshot t is the state after t+1 sequential updates,
    the state itself is untouched, pad rows get zeros."""
    from replayssm_cuda import ops
    fam = family("mamba2", dtype=torch.float32, seed=17)
    w = fam.weights
    state = random_states(fam, 4).float()
    before = state.clone()
    slots = torch.tensor([3, -1, 1])
    x, dt, B, C, z = fam.inputs(3, 4)
    out = torch.empty_like(x)
    snaps = torch.full((3, 4, *fam.state_shape), float("nan"))
    ops.mamba2_update_snapshots(state, x, dt, w.A, B, C, out, snaps, w.D, z, w.dt_bias, True, slots)
    assert torch.equal(state, before)
    assert torch.count_nonzero(out[1]) == 0 and torch.count_nonzero(snaps[1]) == 0
    walk = before.clone()
    for t in range(4):
        y = torch.empty_like(x[:, t])
        ops.mamba2_update(walk, x[:, t], dt[:, t], w.A, B[:, t], C[:, t], y, w.D, z[:, t], w.dt_bias, True, slots)
        for r, s in ((0, 3), (2, 1)):
            assert rel_err(snaps[r, t], walk[s]) < 1e-6 and rel_err(out[r, t], y[r]) < 1e-6
    states = [before[s].double() for s in range(4)]
    for t in range(4):
        for r, s in ((0, 3), (2, 1)):
            y_ref = fam.oracle_step(states[s], fam.token((x, dt, B, C, z), r, t))
            assert rel_err(out[r, t], y_ref) < 2e-5 and rel_err(snaps[r, t], states[s]) < 2e-5


@pytest.mark.parametrize("name", ["gdn", "kda"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_delta_update_snapshots_is_token_by_token_update(name, state_dtype):
    """GDN / KDA's conventional speculative baseline: snapshot t is the state after t+1 sequential
    updates, rounded to the state dtype after every token (the next token starts from the rounded
    value), the state itself is untouched, pad rows get zeros."""
    from replayssm_cuda import ops
    fam = family(name, dtype=torch.float32, seed=19)
    w = fam.weights
    state = random_states(fam, 4).to(state_dtype)
    before = state.clone()
    slots = torch.tensor([3, -1, 1])
    q, k, v, a, b = fam.inputs(3, 4)
    out = torch.empty_like(v)
    snaps = torch.full((3, 4, *fam.state_shape), float("nan"), dtype=state_dtype)
    run = getattr(ops, f"{name}_update_snapshots")
    run(state, q, k, v, a, b, w.A_log, w.dt_bias, out, snaps, None, True, slots)
    assert torch.equal(state, before)
    assert torch.count_nonzero(out[1]) == 0 and torch.count_nonzero(snaps[1]) == 0
    walk = before.clone()
    update = getattr(ops, f"{name}_update")
    for t in range(4):
        y = torch.empty_like(v[:, t])
        update(walk, q[:, t], k[:, t], v[:, t], a[:, t], b[:, t], w.A_log, w.dt_bias, y, None, True, slots)
        for r, s in ((0, 3), (2, 1)):
            assert torch.equal(snaps[r, t], walk[s]) and torch.equal(out[r, t], y[r]), (t, r)
