"""Error of bf16 / fp16 Mamba-2 checkpoints with round-to-nearest (RNE) and with stochastic rounding (SR)
over a long decode, against an fp64 cache fed the same bf16 inputs: the table docs/DESIGN.md quotes.

Three regimes, because rounding only accumulates where the state remembers:
  fast    A ~ -(0.5..1.5), dt = softplus(0.5 randn + bias): the state forgets within a few tokens, so
          every fold's rounding error is soon decayed away (the regime of the other precision tables);
  slow    A ~ -1e-3, dt ~ 1e-3, zero-mean inputs: long-memory heads whose per-fold increments are
          around one 16-bit ulp and random in sign, so rounding errors random-walk either way;
  drift   as slow, but x and B positive: every increment has the same sign and is below half an ulp,
          the case where RNE is biased (it drops them) and SR is not.
For each it reports the relative state error (Frobenius, all slots) after growing numbers of steps and
the relative output error averaged over the last fold cycle.

    python3 tools/precision_sr_mamba2.py                 # CPU, reference backend (the kernels round
                                                         # bit-identically: tests/gpu/test_mamba2_sr_cuda.py)
    python3 tools/precision_sr_mamba2.py --device cuda   # the compiled kernels
"""

from __future__ import annotations

import argparse

import torch

from replayssm_cuda import Mamba2Cache, Mamba2Weights

H, P, N, G, L, BATCH = 4, 64, 64, 2, 16, 2


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


def regime(name, gen):
    """A, dt_bias, dt_softplus, and the per-step draws of dt, x and B."""
    x = lambda: torch.randn(BATCH, H, P, generator=gen)                       # noqa: E731
    B = lambda: torch.randn(BATCH, G, N, generator=gen)                       # noqa: E731
    if name == "fast":
        A = -(0.5 + torch.rand(H, generator=gen))
        dt_bias = 0.1 * torch.randn(H, generator=gen)
        return A, dt_bias, True, lambda: 0.5 * torch.randn(BATCH, H, generator=gen), x, B
    A = -1e-3 * (0.5 + torch.rand(H, generator=gen))
    dt = lambda: 1e-3 * (0.5 + torch.rand(BATCH, H, generator=gen))          # noqa: E731
    if name == "slow":
        return A, None, False, dt, x, B
    return (A, None, False, dt, lambda: 0.5 + 0.5 * torch.rand(BATCH, H, P, generator=gen),
            lambda: 0.5 + 0.5 * torch.rand(BATCH, G, N, generator=gen))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=4096)
    args = parser.parse_args()
    backend = "reference" if args.device == "cpu" else "cuda"
    marks = [m for m in (64, 256, 1024, 4096, 16384) if m <= args.steps]
    print(f"# Mamba-2 16-bit checkpoints, RNE vs SR, relative to an fp64 cache on the same bf16 inputs: "
          f"H={H} P={P} N={N} G={G}, batch {BATCH}, L={L}, bf16 activations, device {args.device} ({backend})")
    print("| regime | checkpoint | rounding | " + " | ".join(f"state error after {m}" for m in marks) +
          f" | output error, last {L} steps |")
    print("|---|---|---|" + "---|" * (len(marks) + 1))
    for name in ("fast", "slow", "drift"):
        gen = torch.Generator().manual_seed(0)
        A, dt_bias, softplus, dt_fn, x_fn, B_fn = regime(name, gen)
        init = 0.3 * torch.randn(BATCH, H, P, N, generator=gen, dtype=torch.float64)
        steps = [[x_fn(), dt_fn(), B_fn(), torch.randn(BATCH, G, N, generator=gen)] for _ in range(args.steps)]
        steps = [[t.bfloat16() for t in s] for s in steps]
        ref_w = Mamba2Weights(A=A.double(), dt_bias=None if dt_bias is None else dt_bias.double(),
                              dt_softplus=softplus)
        dev_w = Mamba2Weights(A=A.to(args.device), dt_bias=None if dt_bias is None else dt_bias.to(args.device),
                              dt_softplus=softplus)
        ref = Mamba2Cache(BATCH, H, P, N, G, ref_w, buffer_len=L, checkpoint_dtype=torch.float64,
                          activation_dtype=torch.float64, backend="reference")
        caches = {}
        for ck in (torch.bfloat16, torch.float16):
            for sr in (False, True):
                caches[(ck, sr)] = Mamba2Cache(BATCH, H, P, N, G, dev_w, buffer_len=L, checkpoint_dtype=ck,
                                               activation_dtype=torch.bfloat16, device=args.device,
                                               backend=backend, stochastic_rounding=sr, seed=1234)
        ref.load(init.to(torch.bfloat16).double())   # all start from the same (bf16-exact) state
        for c in caches.values():
            c.load(init.to(torch.bfloat16).to(args.device, c.checkpoint.dtype))
        state_err = {k: [] for k in caches}
        out_err = {k: [] for k in caches}
        for i, (x, dt, B, C) in enumerate(steps):
            y_ref = ref.step(x.double(), dt.double(), B.double(), C.double())
            for k, c in caches.items():
                y = c.step(x.to(args.device), dt.to(args.device), B.to(args.device), C.to(args.device))
                if i >= args.steps - L:
                    out_err[k].append(rel(y, y_ref))
            if i + 1 in marks:
                want = ref.materialize()
                for k, c in caches.items():
                    state_err[k].append(rel(c.materialize(), want))
        for (ck, sr), errs in state_err.items():
            cells = " | ".join(f"{e:.2e}" for e in errs)
            print(f"| {name} | {str(ck).replace('torch.', '')} | {'SR' if sr else 'RNE'} | {cells} | "
                  f"{sum(out_err[(ck, sr)]) / L:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
