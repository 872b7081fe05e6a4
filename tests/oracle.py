"""Independent fp64 per-token recurrences, written straight from docs/DESIGN.md section 2 with explicit
loops over heads. They share no code with the package: the tests use them as the oracle."""

import math

import torch


def softplus(x):
    return torch.log1p(torch.exp(-x.abs())) + x.clamp(min=0)


def mamba2_token(S, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """One token for one sequence, in place on S (H, P, N) fp64. x, z (H, P); dt (H,); B, C (G, N)."""
    H, P, N = S.shape
    G = B.shape[0]
    y = torch.empty(H, P, dtype=torch.float64)
    for h in range(H):
        g = h // (H // G)
        d = float(dt[h]) + (float(dt_bias[h]) if dt_bias is not None else 0.0)
        if dt_softplus:
            d = float(softplus(torch.tensor(d, dtype=torch.float64)))
        a = math.exp(d * float(A[h]))
        S[h] = a * S[h] + d * torch.outer(x[h].double(), B[g].double())
        y[h] = S[h] @ C[g].double()
        if D is not None:
            y[h] += float(D[h]) * x[h].double()
        if z is not None:
            zz = z[h].double()
            y[h] *= zz * torch.sigmoid(zz)
    return y


def delta_token(S, q, k, v, a, b, A_log, dt_bias, scale=None, use_qk_l2norm=True):
    """One GDN (a: (HV,)) or KDA (a: (HV, K)) token for one sequence, in place on S (HV, V, K) fp64."""
    HV, V, K = S.shape
    H = q.shape[0]
    scale = K ** -0.5 if scale is None else scale
    o = torch.empty(HV, V, dtype=torch.float64)
    for hv in range(HV):
        h = hv // (HV // H)
        qq, kk = q[h].double(), k[h].double()
        if use_qk_l2norm:
            qq = qq / torch.sqrt((qq * qq).sum() + 1e-6)
            kk = kk / torch.sqrt((kk * kk).sum() + 1e-6)
        qq = qq * scale
        g = -math.exp(float(A_log[hv])) * softplus(a[hv].double() + dt_bias[hv].double())
        alpha = torch.exp(g)
        beta = torch.sigmoid(b[hv].double())
        S[hv] = S[hv] * alpha           # scalar (GDN) or per key channel along K (KDA)
        u = beta * (v[hv].double() - S[hv] @ kk)
        S[hv] = S[hv] + torch.outer(u, kk)
        o[hv] = S[hv] @ qq
    return o
