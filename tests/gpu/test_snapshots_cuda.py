"""Compiled mamba2_update_snapshots (the conventional speculative baseline) against the fp64 reference on
nano4b (H=96 P=80 N=128 G=8), super120b (H=128 P=64 N=128 G=8) and odd dims (3 heads per group, N=64,
bf16 state with a partial tile pass); pad and out-of-range rows, the state left bit-identical, strided
pools, CUDA-graph replay == eager, and bad input naming the argument."""

import pytest
import torch

from replayssm_cuda import ops
from test_mamba2_cuda import rel_err

# (H, P, N, G)
NANO4B = (96, 80, 128, 8)
SUPER120B = (128, 64, 128, 8)
ODD = (24, 80, 64, 8)          # 3 heads per group; bf16 state: 32 rows a pass over P = 80
SMALL = (8, 128, 64, 2)


class Problem:
    """Random weights, state and T-token inputs of one Mamba-2 layer (CPU tensors)."""

    def __init__(self, dims, batch, T, act=torch.bfloat16, num_slots=7, seed=0):
        self.H, self.P, self.N, self.G = dims
        self.batch, self.T, self.act = batch, T, act
        g = torch.Generator().manual_seed(seed)
        H, P, N, G = dims
        self.A = -(0.5 + torch.rand(H, generator=g))
        self.D = torch.randn(H, generator=g)
        self.dt_bias = 0.1 * torch.randn(H, generator=g)
        self.state = 0.3 * torch.randn(num_slots, H, P, N, generator=g, dtype=torch.float64)
        self.x = torch.randn(batch, T, H, P, generator=g).to(act)
        self.dt = (0.5 * torch.randn(batch, T, H, generator=g)).to(act)
        self.B = torch.randn(batch, T, G, N, generator=g).to(act)
        self.C = torch.randn(batch, T, G, N, generator=g).to(act)
        self.z = torch.randn(batch, T, H, P, generator=g).to(act)

    def gpu_args(self, state):
        c = [t.cuda() for t in (self.x, self.dt, self.A, self.B, self.C)]
        x, dt, A, B, C = c
        return state, x, dt, A, B, C

    def run_cuda(self, state, slots, z=True, snapshots=None, out=None):
        state, x, dt, A, B, C = self.gpu_args(state)
        batch, T, H, P, N = self.batch, self.T, self.H, self.P, self.N
        if out is None:
            out = torch.full((batch, T, H, P), float("nan"), dtype=self.act, device="cuda")
        if snapshots is None:
            snapshots = torch.full((batch, T, H, P, N), float("nan"), dtype=state.dtype, device="cuda")
        ops.mamba2_update_snapshots(state, x, dt, A, B, C, out, snapshots, self.D.cuda(),
                                    self.z.cuda() if z else None, self.dt_bias.cuda(), True,
                                    None if slots is None else slots.cuda(), -1, backend="cuda")
        return out, snapshots

    def run_reference(self, state, slots, z=True):
        """fp64 reference from `state` as the GPU holds it (already rounded to its dtype)."""
        batch, T, H, P, N = self.batch, self.T, self.H, self.P, self.N
        out = torch.empty(batch, T, H, P, dtype=torch.float64)
        snapshots = torch.empty(batch, T, H, P, N, dtype=torch.float64)
        ops.mamba2_update_snapshots(state.double().cpu(), self.x.double(), self.dt.double(), self.A.double(),
                                    self.B.double(), self.C.double(), out, snapshots, self.D.double(),
                                    self.z.double() if z else None, self.dt_bias.double(), True, slots, -1,
                                    backend="reference")
        return out, snapshots


