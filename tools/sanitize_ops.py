"""Every compiled op on a small config, for compute-sanitizer (tools/sanitize.sh): a few steps and
speculative rounds (verify, commit, flush, materialize) that cross folds, with and without read copies,
pad rows and an out-of-range slot; the step and verify once with one head per CTA and once with a
whole group per CTA (their pipelined paths: 8 heads in one group, so the fp32 verify ring of 4 stages
is refilled); the update once more with its ring forced to wrap (claimed and fixed shares); the step
with a bf16 and an fp8 copy once more on nano4b's and super120b's tiles (P = 80 and 64, N = 128), and
without one there (the tf32 tensor-core replay); the step with the staggered_flush hint on 1,030 rows in
staggered phases, so that its order pass runs (more than one wave of CTAs) and takes two chunks of
rows (an fp8 copy; a bf16 checkpoint without one); on 24 rows, where the hint takes the fold split; and
in CTAs of two whole groups (step_groups_per_cta=2) with an fp8 and a bf16 copy. Every GDN op the same
way (gdn()): steps across folds and verify + commit rounds with random acceptance, materialize and
flush, the conventional update and update_snapshots, at K = V = 64 and 128, with no read copy, a bf16
and an fp8 one; verify with one v-head a CTA and with all of a row's; the fold over 1,030 rows; the step
on 4 rows in its row parts (the launch rule: 2 CTAs per (row, v-head) at V = 64, 4 at V = 128), on 1,030
rows whole, with and without the order pass (staggered_flush); with an fp32 checkpoint and no copy the
tile in chunks (one and two in flight, one and two parts, 4 and 1,030 rows). The other CTA shapes are
forced through replayssm_cuda.launch_overrides. Every KDA op (kda(): GDN's kernels with the decay per
key channel) as GDN's.

    python3 tools/sanitize_ops.py [mamba2] [gdn] [kda]      # all by default"""

import sys

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
    verified = torch.zeros(S, dtype=torch.int32, device=dev)
    for _ in range(2 * L + 1):
        x, dt, B, C, z = inputs(4)
        out = torch.empty_like(x)
        ops.mamba2_step(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, x, dt, A, B, C, out, D, z, dt_bias, True, 1,
                        slots, -1, backend="cuda")
    for T in (1, 3, 2, 3, 2):
        x, dt, B, C, z = inputs(4, T)
        ops.mamba2_verify(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, verified, x, dt, A, B, C, torch.empty_like(x),
                          D, z, dt_bias, True, slots, -1, backend="cuda")
        accepted = torch.randint(0, T + 1, (4,), device=dev, dtype=torch.int32)
        ops.mamba2_commit(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, verified, accepted, A, 3, slots, -1,
                          backend="cuda")
    ops.mamba2_materialize(ck, x_buf, B_buf, dt_buf, cursors, A, torch.empty(4, H, P, N, device=dev), slots, -1,
                           backend="cuda")
    ops.mamba2_flush(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, A, slots, -1, backend="cuda")
    ops.mamba2_flush(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, A, backend="cuda")
    x, dt, B, C, z = inputs(4)
    ops.mamba2_update(ck, x, dt, A, B, C, torch.empty_like(x), D, z, dt_bias, True, slots, -1, backend="cuda")


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


def mamba2():
    """Every Mamba-2 op (the list at the top)."""
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
    for (P2, N2), heads_per_cta, copy_dtype in [(t, h, c) for t in ((80, 128), (64, 128)) for h in (1, 64)
                                                for c in (torch.bfloat16, torch.float8_e4m3fn, None)]:
        with launch_overrides(step_heads_per_cta=heads_per_cta):
            step_across_a_fold(P2, N2, copy_dtype)
    # The order pass (staggered_flush, more than one wave of CTAs) over 1,030 rows in a random order with a
    # pad row, a quarter of the slots folding in each step: an fp32 checkpoint with an fp8 copy, and a bf16
    # checkpoint without a copy.
    S3 = 1100
    for ck_dtype, copy_dtype in ((torch.float32, torch.float8_e4m3fn), (torch.bfloat16, None)):
        ck = (0.1 * torch.randn(S3, H, P, N, device=dev)).to(ck_dtype)
        rc = rs = None
        if copy_dtype is not None:
            rc = torch.empty(S3, H, P, N, device=dev, dtype=copy_dtype)
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
                ops.mamba2_step(ck, rc, rs, x_buf, B_buf, dt_buf, cursors, x, dt, A, B, C, torch.empty_like(x), D,
                                z, dt_bias, True, 1, rows, -1, staggered_flush=True, backend="cuda")
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


