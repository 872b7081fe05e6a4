"""Every compiled op on a small config, for compute-sanitizer (tools/sanitize.sh): a few steps and
speculative rounds (verify, commit, flush, materialize) that cross folds, with and without read copies,
pad rows and an out-of-range slot; the step and verify once with one head per CTA and once with a
whole group per CTA (their pipelined paths: 8 heads in one group, so the fp32 verify ring of 4 stages
is refilled); the update once more with its ring forced to wrap (claimed and fixed shares); the step
with a bf16 and an fp8 copy once more on nano4b's and super120b's tiles (P = 80 and 64, N = 128), and
without one there (the tf32 tensor-core replay); the step with the staggered_flush hint on 1,030 rows in
staggered phases, so that its order pass runs (more than one wave of CTAs) and takes two chunks of
rows; on 24 rows, where the hint takes the fold split; and in CTAs of two whole groups
(step_groups_per_cta=2) with an fp8 and a bf16 copy. The CTA shapes are forced through
replayssm_cuda.launch_overrides."""

import torch

from replayssm_cuda import launch_overrides, ops

torch.manual_seed(0)
H, P, N, G, L, S = 8, 64, 64, 1, 4, 5
dev = "cuda"
A = -(0.5 + torch.rand(H, device=dev))
D = torch.randn(H, device=dev)
dt_bias = 0.1 * torch.randn(H, device=dev)
slots = torch.tensor([3, -1, 0, 99], device=dev, dtype=torch.int32)


def inputs(batch, *T, P=P, N=N):
    return (torch.randn(batch, *T, H, P, device=dev).bfloat16(), torch.randn(batch, *T, H, device=dev).bfloat16(),
            torch.randn(batch, *T, G, N, device=dev).bfloat16(), torch.randn(batch, *T, G, N, device=dev).bfloat16(),
            torch.randn(batch, *T, H, P, device=dev).bfloat16())


def all_ops(copy_dtype):
    ck = 0.1 * torch.randn(S, H, P, N, device=dev)
    rc = None if copy_dtype is None else torch.empty(S, H, P, N, device=dev, dtype=copy_dtype)
    rs = torch.empty(S, H, P, device=dev) if copy_dtype == torch.float8_e4m3fn else None
    if rc is not None:
        ops.make_read_copy(ck, rc, rs, slots, -1, backend="cuda")
        ops.make_read_copy(ck, rc, rs, backend="cuda")
    x_buf = torch.zeros(S, H, L, P, device=dev, dtype=torch.bfloat16)
    B_buf = torch.zeros(S, G, L, N, device=dev, dtype=torch.bfloat16)
    dt_buf = torch.zeros(S, H, L, device=dev)
    cursors = torch.zeros(S, dtype=torch.int32, device=dev)
    for _ in range(2 * L + 1):
        x, dt, B, C, z = inputs(4)
        out = torch.empty_like(x)
        ops.mamba2_step(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, x, dt, A, B, C, out, D, z, dt_bias, True, 1,
                        slots, -1, backend="cuda")
    for T in (1, 3, 2, 3, 2):
        x, dt, B, C, z = inputs(4, T)
        ops.mamba2_verify(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, x, dt, A, B, C, torch.empty_like(x), D, z,
                          dt_bias, True, slots, -1, backend="cuda")
        accepted = torch.randint(0, T + 1, (4,), device=dev, dtype=torch.int32)
        ops.mamba2_commit(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, accepted, A, 3, slots, -1, backend="cuda")
    ops.mamba2_materialize(ck, x_buf, B_buf, dt_buf, cursors, A, torch.empty(4, H, P, N, device=dev), slots, -1,
                           backend="cuda")
    ops.mamba2_flush(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, A, slots, -1, backend="cuda")
    ops.mamba2_flush(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, A, backend="cuda")
    x, dt, B, C, z = inputs(4)
    ops.mamba2_update(ck, x, dt, A, B, C, torch.empty_like(x), D, z, dt_bias, True, slots, -1, backend="cuda")


