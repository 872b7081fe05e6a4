"""Programmatic dependent launch (the pdl launch override, launch/pdl.h): the T = 1 kernels launched with
it (mamba2_update, mamba2_step with its order pass, gdn_update, gdn_step) give the bits of the plain
launch, eagerly and replayed from a CUDA graph captured with it.

Every hazard the PDL contract covers is in the launch sequences below: a kernel of ours that follows
another of ours directly (the state, buffers and cursors the previous step wrote), one that follows a
torch kernel which has just written its activations and slot ids (an engine's producer), the update's
claims counter zeroed by a memset in between, and the stochastic-rounding offset kernel between two
launches. A kernel that read or wrote anything of those before its wait would give other bits, or
different bits from run to run; the sequences run more steps than a fold cycle, so folding and replaying
CTAs, pad rows and the order pass are all in them."""

import pytest
import torch

from replayssm_cuda import DeltaRuleWeights, GDNCache, Mamba2Cache, Mamba2Weights

FP8 = torch.float8_e4m3fn
DEV = "cuda"
SUPER120B_TP4 = (32, 64, 128, 2)   # H, P, N, G
NANO4B = (96, 80, 128, 8)
QWEN4B = (16, 32, 128, 128)        # H, HV, K, V


def bits(t):
    return t.contiguous().view(torch.uint8)


def produce(dst, src):
    """dst = src through a torch kernel (not a copy engine memcpy): the kernel right before ours writes
    what ours reads, as an engine's projection or slot-mapping kernel would."""
    torch.mul(src, 1, out=dst)


class Mamba2Run:
    """A Mamba-2 layer's cache and a fixed sequence of step inputs (on the device), replayable on fresh
    caches of the same start."""

    def __init__(self, dims, batch, num_slots, L, checkpoint_dtype=torch.float32, read_copy_dtype=None,
                 staggered_flush=False, stochastic_rounding=False, steps=None, seed=0):
        self.H, self.P, self.N, self.G = dims
        g = torch.Generator().manual_seed(seed)
        self.cache_args = dict(buffer_len=L, checkpoint_dtype=checkpoint_dtype, read_copy_dtype=read_copy_dtype,
                               staggered_flush=staggered_flush, stochastic_rounding=stochastic_rounding, seed=seed)
        self.weights = Mamba2Weights(A=-(0.5 + torch.rand(self.H, generator=g)).to(DEV),
                                     D=torch.randn(self.H, generator=g).to(DEV),
                                     dt_bias=(0.1 * torch.randn(self.H, generator=g)).to(DEV))
        self.num_slots = num_slots
        self.init = (0.3 * torch.randn(num_slots, self.H, self.P, self.N, generator=g)).to(DEV)
        slots = torch.randperm(num_slots, generator=g)[:batch].to(torch.int32)
        if batch > 2:
            slots[1] = -1                                             # a pad row
        self.slots = slots.to(DEV)
        n = steps if steps is not None else 2 * L + 3                 # every slot folds at least twice
        self.inputs = []
        for _ in range(n):
            x = torch.randn(batch, self.H, self.P, generator=g)
            dt = 0.5 * torch.randn(batch, self.H, generator=g)
            B = torch.randn(batch, self.G, self.N, generator=g)
            C = torch.randn(batch, self.G, self.N, generator=g)
            z = torch.randn(batch, self.H, self.P, generator=g)
            self.inputs.append([t.to(DEV, torch.bfloat16) for t in (x, dt, B, C, z)])

    def cache(self):
        c = Mamba2Cache(self.num_slots, self.H, self.P, self.N, self.G, self.weights, device=DEV,
                        activation_dtype=torch.bfloat16, backend="cuda", **self.cache_args)
        c.load(self.init)
        return c

    def run(self, cache, static, static_slots):
        """The sequence: step i reads its inputs straight from the list when i % 3 == 1 (its kernel
        follows the previous step's), else from `static`, written by a torch kernel right before it."""
        outs = []
        for i, step in enumerate(self.inputs):
            if i % 3 == 1:
                outs.append(cache.step(*step, slots=self.slots))
            else:
                for s, n in zip(static, step):
                    produce(s, n)
                produce(static_slots, self.slots)
                outs.append(cache.step(*static, slots=static_slots))
        return outs

    def eager(self, set_overrides, pdl, **more):
        set_overrides(pdl=pdl, **more)
        cache = self.cache()
        static = [torch.empty_like(t) for t in self.inputs[0]]
        outs = self.run(cache, static, torch.empty_like(self.slots))
        torch.cuda.synchronize()
        return outs, cache.cache_tensors

    def graphed(self, set_overrides, pdl, **more):
        """The whole sequence captured into one graph with the overrides in force, replayed on a cache
        reloaded to the start."""
        set_overrides(pdl=pdl, **more)
        cache = self.cache()
        static = [torch.empty_like(t) for t in self.inputs[0]]
        static_slots = torch.empty_like(self.slots)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):                           # warm-up on a side stream
            self.run(cache, static, static_slots)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = self.run(cache, static, static_slots)
        results = []
        for _ in range(2):                                        # a replay from the start, twice
            cache.load(self.init)
            if cache.rounding_seed is not None:
                cache.rounding_seed.copy_(torch.tensor([self.cache_args["seed"], 0], device=DEV))
            graph.replay()
            torch.cuda.synchronize()
            results.append(([o.clone() for o in outs], [t.clone() for t in cache.cache_tensors]))
        return results


