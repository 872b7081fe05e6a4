"""Test harness: one class per family that makes weights, random inputs, caches and the oracle step,
so that every behavioural test runs unchanged over Mamba-2, GDN and KDA."""

import torch

import oracle
from replayssm_cuda import DeltaRuleWeights, GDNCache, KDACache, Mamba2Cache, Mamba2Weights


class Mamba2Family:
    name = "mamba2"

    def __init__(self, heads=6, head_dim=5, state_dim=4, groups=2, dtype=torch.float64, act_dtype=None,
                 device="cpu", seed=0):
        self.H, self.P, self.N, self.G = heads, head_dim, state_dim, groups
        self.dtype, self.act = dtype, act_dtype or dtype
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)
        wd = torch.float32 if dtype != torch.float64 else torch.float64
        self.weights = Mamba2Weights(A=-(0.5 + torch.rand(heads, generator=self.gen, dtype=wd)).to(device),
                                     D=torch.randn(heads, generator=self.gen, dtype=wd).to(device),
                                     dt_bias=(0.1 * torch.randn(heads, generator=self.gen, dtype=wd)).to(device),
                                     dt_softplus=True)

    @property
    def state_shape(self):
        return (self.H, self.P, self.N)

    def make_cache(self, num_slots, **kw):
        kw.setdefault("checkpoint_dtype", self.dtype)
        kw.setdefault("activation_dtype", self.act)
        kw.setdefault("backend", "reference")
        return Mamba2Cache(num_slots, self.H, self.P, self.N, self.G, self.weights, device=self.device, **kw)

    def _rand(self, *shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=self.gen, dtype=torch.float64)).to(self.device, self.act)

    def inputs(self, batch, T=None):
        """(x, dt, B, C, z) for one token per row, or T tokens per row when T is given."""
        lead = (batch,) if T is None else (batch, T)
        return (self._rand(*lead, self.H, self.P), self._rand(*lead, self.H, scale=0.5),
                self._rand(*lead, self.G, self.N), self._rand(*lead, self.G, self.N),
                self._rand(*lead, self.H, self.P))

    @staticmethod
    def token(inputs, r, t=None):
        return tuple(v[r] if t is None else v[r, t] for v in inputs)

    def oracle_step(self, S, tok):
        x, dt, B, C, z = (v.cpu() for v in tok)
        w = self.weights
        return oracle.mamba2_token(S, x, dt, w.A.cpu(), B, C, w.D.cpu(), z, w.dt_bias.cpu(), True)


class DeltaFamily:
    def __init__(self, kda, heads=2, v_heads=4, head_k_dim=8, head_v_dim=6, dtype=torch.float64,
                 act_dtype=None, device="cpu", seed=0):
        self.kda = kda
        self.name = "kda" if kda else "gdn"
        self.H, self.HV, self.K, self.V = heads, v_heads, head_k_dim, head_v_dim
        self.dtype, self.act = dtype, act_dtype or dtype
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)
        wd = torch.float32 if dtype != torch.float64 else torch.float64
        bias_shape = (v_heads, head_k_dim) if kda else (v_heads,)
        self.weights = DeltaRuleWeights(A_log=(0.5 * torch.randn(v_heads, generator=self.gen, dtype=wd)).to(device),
                                        dt_bias=(0.5 * torch.randn(*bias_shape, generator=self.gen, dtype=wd)).to(device))

    @property
    def state_shape(self):
        return (self.HV, self.V, self.K)

    def make_cache(self, num_slots, **kw):
        kw.setdefault("checkpoint_dtype", self.dtype)
        kw.setdefault("activation_dtype", self.act)
        kw.setdefault("backend", "reference")
        cls = KDACache if self.kda else GDNCache
        return cls(num_slots, self.H, self.HV, self.K, self.V, self.weights, device=self.device, **kw)

    def _rand(self, *shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=self.gen, dtype=torch.float64)).to(self.device, self.act)

    def inputs(self, batch, T=None):
        """(q, k, v, a, b) for one token per row, or T tokens per row when T is given."""
        lead = (batch,) if T is None else (batch, T)
        gate = (*lead, self.HV, self.K) if self.kda else (*lead, self.HV)
        return (self._rand(*lead, self.H, self.K), self._rand(*lead, self.H, self.K),
                self._rand(*lead, self.HV, self.V), self._rand(*gate), self._rand(*lead, self.HV))

    @staticmethod
    def token(inputs, r, t=None):
        return tuple(v[r] if t is None else v[r, t] for v in inputs)

    def oracle_step(self, S, tok):
        q, k, v, a, b = (t.cpu() for t in tok)
        w = self.weights
        return oracle.delta_token(S, q, k, v, a, b, w.A_log.cpu(), w.dt_bias.cpu())


def all_families(**kw):
    return [Mamba2Family(**kw), DeltaFamily(False, **kw), DeltaFamily(True, **kw)]


FAMILY_NAMES = ["mamba2", "gdn", "kda"]


def family(name, **kw):
    if name == "mamba2":
        return Mamba2Family(**kw)
    return DeltaFamily(name == "kda", **kw)


def random_states(fam, num_slots, scale=0.3):
    return scale * torch.randn(num_slots, *fam.state_shape, generator=fam.gen, dtype=torch.float64)


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp(min=1e-300)).item()