def bits(t):
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("dims", [NANO4B, SUPER120B, ODD, SMALL], ids=["nano4b", "super120b", "odd", "small"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
def test_snapshots_match_fp64_reference(dims, state_dtype, act):
    prob = Problem(dims, batch=5, T=4, act=act, seed=1)
    state = prob.state.to("cuda", state_dtype)
    before = bits(state).clone()
    slots = torch.tensor([4, -1, 0, 99, 2], dtype=torch.int32)   # a pad row and an out-of-range row
    out, snaps = prob.run_cuda(state, slots)
    ref_out, ref_snaps = prob.run_reference(state, slots)
    torch.cuda.synchronize()
    assert torch.equal(bits(state), before), "the state is read only"
    for pad in (1, 3):
        assert torch.count_nonzero(out[pad]) == 0 and torch.count_nonzero(snaps[pad]) == 0
    valid = [0, 2, 4]
    # fp32: rounding level; 16-bit states: the kernel rounds the state after every token (as T calls of
    # mamba2_update would), the fp64 reference does not.
    snap_tol = {torch.float32: 2e-6, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}[state_dtype]
    assert rel_err(snaps[valid], ref_snaps[valid]) < snap_tol
    out_tol = 1.5e-2 if state_dtype == torch.bfloat16 else 8e-3
    for t in range(prob.T):
        assert rel_err(out[valid, t], ref_out[valid, t]) < out_tol, f"token {t}"


@pytest.mark.parametrize("T", [1, 7, 16])
def test_token_counts_and_no_gate(T):
    prob = Problem(SUPER120B, batch=3, T=T, seed=2)
    state = prob.state.to("cuda", torch.float32)
    out, snaps = prob.run_cuda(state, None, z=False)
    ref_out, ref_snaps = prob.run_reference(state, None, z=False)
    assert rel_err(snaps, ref_snaps) < 4e-6
    assert rel_err(out, ref_out) < 8e-3


def test_last_snapshot_is_t_conventional_updates():
    """Token by token the op is mamba2_update: snapshot t equals the state after t+1 update calls."""
    prob = Problem(NANO4B, batch=4, T=4, seed=3, num_slots=4)
    state = prob.state.to("cuda", torch.float32)
    slots = torch.tensor([3, 1, 0, 2], dtype=torch.int64)
    out, snaps = prob.run_cuda(state, slots)
    work = state.clone()
    for t in range(prob.T):
        o = torch.empty(prob.batch, prob.H, prob.P, dtype=prob.act, device="cuda")
        torch.ops.replayssm.mamba2_update(work, prob.x[:, t].cuda(), prob.dt[:, t].cuda(), prob.A.cuda(),
                                          prob.B[:, t].cuda(), prob.C[:, t].cuda(), o, prob.D.cuda(),
                                          prob.z[:, t].cuda(), prob.dt_bias.cuda(), True, slots.cuda(), -1)
        assert rel_err(snaps[:, t], work[slots.cuda()]) < 1e-6
        assert rel_err(out[:, t], o) < 1e-2


def test_strided_pool_state():
    prob = Problem(SUPER120B, batch=2, T=3, seed=4, num_slots=5)
    pool = torch.zeros(5, 3, prob.H, prob.P, prob.N, device="cuda")
    pool[:, 1] = prob.state.to("cuda", torch.float32)
    view = pool[:, 1]
    slots = torch.tensor([4, 1], dtype=torch.int32)
    out_a, snaps_a = prob.run_cuda(view, slots)
    out_b, snaps_b = prob.run_cuda(view.contiguous(), slots)
    assert torch.equal(bits(out_a), bits(out_b)) and torch.equal(bits(snaps_a), bits(snaps_b))


def test_cuda_graph_replay_is_bitwise_eager():
    prob = Problem(NANO4B, batch=3, T=4, seed=5, num_slots=4)
    state = prob.state.to("cuda", torch.float32)
    slots = torch.tensor([2, -1, 0], dtype=torch.int32, device="cuda")
    static = [t.cuda() for t in (prob.x, prob.dt, prob.B, prob.C, prob.z)]
    A, D, dt_bias = prob.A.cuda(), prob.D.cuda(), prob.dt_bias.cuda()
    out = torch.empty(3, 4, prob.H, prob.P, dtype=prob.act, device="cuda")
    snaps = torch.empty(3, 4, prob.H, prob.P, prob.N, device="cuda")

    def call(o, s, x, dt, B, C, z):
        torch.ops.replayssm.mamba2_update_snapshots(state, x, dt, A, B, C, o, s, D, z, dt_bias, True, slots, -1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(out, snaps, *static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(out, snaps, *static)
    for seed in range(3):
        fresh = Problem(NANO4B, batch=3, T=4, seed=100 + seed)
        for s, n in zip(static, (fresh.x, fresh.dt, fresh.B, fresh.C, fresh.z)):
            s.copy_(n)
        out.fill_(float("nan"))
        snaps.fill_(float("nan"))
        graph.replay()
        eager_out, eager_snaps = torch.empty_like(out), torch.empty_like(snaps)
        call(eager_out, eager_snaps, *static)
        assert torch.equal(bits(out), bits(eager_out)) and torch.equal(bits(snaps), bits(eager_snaps))


def test_bad_inputs_name_the_argument():
    prob = Problem(SMALL, batch=2, T=3, seed=6)
    state, x, dt, A, B, C = prob.gpu_args(prob.state.to("cuda", torch.float32))
    out = torch.empty(2, 3, prob.H, prob.P, dtype=prob.act, device="cuda")
    snaps = torch.empty(2, 3, prob.H, prob.P, prob.N, device="cuda")
    op = torch.ops.replayssm.mamba2_update_snapshots
    with pytest.raises(RuntimeError, match=r"mamba2_update_snapshots: snapshots must have dtype in \{float32\}, got bfloat16"):
        op(state, x, dt, A, B, C, out, snaps.bfloat16(), None, None, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"mamba2_update_snapshots: snapshots must have shape \(2, 3, 8, 128, 64\), got \(2, 2, 8, 128, 64\)"):
        op(state, x, dt, A, B, C, out, snaps[:, :2], None, None, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"mamba2_update_snapshots: the number of tokens T \(x.size\(1\)\) must be in \[1, 16\], got 17"):
        big = x[:, :1].expand(2, 17, prob.H, prob.P)
        op(state, big, dt, A, B, C, out, snaps, None, None, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"mamba2_update_snapshots: state \(head_dim P, state_dim N\) must be one of .* got \(96, 64\)"):
        op(torch.zeros(3, prob.H, 96, prob.N, device="cuda"), x, dt, A, B, C, out, snaps, None, None, None, True, None, -1)
    with pytest.raises(RuntimeError, match=r"mamba2_update_snapshots: slots must have dtype in \{int32, int64\}, got float32"):
        op(state, x, dt, A, B, C, out, snaps, None, None, None, True, torch.zeros(2, device="cuda"), -1)
    with pytest.raises(RuntimeError, match=r"mamba2_update_snapshots: state must be a CUDA tensor, got a tensor on cpu"):
        op(state.cpu(), x, dt, A, B, C, out, snaps, None, None, None, True, None, -1)
    # Through ops.py: an fp32 snapshot of a bf16 state has no kernel; backend='cuda' says so.
    with pytest.raises(RuntimeError, match=r"mamba2_update_snapshots: backend='cuda' asked for, but float32 snapshots of a bfloat16 state"):
        ops.mamba2_update_snapshots(state.bfloat16(), x, dt, A, B, C, out, snaps, backend="cuda")