def assert_same(a, b, where):
    (outs_a, tensors_a), (outs_b, tensors_b) = a, b
    for i, (x, y) in enumerate(zip(outs_a, outs_b)):
        assert torch.equal(bits(x), bits(y)), f"{where}: output of step {i}"
    for i, (x, y) in enumerate(zip(tensors_a, tensors_b)):
        assert torch.equal(bits(x), bits(y)), f"{where}: cache tensor {i}"


# The sources of the step (the fp32 checkpoint on tensor cores, a bf16 and an fp8 read copy), the update
# (L = 1) at batch 1 (its split into one-pass items) and 8, at super120b TP 4; nano4b at batch 40 with
# the staggered-flush hint (the order pass and the ordered step: two PDL launches per step); a bf16
# checkpoint with stochastic rounding (the offset kernel between launches).
MAMBA2_CASES = {
    "update-b1": dict(dims=SUPER120B_TP4, batch=1, num_slots=4, L=1, steps=6),
    "update-b8": dict(dims=SUPER120B_TP4, batch=8, num_slots=12, L=1, steps=6),
    "step-b1-fp32": dict(dims=SUPER120B_TP4, batch=1, num_slots=4, L=4),
    "step-b8-bf16-copy": dict(dims=SUPER120B_TP4, batch=8, num_slots=12, L=4, read_copy_dtype=torch.bfloat16),
    "step-b8-fp8-copy": dict(dims=SUPER120B_TP4, batch=8, num_slots=12, L=4, read_copy_dtype=FP8),
    "step-b40-staggered-fp8": dict(dims=NANO4B, batch=40, num_slots=44, L=4, read_copy_dtype=FP8,
                                   staggered_flush=True),
    "step-b8-bf16-rounding": dict(dims=SUPER120B_TP4, batch=8, num_slots=12, L=4, checkpoint_dtype=torch.bfloat16,
                                  stochastic_rounding=True),
}


# The pdl override's launches against the plain one (0): both halves (1), the wait only (2: started early,
# the next kernel not), and the rule (-1: both where the tiles do not outnumber the SMs: batch 1 here).
PDL_MODES = [1, 2, -1]


@pytest.mark.parametrize("pdl", PDL_MODES)
@pytest.mark.parametrize("case", list(MAMBA2_CASES))
def test_mamba2_pdl_is_bitwise_the_plain_launch(case, pdl, set_overrides):
    run = Mamba2Run(**MAMBA2_CASES[case], seed=3)
    plain = run.eager(set_overrides, 0)
    assert_same(run.eager(set_overrides, pdl), plain, f"{case} eager")
    for i, replay in enumerate(run.graphed(set_overrides, pdl)):
        assert_same(replay, plain, f"{case} graph replay {i}")


def test_mamba2_update_claims_with_pdl(set_overrides):
    """The update's claims (a memset of the counter before each launch, then a PDL kernel) over few
    CTAs that wrap the ring many times."""
    run = Mamba2Run(SUPER120B_TP4, 16, 20, 1, steps=6, seed=5)
    set_overrides(update_ctas=3, update_stages=2, update_claims=1)
    plain = run.eager(set_overrides, 0)
    assert_same(run.eager(set_overrides, 1), plain, "claims eager")
    for i, replay in enumerate(run.graphed(set_overrides, 1)):
        assert_same(replay, plain, f"claims graph replay {i}")


