"""One verify(T=4) and one commit of super120b (H=128 P=64 N=128 G=8) at batch 256, fp32 checkpoint, L = 16,
cursors spread over [0, 12] and acceptance in [1, 4] as in a steady spec loop (about 1 row in 5 folds),
for Nsight Compute:
`ncu --profile-from-start off --clock-control none --kernel-name regex:"verify|fold" ... python3
tools/profile_mamba2_spec.py` (or NCU_SCRIPT of tools/profile.sh)."""

import torch

import replayssm_cuda  # noqa: F401  (registers the ops)

H, P, N, G, L, T, batch = 128, 64, 128, 8, 16, 4, 256
dev = "cuda"
torch.manual_seed(0)
A = -(0.5 + torch.rand(H, device=dev))
D = torch.randn(H, device=dev)
dt_bias = 0.1 * torch.randn(H, device=dev)
x = torch.randn(batch, T, H, P, device=dev).bfloat16()
z = torch.randn(batch, T, H, P, device=dev).bfloat16()
dt = (0.5 * torch.randn(batch, T, H, device=dev)).bfloat16()
B = torch.randn(batch, T, G, N, device=dev).bfloat16()
C = torch.randn(batch, T, G, N, device=dev).bfloat16()
out = torch.empty_like(x)
ck = 0.1 * torch.randn(batch, H, P, N, device=dev)
x_buf = torch.randn(batch, H, L, P, device=dev).bfloat16()
B_buf = torch.randn(batch, G, L, N, device=dev).bfloat16()
dt_buf = 0.1 * torch.rand(batch, H, L, device=dev)
cursors0 = torch.randint(0, L - T + 1, (batch,), device=dev, dtype=torch.int32)
cursors = cursors0.clone()
accepted = torch.randint(1, T + 1, (batch,), device=dev, dtype=torch.int32)


def run():
    cursors.copy_(cursors0)  # a copy kernel: profile with --kernel-name regex:"verify|fold"
    torch.ops.replayssm.mamba2_verify(ck, None, None, x_buf, B_buf, dt_buf, cursors, x, dt, A, B, C, out, D, z,
                                      dt_bias, True, None, -1)
    torch.ops.replayssm.mamba2_commit(ck, None, None, x_buf, B_buf, dt_buf, cursors, accepted, A, T, None, -1,
                                      None)


run()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
run()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