# ---- Gated DeltaNet ------------------------------------------------------------------------------
# (H, HV, K, V): two v-heads a k-head, at both compiled head sizes.
GDN_K64, GDN_K128 = (2, 4, 64, 64), (2, 4, 128, 128)


class GdnLayer:
    """One GDN layer's cache on S slots (fp32 or bf16 checkpoint, optional read copy, zero buffers), its
    weights and random bf16 tokens; family "kda": a KDA layer (the gate input a, dt_bias and the buffered
    g per key channel)."""

    def __init__(self, dims, num_slots, ck_dtype=torch.float32, copy_dtype=None, family="gdn"):
        self.H, self.HV, self.K, self.V = H, HV, K, V = dims
        self.family = family
        self.gate = (K,) if family == "kda" else ()     # the gate's trailing dims: per key channel for KDA
        self.checkpoint = (0.1 * torch.randn(num_slots, HV, V, K, device=dev)).to(ck_dtype)
        self.read_copy = self.read_scale = None
        if copy_dtype is not None:
            self.read_copy = torch.empty(num_slots, HV, V, K, device=dev, dtype=copy_dtype)
            self.read_scale = torch.empty(num_slots, HV, V, device=dev) if copy_dtype == torch.float8_e4m3fn else None
            ops.make_read_copy(self.checkpoint, self.read_copy, self.read_scale, backend="cuda")
        self.buffers = (torch.zeros(num_slots, H, L, K, device=dev, dtype=torch.bfloat16),
                        torch.zeros(num_slots, HV, L, V, device=dev, dtype=torch.bfloat16),
                        torch.zeros(num_slots, HV, L, *self.gate, device=dev), torch.zeros(num_slots, HV, L, device=dev),
                        torch.zeros(num_slots, HV, L, V, device=dev))       # k, v, g, beta, u
        self.num_committed = (torch.arange(num_slots, device=dev) % L).int()  # folding beside replaying rows
        self.num_verified = torch.zeros(num_slots, dtype=torch.int32, device=dev)
        self.weights = (torch.log(0.05 + 0.45 * torch.rand(HV, device=dev)), 0.5 * torch.randn(HV, *self.gate, device=dev))

    def op(self, name):
        return getattr(ops, f"{self.family}_{name}")

    def cache(self):
        return (self.checkpoint, self.read_copy, self.read_scale, *self.buffers, self.num_committed)

    def tokens(self, batch, *T):
        """q, k, v, a, b, A_log, dt_bias, out."""
        q, k = (torch.randn(batch, *T, self.H, self.K, device=dev).bfloat16() for _ in range(2))
        v = torch.randn(batch, *T, self.HV, self.V, device=dev).bfloat16()
        a = torch.randn(batch, *T, self.HV, *self.gate, device=dev).bfloat16()
        b = torch.randn(batch, *T, self.HV, device=dev).bfloat16()
        return (q, k, v, a, b, *self.weights, torch.empty_like(v))

    def step(self, rows, staggered_flush=False):
        self.op("step")(*self.cache(), *self.tokens(rows.numel()), None, True, 1, rows, -1, staggered_flush,
                        backend="cuda")

    def spec_round(self, rows, T, max_draft_tokens):
        """verify T drafts, then commit 0 to T of them (the slots whose next verify would not fit fold)."""
        self.op("verify")(*self.cache(), self.num_verified, *self.tokens(rows.numel(), T), None, True, rows, -1,
                          backend="cuda")
        accepted = torch.randint(0, T + 1, (rows.numel(),), device=dev, dtype=torch.int32)
        self.op("commit")(*self.cache(), self.num_verified, accepted, max_draft_tokens, True, rows, -1, backend="cuda")


