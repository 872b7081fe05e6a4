"""Measured error of every Mamba-2 precision combination the compiled kernels support, against the fp64
reference without a read copy fed the same (bf16) inputs: the table of README.md's precision section
(docs/DESIGN.md section 5 states the contract). The output error includes the bf16 rounding of the output itself (about 1.6e-3 here).

For each (checkpoint dtype, read copy) it decodes `--steps` tokens (several folds at L = 16) through
mamba2_step, and reports the relative output error (mean and max over steps, whole-batch norms) and
the relative error of the materialized state at the end; plus the conventional update per state dtype.

    python3 tools/precision_mamba2.py                 # on the GPU, compiled kernels
    python3 tools/precision_mamba2.py --device cpu    # dry run of the script on the reference
"""

from __future__ import annotations

import argparse

import torch

from replayssm_cuda import Mamba2Cache, Mamba2Weights, ops

FP8 = torch.float8_e4m3fn
COMBOS = [(torch.float32, None), (torch.float32, torch.bfloat16), (torch.float32, torch.float16),
          (torch.float32, FP8), (torch.bfloat16, None), (torch.bfloat16, FP8), (torch.float16, None),
          (torch.float16, FP8)]
H, P, N, G, L, BATCH = 8, 64, 128, 2, 16, 4


def name(d):
    return "none" if d is None else str(d).replace("torch.", "")


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=3 * L + 5)
    args = parser.parse_args()
    backend = "cuda" if args.device == "cuda" else "reference"
    gen = torch.Generator().manual_seed(0)
    A = -(0.5 + torch.rand(H, generator=gen))
    D = torch.randn(H, generator=gen)
    dt_bias = 0.1 * torch.randn(H, generator=gen)
    init = 0.3 * torch.randn(BATCH, H, P, N, generator=gen, dtype=torch.float64)
    steps = [[torch.randn(BATCH, H, P, generator=gen), 0.5 * torch.randn(BATCH, H, generator=gen),
              torch.randn(BATCH, G, N, generator=gen), torch.randn(BATCH, G, N, generator=gen),
              torch.randn(BATCH, H, P, generator=gen)] for _ in range(args.steps)]
    steps = [[t.bfloat16() for t in s] for s in steps]        # the inputs both sides see

    print(f"# Mamba-2 precision vs the fp64 reference: H={H} P={P} N={N} G={G}, batch {BATCH}, L={L}, "
          f"{args.steps} steps, bf16 activations, device {args.device} ({backend})")
    print("| op | checkpoint | read copy | output error mean | output error max | state error at the end |")
    print("|---|---|---|---|---|---|")
    ref_w = Mamba2Weights(A=A.double(), D=D.double(), dt_bias=dt_bias.double())
    dev_w = Mamba2Weights(A=A.to(args.device), D=D.to(args.device), dt_bias=dt_bias.to(args.device))
    for ck, rc in COMBOS:
        # The ideal: fp64 state, no read copy, the same bf16 inputs.
        ref = Mamba2Cache(BATCH, H, P, N, G, ref_w, buffer_len=L, checkpoint_dtype=torch.float64,
                          activation_dtype=torch.float64, backend="reference")
        dev = Mamba2Cache(BATCH, H, P, N, G, dev_w, buffer_len=L, checkpoint_dtype=ck, read_copy_dtype=rc,
                          activation_dtype=torch.bfloat16, device=args.device, backend="auto")
        ref.load(init.to(ck).double())
        dev.load(init.to(args.device, ck))
        errors = []
        for x, dt, B, C, z in steps:
            y_ref = ref.step(x.double(), dt.double(), B.double(), C.double(), z.double())
            y = torch.empty(BATCH, H, P, dtype=torch.bfloat16, device=args.device)
            ops.mamba2_step(dev.checkpoint, dev.read_copy, dev.read_scale, dev.x_buf, dev.B_buf, dev.dt_buf,
                            dev.num_committed, x.to(args.device), dt.to(args.device), dev_w.A, B.to(args.device),
                            C.to(args.device), y, dev_w.D, z.to(args.device), dev_w.dt_bias, True, 1, None, -1,
                            backend=backend)
            errors.append(rel(y, y_ref))
        state_err = rel(dev.materialize(), ref.materialize())
        print(f"| step | {name(ck)} | {name(rc)} | {sum(errors) / len(errors):.2e} | {max(errors):.2e} | "
              f"{state_err:.2e} |", flush=True)
    for ck in (torch.float32, torch.bfloat16, torch.float16):
        state = init.to(args.device, ck)
        ref_state = init.to(ck).double()
        errors = []
        for x, dt, B, C, z in steps:
            y = torch.empty(BATCH, H, P, dtype=torch.bfloat16, device=args.device)
            ops.mamba2_update(state, x.to(args.device), dt.to(args.device), dev_w.A, B.to(args.device),
                              C.to(args.device), y, dev_w.D, z.to(args.device), dev_w.dt_bias, True, None, -1,
                              backend=backend)
            y_ref = torch.empty(BATCH, H, P, dtype=torch.float64)
            ops.mamba2_update(ref_state, x.double(), dt.double(), ref_w.A, B.double(), C.double(), y_ref, ref_w.D,
                              z.double(), ref_w.dt_bias, True, None, -1, backend="reference")
            errors.append(rel(y, y_ref))
        print(f"| update | {name(ck)} | none | {sum(errors) / len(errors):.2e} | {max(errors):.2e} | "
              f"{rel(state, ref_state):.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
