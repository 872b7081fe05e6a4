"""One conventional update, three replay steps (no fold, w = 8 of L = 16: no read copy, bf16 copy, fp8
copy) and three fold steps (w = 15: no read copy, bf16 copy, fp8 copy) of nano4b at batch 256, for Nsight
Compute (step launches 0-2 are the replay steps, 3-5 the folds; REPLAYSSM_PROFILE_BATCH picks another batch,
REPLAYSSM_PROFILE_DIMS=super120b the other dims): `ncu --profile-from-start off --clock-control none ...
python3 tools/profile_mamba2.py` (tools/profile.sh runs it)."""

import os

import torch

DIMS = {"nano4b": (96, 80, 128, 8), "super120b": (128, 64, 128, 8)}  # H, P, N, G
H, P, N, G = DIMS[os.environ.get("REPLAYSSM_PROFILE_DIMS", "nano4b")]
L = 16
batch = int(os.environ.get("REPLAYSSM_PROFILE_BATCH", "256"))  # e.g. 64 for the batch-64 targets
dev = "cuda"
torch.manual_seed(0)
A = -(0.5 + torch.rand(H, device=dev))
D = torch.randn(H, device=dev)
dt_bias = 0.1 * torch.randn(H, device=dev)
x = torch.randn(batch, H, P, device=dev).bfloat16()
z = torch.randn(batch, H, P, device=dev).bfloat16()
dt = torch.randn(batch, H, device=dev).bfloat16()
B = torch.randn(batch, G, N, device=dev).bfloat16()
C = torch.randn(batch, G, N, device=dev).bfloat16()
out = torch.empty_like(x)
state = 0.1 * torch.randn(batch, H, P, N, device=dev)
x_buf = torch.randn(batch, H, L, P, device=dev).bfloat16()
B_buf = torch.randn(batch, G, L, N, device=dev).bfloat16()
dt_buf = 0.1 * torch.rand(batch, H, L, device=dev)
cursors = torch.zeros(batch, dtype=torch.int32, device=dev)
copy_bf16 = state.bfloat16()
copy_fp8 = state.clamp(-448, 448).to(torch.float8_e4m3fn)
scale_fp8 = torch.ones(batch, H, P, device=dev)


def run():
    torch.ops.replayssm.mamba2_update(state, x, dt, A, B, C, out, D, z, dt_bias, True, None, -1)
    for read_copy, read_scale in [(None, None), (copy_bf16, None), (copy_fp8, scale_fp8)]:
        cursors.fill_(8)
        torch.ops.replayssm.mamba2_step(state, read_copy, read_scale, x_buf, B_buf, dt_buf, cursors, x, dt, A, B, C,
                                        out, D, z, dt_bias, True, 1, None, -1)
    for read_copy, read_scale in [(None, None), (copy_bf16, None), (copy_fp8, scale_fp8)]:
        cursors.fill_(L - 1)  # the token fills the buffer: the step folds
        torch.ops.replayssm.mamba2_step(state, read_copy, read_scale, x_buf, B_buf, dt_buf, cursors, x, dt, A, B, C,
                                        out, D, z, dt_bias, True, 1, None, -1)


import replayssm_cuda  # noqa: E402,F401  (registers the ops)

run()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
run()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