for heads_per_cta, copy_dtype in [(h, c) for h in (1, 64) for c in (None, torch.bfloat16, torch.float8_e4m3fn)]:
    with launch_overrides(step_heads_per_cta=heads_per_cta, verify_heads_per_cta=heads_per_cta):
        all_ops(copy_dtype)
# The update's ring wrapped many times (2 CTAs over the 32 (row, head) items, 2 stages), on a pool with
# padded rows (one bulk copy per state row) and on a plain one, with the items past the first two rounds
# claimed from the counter (the default there) and in fixed shares (update_claims=0).
for claims in (1, 0):
    with launch_overrides(update_ctas=2, update_stages=2, update_claims=claims):
        padded = 0.1 * torch.randn(S, H, P, 2 * N, device=dev)[..., :N]
        for state in (padded, 0.1 * torch.randn(S, H, P, N, device=dev)):
            x, dt, B, C, z = inputs(4)
            ops.mamba2_update(state, x, dt, A, B, C, torch.empty_like(x), D, z, dt_bias, True, slots, -1,
                              backend="cuda")
# The step with a bf16 and an fp8 copy on nano4b's tile (P = 80, N = 128: 32 lanes a row, 10 rows a
# thread in the fold, the fp8 copy quantised after the head's last row from the tile in shared memory)
# and on super120b's (P = 64, N = 128: the split epilogue), across a fold; on both the copy fold stages
# its x windows in the ring beside the checkpoint tile. And without a copy (None: the fp32 checkpoint
# replayed on tensor cores in tf32 pairs).
def step_across_a_fold(P2, N2, copy_dtype):
    ck = 0.1 * torch.randn(S, H, P2, N2, device=dev)
    rc = rs = None
    if copy_dtype is not None:
        rc = torch.empty(S, H, P2, N2, device=dev, dtype=copy_dtype)
        rs = torch.empty(S, H, P2, device=dev) if copy_dtype == torch.float8_e4m3fn else None
        ops.make_read_copy(ck, rc, rs, backend="cuda")
    x_buf = torch.zeros(S, H, L, P2, device=dev, dtype=torch.bfloat16)
    B_buf = torch.zeros(S, G, L, N2, device=dev, dtype=torch.bfloat16)
    dt_buf = torch.zeros(S, H, L, device=dev)
    cursors = torch.zeros(S, dtype=torch.int32, device=dev)
    for _ in range(L + 1):
        x, dt, B, C, z = inputs(4, P=P2, N=N2)
        ops.mamba2_step(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, x, dt, A, B, C, torch.empty_like(x), D, z, dt_bias,
                        True, 1, slots, -1, backend="cuda")


for (P2, N2), heads_per_cta, copy_dtype in [(t, h, c) for t in ((80, 128), (64, 128)) for h in (1, 64)
                                            for c in (torch.bfloat16, torch.float8_e4m3fn, None)]:
    with launch_overrides(step_heads_per_cta=heads_per_cta):
        step_across_a_fold(P2, N2, copy_dtype)


# The order pass (staggered_flush, more than one wave of CTAs) over 1,030 rows in a random order with a
# pad row, a quarter of the slots folding in each step, with an fp8 copy.
S3 = 1100
ck = 0.1 * torch.randn(S3, H, P, N, device=dev)
rc = torch.empty(S3, H, P, N, device=dev, dtype=torch.float8_e4m3fn)
rs = torch.empty(S3, H, P, device=dev)
ops.make_read_copy(ck, rc, rs, backend="cuda")
x_buf = torch.zeros(S3, H, L, P, device=dev, dtype=torch.bfloat16)
B_buf = torch.zeros(S3, G, L, N, device=dev, dtype=torch.bfloat16)
dt_buf = torch.zeros(S3, H, L, device=dev)
cursors = (torch.arange(S3, device=dev) % L).int()
rows = torch.randperm(S3, device=dev)[:1030]
rows[5] = -1
with launch_overrides(step_heads_per_cta=64):
    for _ in range(L + 1):
        x, dt, B, C, z = inputs(rows.numel())
        ops.mamba2_step(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, x, dt, A, B, C, torch.empty_like(x), D, z,
                        dt_bias, True, 1, rows, -1, staggered_flush=True, backend="cuda")