class GdnRun:
    """The GDN counterpart of Mamba2Run (buffer_len 1: gdn_update)."""

    def __init__(self, dims, batch, num_slots, L, read_copy_dtype=None, staggered_flush=False, steps=None, seed=0):
        self.H, self.HV, self.K, self.V = dims
        g = torch.Generator().manual_seed(seed)
        self.weights = DeltaRuleWeights(A_log=torch.log(0.05 + 0.45 * torch.rand(self.HV, generator=g)).to(DEV),
                                        dt_bias=(0.5 * torch.randn(self.HV, generator=g)).to(DEV))
        self.cache_args = dict(buffer_len=L, read_copy_dtype=read_copy_dtype, staggered_flush=staggered_flush)
        self.num_slots = num_slots
        self.init = (0.3 * torch.randn(num_slots, self.HV, self.V, self.K, generator=g)).to(DEV)
        slots = torch.randperm(num_slots, generator=g)[:batch].to(torch.int32)
        if batch > 2:
            slots[1] = -1
        self.slots = slots.to(DEV)
        self.inputs = []
        for _ in range(steps if steps is not None else 2 * L + 3):
            q = torch.randn(batch, self.H, self.K, generator=g)
            k = torch.randn(batch, self.H, self.K, generator=g)
            v = torch.randn(batch, self.HV, self.V, generator=g)
            a = torch.randn(batch, self.HV, generator=g)
            b = torch.randn(batch, self.HV, generator=g)
            self.inputs.append([t.to(DEV, torch.bfloat16) for t in (q, k, v, a, b)])

    def cache(self):
        c = GDNCache(self.num_slots, self.H, self.HV, self.K, self.V, self.weights, device=DEV,
                     activation_dtype=torch.bfloat16, backend="cuda", **self.cache_args)
        c.load(self.init)
        return c

    run = Mamba2Run.run
    eager = Mamba2Run.eager

    def graphed(self, set_overrides, pdl, **more):
        set_overrides(pdl=pdl, **more)
        cache = self.cache()
        static = [torch.empty_like(t) for t in self.inputs[0]]
        static_slots = torch.empty_like(self.slots)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.run(cache, static, static_slots)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = self.run(cache, static, static_slots)
        cache.load(self.init)
        graph.replay()
        torch.cuda.synchronize()
        return [o.clone() for o in outs], [t.clone() for t in cache.cache_tensors]


GDN_CASES = {
    "update-b1": dict(dims=QWEN4B, batch=1, num_slots=4, L=1, steps=6),
    "update-b8": dict(dims=QWEN4B, batch=8, num_slots=12, L=1, steps=6),
    "step-b8": dict(dims=QWEN4B, batch=8, num_slots=12, L=4),
    "step-b8-fp8-copy": dict(dims=QWEN4B, batch=8, num_slots=12, L=4, read_copy_dtype=FP8),
}


@pytest.mark.parametrize("pdl", PDL_MODES)
@pytest.mark.parametrize("case", list(GDN_CASES))
def test_gdn_pdl_is_bitwise_the_plain_launch(case, pdl, set_overrides):
    run = GdnRun(**GDN_CASES[case], seed=4)
    plain = run.eager(set_overrides, 0)
    assert_same(run.eager(set_overrides, pdl), plain, f"{case} eager")
    assert_same(run.graphed(set_overrides, pdl), plain, f"{case} graph replay")


# The step behind its order pass (order_pass_pdl, launch/pdl.h: the step launched with PDL behind the pass
# even where the pdl override is off, its CTAs waiting for the pass) gives the bits of the step launched
# after the pass, with and without PDL elsewhere, eagerly and replayed: Mamba-2 (nano4b b40, a bf16 and an
# fp8 copy) and GDN (qwen4b b40, no copy and fp8), both with more than one wave of CTAs, so the pass runs.
BEHIND_PASS_CASES = {
    "mamba2-b40-bf16": (Mamba2Run, dict(dims=NANO4B, batch=40, num_slots=44, L=4, read_copy_dtype=torch.bfloat16,
                                        staggered_flush=True)),
    "mamba2-b40-fp8": (Mamba2Run, MAMBA2_CASES["step-b40-staggered-fp8"]),
    "gdn-b40": (GdnRun, dict(dims=QWEN4B, batch=40, num_slots=44, L=4, staggered_flush=True)),
    "gdn-b40-fp8": (GdnRun, dict(dims=QWEN4B, batch=40, num_slots=44, L=4, read_copy_dtype=FP8, staggered_flush=True)),
}


@pytest.mark.parametrize("case", list(BEHIND_PASS_CASES))
@pytest.mark.parametrize("pdl", [0, 1])
def test_step_behind_its_order_pass_is_bitwise_the_step_after_it(case, pdl, set_overrides):
    cls, kwargs = BEHIND_PASS_CASES[case]
    run = cls(**kwargs, seed=6)
    after = run.eager(set_overrides, pdl, order_pass_pdl=0)
    assert_same(run.eager(set_overrides, pdl, order_pass_pdl=1), after, f"{case} pdl={pdl} eager")
    replays = run.graphed(set_overrides, pdl, order_pass_pdl=1)
    for i, replay in enumerate(replays if isinstance(replays, list) else [replays]):
        assert_same(replay, after, f"{case} pdl={pdl} graph replay {i}")