def gdn(family="gdn"):
    """Every GDN op (the list at the top); family "kda": every KDA op the same way."""
    # Every GDN op on 4 rows with a pad row and an out-of-range slot: the steps across a fold (cursors
    # staggered over the slots, so folding and replaying CTAs share each launch), verify + commit rounds with
    # random acceptance (T = 1, 3, 2 under max_draft_tokens 3: some rows have no room, some fold), materialize,
    # flush of the named slots and of all, the conventional update and update_snapshots; with no read copy, a
    # bf16 and an fp8 one (a bf16 copy's tile asked for over the set-up by the staged kernel, in 2 and 4
    # chunks), and a bf16 checkpoint with an fp8 copy. verify takes one v-head a CTA or all of a
    # row's (verify_heads_per_cta=64: on K = V = 128 more heads than the fp32 ring has stages, so it refills).
    for dims, ck_dtype, copy_dtype, verify_heads in [
            (GDN_K64, torch.float32, None, 1), (GDN_K64, torch.float32, torch.bfloat16, 64),
            (GDN_K64, torch.float32, torch.float8_e4m3fn, 1), (GDN_K64, torch.bfloat16, torch.float8_e4m3fn, 64),
            (GDN_K128, torch.float32, None, 64), (GDN_K128, torch.float32, torch.bfloat16, 1),
            (GDN_K128, torch.float32, torch.float8_e4m3fn, 1)]:
        layer = GdnLayer(dims, S, ck_dtype, copy_dtype, family)
        if copy_dtype is not None:
            ops.make_read_copy(layer.checkpoint, layer.read_copy, layer.read_scale, slots, -1, backend="cuda")
        for _ in range(L + 1):
            layer.step(slots)
        if ck_dtype == torch.float32 and copy_dtype in (None, torch.bfloat16):
            # The tile in chunks (no copy; one and two parts a v-head), the bf16 copy's staged kernel (which
            # the rule takes only where the CTAs outnumber the SMs; here by the override).
            for stages, parts in ((1, 1), (2, 2)):
                with launch_overrides(gdn_step_tile_stages=stages, gdn_step_parts=parts):
                    for _ in range(L + 1):
                        layer.step(slots)
        with launch_overrides(verify_heads_per_cta=verify_heads):
            for T in (1, 3, 2):
                layer.spec_round(slots, T, 3)
        layer.op("materialize")(layer.checkpoint, *layer.buffers, layer.num_committed,
                                torch.empty(4, layer.HV, layer.V, layer.K, device=dev), True, slots, -1, backend="cuda")
        layer.op("flush")(*layer.cache(), True, slots, -1, backend="cuda")
        layer.op("flush")(*layer.cache(), True, backend="cuda")
        state = layer.checkpoint.clone()
        for split in (0, 1):  # 16 KB CTAs and the split's 4 KB ones
            with launch_overrides(gdn_update_split=split):
                layer.op("update")(state, *layer.tokens(4), None, True, slots, -1, backend="cuda")
        q, k, v, a, b, A_log, dt_bias, out = layer.tokens(4, 3)
        snapshots = torch.empty(4, 3, layer.HV, layer.V, layer.K, device=dev, dtype=ck_dtype)
        layer.op("update_snapshots")(state, q, k, v, a, b, A_log, dt_bias, out, snapshots, None, True, slots, -1,
                                     backend="cuda")
    # Many rows: 1,030 of 1,100 slots in a random order with a pad row, an fp8 copy, cursors staggered. The
    # fold kernel (commit: the folding rows' (row, v-head) items of 4,120; flush: those of all 4,400) then
    # has more items than its grid of 2 CTAs an SM has ring stages (4 each), so the ring wraps, over rows
    # in several chunks of 256.
    layer = GdnLayer(GDN_K64, 1100, copy_dtype=torch.float8_e4m3fn, family=family)
    rows = torch.randperm(1100, device=dev)[:1030].int()
    rows[5] = -1
    layer.step(rows)
    layer.step(rows, staggered_flush=True)  # the order pass first (more than one wave of CTAs)
    layer.spec_round(rows, 2, 2)
    layer.op("flush")(*layer.cache(), True, backend="cuda")
    # The same rows with an fp32 checkpoint and no copy: the tile in chunks, one in flight (the rule), then
    # two under the staggered-flush hint.
    layer = GdnLayer(GDN_K64, 1100, family=family)
    layer.step(rows)
    with launch_overrides(gdn_step_tile_stages=2):
        layer.step(rows, staggered_flush=True)
    # And with a bf16 copy, whose tile the staged kernel asks for over the set-up by the rule here (GDN;
    # KDA keeps the one copy).
    layer = GdnLayer(GDN_K64, 1100, copy_dtype=torch.bfloat16, family=family)
    layer.step(rows)
    layer.step(rows, staggered_flush=True)


FAMILIES = {"mamba2": mamba2, "gdn": gdn, "kda": lambda: gdn("kda")}

if __name__ == "__main__":
    names = sys.argv[1:] or list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        sys.exit(f"usage: python3 tools/sanitize_ops.py [{' | '.join(FAMILIES)}]...; unknown {unknown}")
    for name in names:
        FAMILIES[name]()
    torch.cuda.synchronize()
    print(f"sanitize_ops: every op of {', '.join(names)} ran")