# The fold split (staggered_flush, a read copy, one wave of CTAs; mamba2_fold_split): on the H200, 24 rows
# of 64 heads in 2 groups at L = 4 take 8-head replay CTAs and put the first 6 folding rows' heads in
# CTAs of two (helper rows first in the grid), in staggered phases with a pad row, on super120b's tile.
H4, G4, S4 = 64, 2, 30
ck = 0.1 * torch.randn(S4, H4, 64, 128, device=dev)
rc = torch.empty(S4, H4, 64, 128, device=dev, dtype=torch.float8_e4m3fn)
rs = torch.empty(S4, H4, 64, device=dev)
ops.make_read_copy(ck, rc, rs, backend="cuda")
x_buf = torch.zeros(S4, H4, L, 64, device=dev, dtype=torch.bfloat16)
B_buf = torch.zeros(S4, G4, L, 128, device=dev, dtype=torch.bfloat16)
dt_buf = torch.zeros(S4, H4, L, device=dev)
cursors = (torch.arange(S4, device=dev) % L).int()
rows = torch.randperm(S4, device=dev)[:24]
rows[3] = -1
A4, D4, bias4 = -(0.5 + torch.rand(H4, device=dev)), torch.randn(H4, device=dev), 0.1 * torch.randn(H4, device=dev)
for _ in range(L + 1):
    x, z = (torch.randn(24, H4, 64, device=dev).bfloat16() for _ in range(2))
    dt = torch.randn(24, H4, device=dev).bfloat16()
    B, C = (torch.randn(24, G4, 128, device=dev).bfloat16() for _ in range(2))
    ops.mamba2_step(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, x, dt, A4, B, C, torch.empty_like(x), D4, z, bias4,
                    True, 1, rows, -1, staggered_flush=True, backend="cuda")
# Two whole groups a CTA (step_groups_per_cta=2: the second group's B window, dots and C fragments,
# the fold restaging at its first head) on nano4b's and super120b's tiles, 16 heads in 4 groups, with an
# fp8 and a bf16 copy, across a fold, with a pad row and an out-of-range slot.
H5, G5 = 16, 4
A5, D5, bias5 = -(0.5 + torch.rand(H5, device=dev)), torch.randn(H5, device=dev), 0.1 * torch.randn(H5, device=dev)
with launch_overrides(step_groups_per_cta=2):
    for P5, copy_dtype in [(p, c) for p in (80, 64) for c in (torch.float8_e4m3fn, torch.bfloat16)]:
        ck = 0.1 * torch.randn(S, H5, P5, 128, device=dev)
        rc = torch.empty(S, H5, P5, 128, device=dev, dtype=copy_dtype)
        rs = torch.empty(S, H5, P5, device=dev) if copy_dtype == torch.float8_e4m3fn else None
        ops.make_read_copy(ck, rc, rs, backend="cuda")
        x_buf = torch.zeros(S, H5, L, P5, device=dev, dtype=torch.bfloat16)
        B_buf = torch.zeros(S, G5, L, 128, device=dev, dtype=torch.bfloat16)
        dt_buf = torch.zeros(S, H5, L, device=dev)
        cursors = torch.zeros(S, dtype=torch.int32, device=dev)
        for _ in range(L + 1):
            x, z = (torch.randn(4, H5, P5, device=dev).bfloat16() for _ in range(2))
            dt = torch.randn(4, H5, device=dev).bfloat16()
            B, C = (torch.randn(4, G5, 128, device=dev).bfloat16() for _ in range(2))
            ops.mamba2_step(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, x, dt, A5, B, C, torch.empty_like(x), D5, z,
                            bias5, True, 1, slots, -1, backend="cuda")
torch.cuda.synchronize()
print("sanitize_ops: all ops ran")
