"""Argument checks of the reference path, in Python.

Each validation layer runs once per call: the compiled ops check their arguments in C++ (csrc/api),
the PyTorch reference is checked here. `OP_CHECKS[name]` checks every argument of op `name` (the
schema's order, _schemas.py) and serves `replayssm_cuda.ops` (backend "reference", or "auto" where no
kernel takes the arguments) and the kernel that torch.ops.replayssm.* runs on the CPU and where no CUDA
kernel is compiled (_library.py). A cache checks its own tensors once, at construction, and calls only
the per-call parts (`mamba2_inputs`, `delta_inputs`, `slots`, ...) on its reference path.

Messages read "<op>: `<argument>` must <expectation>, got <what was given>"; bad types and dtypes
raise TypeError, everything else ValueError.
"""

from __future__ import annotations

import torch

CHECKPOINT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
READ_COPY_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)
WEIGHT_DTYPES = (torch.float32, torch.float64)
AUX_DTYPES = (torch.float32, torch.float64)


def dtype_text(d) -> str:
    return "None" if d is None else str(d).replace("torch.", "")


def _shape_text(shape) -> str:
    return "(" + ", ".join("*" if d is None else str(d) for d in shape) + ")"


def expect(op: str, name: str, t, *, shape=None, dtypes=None, device=None, optional=False,
           last_dim_contiguous=False):
    """Check one tensor argument; `shape` may hold None for 'any size'. Returns the tensor.

    The passing path is written for speed (plain loops, one read of each tensor attribute): the
    reference path of a cache runs a handful of these per call."""
    if t is None:
        if optional:
            return None
        raise ValueError(f"{op}: `{name}` is required, got None")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
    got = t.shape
    if shape is not None:
        ok = len(got) == len(shape)
        if ok:
            for e, g in zip(shape, got):
                if e is not None and e != g:
                    ok = False
                    break
        if not ok:
            raise ValueError(f"{op}: `{name}` must have shape {_shape_text(shape)}, got {tuple(got)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(dtype_text(d) for d in dtypes)
        raise TypeError(f"{op}: `{name}` must have dtype in {{{names}}}, got {dtype_text(t.dtype)}")
    if device is not None and t.device != device:
        raise ValueError(f"{op}: `{name}` must be on {device} (like the cache), got {t.device}")
    if last_dim_contiguous and got and got[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{op}: `{name}` must have a contiguous last dimension (stride 1), got strides {t.stride()}")
    return t


def slots_type(op: str, slots, name: str = "slots") -> None:
    """The one check every path makes on a slot list, compiled or not: a Python list is a TypeError
    here (the dispatcher would raise its own RuntimeError, and a cache method would fail on slots.shape)."""
    if slots is not None and not isinstance(slots, torch.Tensor):
        raise TypeError(f"{op}: `{name}` must be a torch.Tensor (int32 or int64, on the cache's device) or None, "
                        f"got {type(slots).__name__}")


def slots(op: str, slots_, batch: int, num_slots: int, device) -> None:
    """`slots` of a batch of rows: (batch,) int32/int64, or None when batch <= num_slots."""
    if slots_ is None:
        if batch > num_slots:
            raise ValueError(f"{op}: without `slots`, row r uses slot r, so batch ({batch}) must be "
                             f"<= num_slots ({num_slots}); pass `slots` (state_batch_indices)")
        return
    slots_type(op, slots_)
    expect(op, "slots", slots_, shape=(batch,), dtypes=INDEX_DTYPES, device=device)


def slot_list(op: str, name: str, t, device, optional: bool = True) -> None:
    """A list of slots an op acts on, (n,) int32/int64 (None: every slot, where allowed)."""
    if name == "slots":
        slots_type(op, t)
    expect(op, name, t, shape=(None,), dtypes=INDEX_DTYPES, device=device, optional=optional)


def read_copy(op: str, checkpoint, read_copy_, read_scale) -> None:
    if read_copy_ is None:
        if read_scale is not None:
            raise ValueError(f"{op}: `read_scale` is given but `read_copy` is None")
        return
    expect(op, "read_copy", read_copy_, shape=tuple(checkpoint.shape), dtypes=READ_COPY_DTYPES,
           device=checkpoint.device, last_dim_contiguous=True)
    if read_copy_.dtype == torch.float8_e4m3fn:
        expect(op, "read_scale", read_scale, shape=tuple(checkpoint.shape[:3]), dtypes=(torch.float32,),
               device=checkpoint.device)
    elif read_scale is not None:
        raise ValueError(f"{op}: `read_scale` is only for an fp8 read copy, got a "
                         f"{dtype_text(read_copy_.dtype)} read copy with a scale")


def rounding_seed(op: str, checkpoint, seed, checkpoint_name: str = "checkpoint") -> None:
    """None, or an int64 (2,) [seed, offset] on the cache's device, for a bf16 / fp16 checkpoint only."""
    if seed is None:
        return
    if checkpoint.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"{op}: `rounding_seed` (stochastic rounding) is only for a bfloat16 or float16 "
                         f"{checkpoint_name}, got a {dtype_text(checkpoint.dtype)} {checkpoint_name}; pass None")
    expect(op, "rounding_seed", seed, shape=(2,), dtypes=(torch.int64,), device=checkpoint.device)


def positive_int(op: str, name: str, value, upper=None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (upper is not None and value > upper):
        bound = f"in [1, {upper}]" if upper is not None else ">= 1"
        raise ValueError(f"{op}: `{name}` must be an int {bound}, got {value!r}")


def flag(op: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{op}: `{name}` must be a bool, got {value!r}")


def index(op: str, name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{op}: `{name}` must be an int, got {value!r}")


def state(op: str, name: str, t) -> None:
    expect(op, name, t, shape=(None, None, None, None), dtypes=CHECKPOINT_DTYPES, last_dim_contiguous=True)


# --------------------------------------------------------------------------------------------------
# Mamba-2
# --------------------------------------------------------------------------------------------------

def mamba2_cache(op, checkpoint, read_copy_, read_scale, x_buf, B_buf, dt_buf, num_committed) -> int:
    """The cache tensors; returns the buffer length L."""
    state(op, "checkpoint", checkpoint)
    S, H, P, N = checkpoint.shape
    dev = checkpoint.device
    read_copy(op, checkpoint, read_copy_, read_scale)
    expect(op, "x_buf", x_buf, shape=(S, H, None, P), dtypes=ACTIVATION_DTYPES, device=dev, last_dim_contiguous=True)
    L = x_buf.shape[2]
    expect(op, "B_buf", B_buf, shape=(S, None, L, N), dtypes=(x_buf.dtype,), device=dev, last_dim_contiguous=True)
    expect(op, "dt_buf", dt_buf, shape=(S, H, L), dtypes=AUX_DTYPES, device=dev)
    expect(op, "num_committed", num_committed, shape=(S,), dtypes=(torch.int32,), device=dev)
    return L


def num_verified(op, num_verified_, num_committed) -> None:
    """The per-slot count of entries the last verify appended (verify and commit): int32 (num_slots,),
    not the cursors' memory."""
    expect(op, "num_verified", num_verified_, shape=tuple(num_committed.shape), dtypes=(torch.int32,),
           device=num_committed.device)
    def byte_range(t):
        return t.data_ptr(), t.data_ptr() + (t.shape[0] - 1) * t.stride(0) * t.element_size() + t.element_size()

    (a0, a1), (b0, b1) = byte_range(num_verified_), byte_range(num_committed)
    if num_committed.shape[0] > 0 and a0 < b1 and b0 < a1:
        raise ValueError(f"{op}: `num_verified` must not share memory with num_committed, got overlapping tensors")


def error_word(op, word, device) -> None:
    """The optional error word of verify and commit: int32 (4,) [code, row, value, limit]."""
    expect(op, "error_word", word, shape=(4,), dtypes=(torch.int32,), device=device, optional=True)


def mamba2_weights(op, H: int, dev, A, D, dt_bias, prefix: str = "") -> None:
    expect(op, f"{prefix}A", A, shape=(H,), dtypes=WEIGHT_DTYPES, device=dev)
    expect(op, f"{prefix}D", D, shape=(H,), dtypes=WEIGHT_DTYPES, device=dev, optional=True)
    expect(op, f"{prefix}dt_bias", dt_bias, shape=(H,), dtypes=WEIGHT_DTYPES, device=dev, optional=True)


def mamba2_inputs(op, H: int, P: int, N: int, act, dev, x, dt, B, C, out, z, lead, groups=None) -> int:
    """Inputs of one token per row (lead = (batch,)) or of T tokens (lead = (batch, T)). `act`: the
    cache's activation dtype (x_buf's), or None where there is no buffer (the conventional update), in
    which case x sets it. `groups`: B_buf's group count, or None. Returns the group count G."""
    expect(op, "x", x, shape=(*lead, H, P), dtypes=ACTIVATION_DTYPES if act is None else (act,), device=dev,
           last_dim_contiguous=True)
    act = (x.dtype,)
    expect(op, "B", B, shape=(*lead, None, N), dtypes=act, device=dev, last_dim_contiguous=True)
    G = B.shape[-2]
    if G < 1 or H % G != 0:
        raise ValueError(f"{op}: the number of groups (B.shape[-2] = {G}) must divide the number of heads ({H})")
    if groups is not None and G != groups:
        raise ValueError(f"{op}: `B` has {G} groups but `B_buf` holds {groups}")
    expect(op, "C", C, shape=(*lead, G, N), dtypes=act, device=dev, last_dim_contiguous=True)
    expect(op, "dt", dt, shape=(*lead, H), dtypes=(x.dtype, torch.float32), device=dev)
    expect(op, "out", out, shape=(*lead, H, P), dtypes=act, device=dev, last_dim_contiguous=True)
    expect(op, "z", z, shape=(*lead, H, P), dtypes=act, device=dev, optional=True, last_dim_contiguous=True)
    return G


def lead_of(op, name, t, ndim):
    """The leading (batch[, T]) dims of a token input, after checking its rank."""
    expect(op, name, t, shape=(None,) * ndim)
    return tuple(t.shape[:ndim - 2])


def varlen(op: str, cu_seqlens, slots_, device, flat: dict) -> tuple[int, int]:
    """The layout arguments of a varlen verify: `cu_seqlens` (batch + 1,) int32/int64 on the cache's
    device, batch being the length of `slots` (row r uses slot r when it is None), and flattened inputs
    (a name -> tensor or None dict, the first one required) that all hold the same number of tokens in
    dim 0. Returns (batch, total_tokens). The values of cu_seqlens are not read here (a host sync):
    varlen_values checks them where reading costs nothing."""
    expect(op, "cu_seqlens", cu_seqlens, shape=(None,), dtypes=INDEX_DTYPES, device=device)
    if slots_ is None:
        if cu_seqlens.shape[0] < 1:
            raise ValueError(f"{op}: `cu_seqlens` must hold batch + 1 >= 1 offsets, got shape (0,)")
        batch = cu_seqlens.shape[0] - 1
    else:
        slot_list(op, "slots", slots_, device)
        batch = slots_.shape[0]
        if cu_seqlens.shape[0] != batch + 1:
            raise ValueError(f"{op}: `cu_seqlens` must have batch + 1 = {batch + 1} offsets for the {batch} rows "
                             f"of `slots`, got shape {tuple(cu_seqlens.shape)}")
    first = next(iter(flat))
    total = None
    for name, t in flat.items():
        if t is None and name != first:
            continue
        expect(op, name, t)
        if t.dim() < 2:
            raise ValueError(f"{op}: `{name}` must be (total_tokens, ...) with a feature dim, got shape "
                             f"{tuple(t.shape)}")
        if total is None:
            total = t.shape[0]
        elif t.shape[0] != total:
            raise ValueError(f"{op}: `{name}` must hold total_tokens = {total} tokens in dim 0 (like `{first}`), "
                             f"got shape {tuple(t.shape)}")
    return batch, total


def varlen_values(op: str, cu_seqlens, total: int, max_draft_tokens: int) -> None:
    """The values of `cu_seqlens`: 0 first, growing by 0 .. max_draft_tokens per row, at most total_tokens
    last (tokens after it are an engine's padding to a graph's size). Reads the tensor (a host sync), so
    only the reference path calls it."""
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        raise ValueError(f"{op}: `cu_seqlens` must start at 0, got cu_seqlens[0] = {cu[0]}")
    for r, (start, end) in enumerate(zip(cu, cu[1:])):
        if not 0 <= end - start <= max_draft_tokens:
            raise ValueError(f"{op}: `cu_seqlens` must grow by 0 .. max_draft_tokens = {max_draft_tokens} per row, "
                             f"got cu_seqlens[{r + 1}] - cu_seqlens[{r}] = {end} - {start}")
    if cu[-1] > total:
        raise ValueError(f"{op}: `cu_seqlens` must end at most at total_tokens = {total} (the inputs' dim 0), "
                         f"got cu_seqlens[-1] = {cu[-1]}")


def check_make_read_copy(checkpoint, read_copy_, read_scale=None, slots_=None, pad_slot_id=-1):
    op = "make_read_copy"
    state(op, "checkpoint", checkpoint)
    expect(op, "read_copy", read_copy_)
    read_copy(op, checkpoint, read_copy_, read_scale)
    slot_list(op, "slots", slots_, checkpoint.device)
    index(op, "pad_slot_id", pad_slot_id)


def check_mamba2_update(state_, x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus=False,
                        slots_=None, pad_slot_id=-1, rounding_seed_=None):
    op = "mamba2_update"
    state(op, "state", state_)
    _, H, P, N = state_.shape
    dev = state_.device
    lead = lead_of(op, "x", x, 3)
    mamba2_inputs(op, H, P, N, None, dev, x, dt, B, C, out, z, lead)
    mamba2_weights(op, H, dev, A, D, dt_bias)
    flag(op, "dt_softplus", dt_softplus)
    slots(op, slots_, lead[0], state_.shape[0], dev)
    index(op, "pad_slot_id", pad_slot_id)
    rounding_seed(op, state_, rounding_seed_, "state")


def check_mamba2_update_snapshots(state_, x, dt, A, B, C, out, snapshots, D=None, z=None, dt_bias=None,
                                  dt_softplus=False, slots_=None, pad_slot_id=-1):
    op = "mamba2_update_snapshots"
    state(op, "state", state_)
    _, H, P, N = state_.shape
    dev = state_.device
    lead = lead_of(op, "x", x, 4)
    mamba2_inputs(op, H, P, N, None, dev, x, dt, B, C, out, z, lead)
    mamba2_weights(op, H, dev, A, D, dt_bias)
    expect(op, "snapshots", snapshots, shape=(*lead, H, P, N), dtypes=CHECKPOINT_DTYPES, device=dev,
           last_dim_contiguous=True)
    flag(op, "dt_softplus", dt_softplus)
    slots(op, slots_, lead[0], state_.shape[0], dev)
    index(op, "pad_slot_id", pad_slot_id)


def check_mamba2_verify(checkpoint, read_copy_, read_scale, x_buf, B_buf, dt_buf, num_committed, num_verified_,
                        x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus=False,
                        slots_=None, pad_slot_id=-1, error_word_=None):
    op = "mamba2_verify"
    L = mamba2_cache(op, checkpoint, read_copy_, read_scale, x_buf, B_buf, dt_buf, num_committed)
    num_verified(op, num_verified_, num_committed)
    error_word(op, error_word_, checkpoint.device)
    S, H, P, N = checkpoint.shape
    lead = lead_of(op, "x", x, 4)
    if lead[1] > L:
        raise ValueError(f"{op}: T (x.shape[1] = {lead[1]}) must be <= the buffer length L = {L}")
    mamba2_inputs(op, H, P, N, x_buf.dtype, checkpoint.device, x, dt, B, C, out, z, lead, B_buf.shape[1])
    mamba2_weights(op, H, checkpoint.device, A, D, dt_bias)
    flag(op, "dt_softplus", dt_softplus)
    slots(op, slots_, lead[0], S, checkpoint.device)
    index(op, "pad_slot_id", pad_slot_id)


def check_mamba2_step(checkpoint, read_copy_, read_scale, x_buf, B_buf, dt_buf, num_committed,
                      x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus=False,
                      max_draft_tokens=1, slots_=None, pad_slot_id=-1, rounding_seed_=None, staggered_flush=False):
    op = "mamba2_step"
    flag(op, "staggered_flush", staggered_flush)
    L = mamba2_cache(op, checkpoint, read_copy_, read_scale, x_buf, B_buf, dt_buf, num_committed)
    S, H, P, N = checkpoint.shape
    positive_int(op, "max_draft_tokens", max_draft_tokens, L)
    lead = lead_of(op, "x", x, 3)
    mamba2_inputs(op, H, P, N, x_buf.dtype, checkpoint.device, x, dt, B, C, out, z, lead, B_buf.shape[1])
    mamba2_weights(op, H, checkpoint.device, A, D, dt_bias)
    flag(op, "dt_softplus", dt_softplus)
    slots(op, slots_, lead[0], S, checkpoint.device)
    index(op, "pad_slot_id", pad_slot_id)
    rounding_seed(op, checkpoint, rounding_seed_)


def check_mamba2_commit(checkpoint, read_copy_, read_scale, x_buf, B_buf, dt_buf, num_committed, num_verified_,
                        num_accepted, A, max_draft_tokens, slots_=None, pad_slot_id=-1, rounding_seed_=None,
                        error_word_=None):
    op = "mamba2_commit"
    L = mamba2_cache(op, checkpoint, read_copy_, read_scale, x_buf, B_buf, dt_buf, num_committed)
    num_verified(op, num_verified_, num_committed)
    error_word(op, error_word_, checkpoint.device)
    positive_int(op, "max_draft_tokens", max_draft_tokens, L)
    expect(op, "num_accepted", num_accepted, shape=(None,), dtypes=INDEX_DTYPES, device=checkpoint.device)
    expect(op, "A", A, shape=(checkpoint.shape[1],), dtypes=WEIGHT_DTYPES, device=checkpoint.device)
    slots(op, slots_, num_accepted.shape[0], checkpoint.shape[0], checkpoint.device)
    index(op, "pad_slot_id", pad_slot_id)
    rounding_seed(op, checkpoint, rounding_seed_)


def check_mamba2_flush(checkpoint, read_copy_, read_scale, x_buf, B_buf, dt_buf, num_committed, A,
                       slots_=None, pad_slot_id=-1, rounding_seed_=None):
    op = "mamba2_flush"
    mamba2_cache(op, checkpoint, read_copy_, read_scale, x_buf, B_buf, dt_buf, num_committed)
    expect(op, "A", A, shape=(checkpoint.shape[1],), dtypes=WEIGHT_DTYPES, device=checkpoint.device)
    slot_list(op, "slots", slots_, checkpoint.device)
    index(op, "pad_slot_id", pad_slot_id)
    rounding_seed(op, checkpoint, rounding_seed_)


def check_mamba2_materialize(checkpoint, x_buf, B_buf, dt_buf, num_committed, A, out, slots_=None, pad_slot_id=-1):
    op = "mamba2_materialize"
    mamba2_cache(op, checkpoint, None, None, x_buf, B_buf, dt_buf, num_committed)
    expect(op, "A", A, shape=(checkpoint.shape[1],), dtypes=WEIGHT_DTYPES, device=checkpoint.device)
    state_out(op, checkpoint, out)
    slots(op, slots_, out.shape[0], checkpoint.shape[0], checkpoint.device)
    index(op, "pad_slot_id", pad_slot_id)


def state_out(op, checkpoint, out) -> None:
    """materialize's output: (batch, *checkpoint.shape[1:]) float32 / float64."""
    expect(op, "out", out, shape=(None, *checkpoint.shape[1:]), dtypes=AUX_DTYPES, device=checkpoint.device)


# --------------------------------------------------------------------------------------------------
# Gated DeltaNet (family "gdn") and KDA (family "kda")
# --------------------------------------------------------------------------------------------------

def delta_cache(op, family, checkpoint, read_copy_, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf,
                num_committed):
    """The cache tensors; returns (H, L): q/k heads and buffer length."""
    state(op, "checkpoint", checkpoint)
    S, HV, V, K = checkpoint.shape
    dev = checkpoint.device
    read_copy(op, checkpoint, read_copy_, read_scale)
    expect(op, "k_buf", k_buf, shape=(S, None, None, K), dtypes=ACTIVATION_DTYPES, device=dev, last_dim_contiguous=True)
    H, L = k_buf.shape[1], k_buf.shape[2]
    if H < 1 or HV % H != 0:
        raise ValueError(f"{op}: the number of v-heads ({HV}) must be a multiple of the number of "
                         f"q/k heads (k_buf.shape[1] = {H})")
    expect(op, "v_buf", v_buf, shape=(S, HV, L, V), dtypes=(k_buf.dtype,), device=dev, last_dim_contiguous=True)
    g_shape = (S, HV, L, K) if family == "kda" else (S, HV, L)
    expect(op, "g_buf", g_buf, shape=g_shape, dtypes=AUX_DTYPES, device=dev)
    expect(op, "beta_buf", beta_buf, shape=(S, HV, L), dtypes=AUX_DTYPES, device=dev)
    expect(op, "u_buf", u_buf, shape=(S, HV, L, V), dtypes=AUX_DTYPES, device=dev, last_dim_contiguous=True)
    expect(op, "num_committed", num_committed, shape=(S,), dtypes=(torch.int32,), device=dev)
    return H, L


def delta_weights(op, family, HV: int, K: int, dev, A_log, dt_bias, prefix: str = "") -> None:
    expect(op, f"{prefix}A_log", A_log, shape=(HV,), dtypes=WEIGHT_DTYPES, device=dev)
    expect(op, f"{prefix}dt_bias", dt_bias, shape=(HV, K) if family == "kda" else (HV,), dtypes=WEIGHT_DTYPES,
           device=dev)


def delta_inputs(op, family, H: int, HV: int, V: int, K: int, act, dev, q, k, v, a, b, out, lead) -> None:
    """Inputs of one token per row (lead = (batch,)) or T tokens (lead = (batch, T)); `act` as in
    mamba2_inputs (k_buf's dtype, or None for the conventional update)."""
    expect(op, "q", q, shape=(*lead, H, K), dtypes=ACTIVATION_DTYPES if act is None else (act,), device=dev,
           last_dim_contiguous=True)
    act = (q.dtype,)
    expect(op, "k", k, shape=(*lead, H, K), dtypes=act, device=dev, last_dim_contiguous=True)
    expect(op, "v", v, shape=(*lead, HV, V), dtypes=act, device=dev, last_dim_contiguous=True)
    gate_shape = (*lead, HV, K) if family == "kda" else (*lead, HV)
    expect(op, "a", a, shape=gate_shape, dtypes=(q.dtype, torch.float32), device=dev)
    expect(op, "b", b, shape=(*lead, HV), dtypes=(q.dtype, torch.float32), device=dev)
    expect(op, "out", out, shape=(*lead, HV, V), dtypes=act, device=dev, last_dim_contiguous=True)


def scale(op: str, value) -> None:
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        raise ValueError(f"{op}: `scale` must be a float or None (K**-0.5), got {value!r}")


def _delta_checks(family: str) -> dict:
    """The full checks of the replay ops and the conventional updates of one delta-rule family."""

    def check_update(state_, q, k, v, a, b, A_log, dt_bias, out, scale_=None, use_qk_l2norm=True,
                     slots_=None, pad_slot_id=-1):
        op = f"{family}_update"
        state(op, "state", state_)
        _, HV, V, K = state_.shape
        expect(op, "q", q, shape=(None, None, None))
        H = q.shape[1]
        if H < 1 or HV % H != 0:
            raise ValueError(f"{op}: the number of v-heads ({HV}) must be a multiple of the "
                             f"number of q/k heads (q.shape[1] = {H})")
        delta_inputs(op, family, H, HV, V, K, None, state_.device, q, k, v, a, b, out, (q.shape[0],))
        delta_weights(op, family, HV, K, state_.device, A_log, dt_bias)
        scale(op, scale_)
        flag(op, "use_qk_l2norm", use_qk_l2norm)
        slots(op, slots_, q.shape[0], state_.shape[0], state_.device)
        index(op, "pad_slot_id", pad_slot_id)

    def check_update_snapshots(state_, q, k, v, a, b, A_log, dt_bias, out, snapshots, scale_=None,
                               use_qk_l2norm=True, slots_=None, pad_slot_id=-1):
        op = f"{family}_update_snapshots"
        state(op, "state", state_)
        _, HV, V, K = state_.shape
        expect(op, "q", q, shape=(None, None, None, None))
        batch, T, H = q.shape[:3]
        if H < 1 or HV % H != 0:
            raise ValueError(f"{op}: the number of v-heads ({HV}) must be a multiple of the "
                             f"number of q/k heads (q.shape[2] = {H})")
        delta_inputs(op, family, H, HV, V, K, None, state_.device, q, k, v, a, b, out, (batch, T))
        delta_weights(op, family, HV, K, state_.device, A_log, dt_bias)
        expect(op, "snapshots", snapshots, shape=(batch, T, HV, V, K), dtypes=CHECKPOINT_DTYPES, device=state_.device,
               last_dim_contiguous=True)
        scale(op, scale_)
        flag(op, "use_qk_l2norm", use_qk_l2norm)
        slots(op, slots_, batch, state_.shape[0], state_.device)
        index(op, "pad_slot_id", pad_slot_id)

    def check_verify(checkpoint, read_copy_, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                     num_verified_, q, k, v, a, b, A_log, dt_bias, out, scale_=None, use_qk_l2norm=True, slots_=None,
                     pad_slot_id=-1, error_word_=None):
        op = f"{family}_verify"
        H, L = delta_cache(op, family, checkpoint, read_copy_, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf,
                           num_committed)
        num_verified(op, num_verified_, num_committed)
        error_word(op, error_word_, checkpoint.device)
        _, HV, V, K = checkpoint.shape
        expect(op, "q", q, shape=(None, None, H, None))
        batch, T = q.shape[:2]
        if T > L:
            raise ValueError(f"{op}: T (q.shape[1] = {T}) must be <= the buffer length L = {L}")
        delta_inputs(op, family, H, HV, V, K, k_buf.dtype, checkpoint.device, q, k, v, a, b, out, (batch, T))
        delta_weights(op, family, HV, K, checkpoint.device, A_log, dt_bias)
        scale(op, scale_)
        flag(op, "use_qk_l2norm", use_qk_l2norm)
        slots(op, slots_, batch, checkpoint.shape[0], checkpoint.device)
        index(op, "pad_slot_id", pad_slot_id)

    def check_step(checkpoint, read_copy_, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                   q, k, v, a, b, A_log, dt_bias, out, scale_=None, use_qk_l2norm=True, max_draft_tokens=1,
                   slots_=None, pad_slot_id=-1, staggered_flush=False):
        op = f"{family}_step"
        flag(op, "staggered_flush", staggered_flush)
        H, L = delta_cache(op, family, checkpoint, read_copy_, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf,
                           num_committed)
        _, HV, V, K = checkpoint.shape
        positive_int(op, "max_draft_tokens", max_draft_tokens, L)
        expect(op, "q", q, shape=(None, H, None))
        delta_inputs(op, family, H, HV, V, K, k_buf.dtype, checkpoint.device, q, k, v, a, b, out, (q.shape[0],))
        delta_weights(op, family, HV, K, checkpoint.device, A_log, dt_bias)
        scale(op, scale_)
        flag(op, "use_qk_l2norm", use_qk_l2norm)
        slots(op, slots_, q.shape[0], checkpoint.shape[0], checkpoint.device)
        index(op, "pad_slot_id", pad_slot_id)

    def check_commit(checkpoint, read_copy_, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                     num_verified_, num_accepted, max_draft_tokens, use_qk_l2norm=True, slots_=None, pad_slot_id=-1,
                     error_word_=None):
        op = f"{family}_commit"
        _, L = delta_cache(op, family, checkpoint, read_copy_, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf,
                           num_committed)
        num_verified(op, num_verified_, num_committed)
        error_word(op, error_word_, checkpoint.device)
        positive_int(op, "max_draft_tokens", max_draft_tokens, L)
        expect(op, "num_accepted", num_accepted, shape=(None,), dtypes=INDEX_DTYPES, device=checkpoint.device)
        flag(op, "use_qk_l2norm", use_qk_l2norm)
        slots(op, slots_, num_accepted.shape[0], checkpoint.shape[0], checkpoint.device)
        index(op, "pad_slot_id", pad_slot_id)

    def check_flush(checkpoint, read_copy_, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                    use_qk_l2norm=True, slots_=None, pad_slot_id=-1):
        op = f"{family}_flush"
        delta_cache(op, family, checkpoint, read_copy_, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf,
                    num_committed)
        flag(op, "use_qk_l2norm", use_qk_l2norm)
        slot_list(op, "slots", slots_, checkpoint.device)
        index(op, "pad_slot_id", pad_slot_id)

    def check_materialize(checkpoint, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed, out,
                          use_qk_l2norm=True, slots_=None, pad_slot_id=-1):
        op = f"{family}_materialize"
        delta_cache(op, family, checkpoint, None, None, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed)
        state_out(op, checkpoint, out)
        flag(op, "use_qk_l2norm", use_qk_l2norm)
        slots(op, slots_, out.shape[0], checkpoint.shape[0], checkpoint.device)
        index(op, "pad_slot_id", pad_slot_id)

    return {f"{family}_update": check_update, f"{family}_update_snapshots": check_update_snapshots,
            f"{family}_verify": check_verify, f"{family}_step": check_step,
            f"{family}_commit": check_commit, f"{family}_flush": check_flush,
            f"{family}_materialize": check_materialize}


# --------------------------------------------------------------------------------------------------
# Family-independent cache ops
# --------------------------------------------------------------------------------------------------

def load_states(op, checkpoint, states, slots_) -> None:
    """load's per-call arguments: prefill states (batch, *checkpoint.shape[1:]) and their slots."""
    expect(op, "states", states, shape=(None, *checkpoint.shape[1:]), dtypes=CHECKPOINT_DTYPES,
           device=checkpoint.device)
    slots(op, slots_, states.shape[0], checkpoint.shape[0], checkpoint.device)


def check_load(checkpoint, read_copy_, read_scale, num_committed, states, slots_=None, pad_slot_id=-1):
    op = "load"
    expect(op, "checkpoint", checkpoint, shape=(None, None, None, None), dtypes=CHECKPOINT_DTYPES)
    read_copy(op, checkpoint, read_copy_, read_scale)
    expect(op, "num_committed", num_committed, shape=(checkpoint.shape[0],), dtypes=(torch.int32,),
           device=checkpoint.device)
    load_states(op, checkpoint, states, slots_)
    index(op, "pad_slot_id", pad_slot_id)


def _tensor_list(op: str, name: str, tensors) -> list:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}: `{name}` must be a list of tensors, got {type(tensors).__name__}")
    return list(tensors)


def check_reset(checkpoint, read_copy_, read_scale, buffers, num_committed, slots_=None, pad_slot_id=-1):
    op = "reset"
    expect(op, "checkpoint", checkpoint, shape=(None, None, None, None), dtypes=CHECKPOINT_DTYPES)
    S, dev = checkpoint.shape[0], checkpoint.device
    for name, t in (("read_copy", read_copy_), ("read_scale", read_scale)):
        expect(op, name, t, device=dev, optional=True)
        if t is not None and t.shape[:1] != (S,):
            raise ValueError(f"{op}: `{name}` must have num_slots = {S} slots in dim 0, got shape {tuple(t.shape)}")
    for i, t in enumerate(_tensor_list(op, "buffers", buffers)):
        expect(op, f"buffers[{i}]", t, device=dev)
        if t.dim() < 1 or t.shape[0] != S:
            raise ValueError(f"{op}: `buffers[{i}]` must have num_slots = {S} slots in dim 0, got shape {tuple(t.shape)}")
    expect(op, "num_committed", num_committed, shape=(S,), dtypes=(torch.int32,), device=dev)
    slot_list(op, "slots", slots_, dev)
    index(op, "pad_slot_id", pad_slot_id)


def check_stagger_cursors(buffers, num_committed, slots_=None, pad_slot_id=-1, period=1):
    op = "stagger_cursors"
    expect(op, "num_committed", num_committed, shape=(None,), dtypes=(torch.int32,))
    buffers = _tensor_list(op, "buffers", buffers)
    for i, t in enumerate(buffers):
        expect(op, f"buffers[{i}]", t, device=num_committed.device)
        if t.dim() < 3 or t.shape[0] != num_committed.shape[0]:
            raise ValueError(f"{op}: buffers[{i}] must be (num_slots={num_committed.shape[0]}, heads, buffer_len, ...), "
                             f"got shape {_shape_text(t.shape)}")
        if not isinstance(period, int) or isinstance(period, bool) or not 1 <= period <= t.shape[2]:
            raise ValueError(f"{op}: `period` must be an int in [1, buffer_len={t.shape[2]}], got {period!r}")
    if not buffers:
        positive_int(op, "period", period)
    slot_list(op, "slots", slots_, num_committed.device)
    index(op, "pad_slot_id", pad_slot_id)


def copy_pairs(op, src_slots, dst_slots, device) -> None:
    slots_type(op, src_slots, "src_slots")
    slots_type(op, dst_slots, "dst_slots")
    expect(op, "src_slots", src_slots, shape=(None,), dtypes=INDEX_DTYPES, device=device)
    expect(op, "dst_slots", dst_slots, shape=(src_slots.shape[0],), dtypes=INDEX_DTYPES, device=device)


def check_copy_slots(cache_tensors, src_slots, dst_slots, pad_slot_id=-1):
    op = "copy_slots"
    tensors = _slot_tensors(op, cache_tensors)
    copy_pairs(op, src_slots, dst_slots, tensors[0].device)
    index(op, "pad_slot_id", pad_slot_id)


def _slot_tensors(op, cache_tensors) -> list:
    """cache_tensors of a slot op: a non-empty list of tensors of num_slots slots on one device."""
    tensors = [t for t in _tensor_list(op, "cache_tensors", cache_tensors) if t is not None]
    if not tensors:
        raise ValueError(f"{op}: `cache_tensors` must hold at least one tensor, got none")
    expect(op, "cache_tensors[0]", tensors[0])
    if tensors[0].dim() < 1:
        raise ValueError(f"{op}: `cache_tensors[0]` must have a slot dim 0, got a 0-D tensor")
    num_slots, dev = tensors[0].shape[0], tensors[0].device
    for i, t in enumerate(tensors):
        expect(op, f"cache_tensors[{i}]", t, device=dev)
        if t.dim() < 1 or t.shape[0] != num_slots:
            raise ValueError(f"{op}: every cache tensor must have {num_slots} slots in dim 0, "
                             f"cache_tensors[{i}] has shape {tuple(t.shape)}")
    return tensors


def _slot_table(op, table) -> None:
    # The reference never reads the table (it holds device addresses); its type is still checked.
    expect(op, "slot_table", table, shape=(None,), dtypes=(torch.int64,))


def check_fill_slots_table(cache_tensors, slot_table, fill_values, fill_periods, slots_=None, pad_slot_id=-1):
    op = "fill_slots_table"
    tensors = _slot_tensors(op, cache_tensors)
    _slot_table(op, slot_table)
    for name, values in (("fill_values", fill_values), ("fill_periods", fill_periods)):
        if not isinstance(values, (list, tuple)) or len(values) != len(tensors):
            got = f"{len(values)} entries" if isinstance(values, (list, tuple)) else type(values).__name__
            raise ValueError(f"{op}: `{name}` must hold one entry per cache tensor ({len(tensors)}), got {got}")
    for i, (t, value, period) in enumerate(zip(tensors, fill_values, fill_periods)):
        if not isinstance(period, int) or isinstance(period, bool) or not 0 <= period < 2**31:
            raise ValueError(f"{op}: `fill_periods[{i}]` must be an int in [0, 2^31 - 1], got {period!r}")
        if period and (t.dtype != torch.int32 or t.dim() != 1):
            raise ValueError(f"{op}: `fill_periods[{i}]` = {period} needs an int32 (num_slots,) cursor tensor, got "
                             f"cache_tensors[{i}] of dtype {dtype_text(t.dtype)} and shape {tuple(t.shape)}")
        if value != 0 and t.dtype != torch.float32:
            raise ValueError(f"{op}: `fill_values[{i}]` must be 0 for a {dtype_text(t.dtype)} cache_tensors[{i}] "
                             f"(a non-zero fill needs a float32 tensor), got {value!r}")
    slot_list(op, "slots", slots_, tensors[0].device)
    index(op, "pad_slot_id", pad_slot_id)


def check_copy_slots_table(cache_tensors, slot_table, src_slots, dst_slots, pad_slot_id=-1):
    op = "copy_slots_table"
    tensors = _slot_tensors(op, cache_tensors)
    _slot_table(op, slot_table)
    copy_pairs(op, src_slots, dst_slots, tensors[0].device)
    index(op, "pad_slot_id", pad_slot_id)


# The list arguments of each family's *_layers ops (their schema's order) and the ones a group may leave
# empty (no layer has that tensor).
_LAYER_FIELDS = {
    "mamba2": ("checkpoints", "read_copies", "read_scales", "x_bufs", "B_bufs", "dt_bufs", "num_committed",
               "num_verified", "A", "rounding_seeds", "error_words"),
    "gdn": ("checkpoints", "read_copies", "read_scales", "k_bufs", "v_bufs", "g_bufs", "beta_bufs", "u_bufs",
            "num_committed", "num_verified", "error_words"),
}
_OPTIONAL_LAYER_FIELDS = ("read_copies", "read_scales", "rounding_seeds", "error_words")


def layer_lists(op, layer_table, lists, fields) -> int:
    """The layer lists of a *_layers op: one tensor per layer in each (or none in the optional ones),
    every layer with layer 0's shapes, strides and dtypes and on its device. Returns the layer count."""
    # The reference never reads the table (it holds device addresses); its type is still checked.
    expect(op, "layer_table", layer_table, shape=(None,), dtypes=(torch.int64,))
    named = dict(zip(fields, lists))
    for name, tensors in named.items():
        _tensor_list(op, name, tensors)
    num_layers = len(named["checkpoints"])
    if num_layers < 1:
        raise ValueError(f"{op}: `checkpoints` must hold one checkpoint per layer, got none")
    dev = named["checkpoints"][0].device if isinstance(named["checkpoints"][0], torch.Tensor) else None
    for name, tensors in named.items():
        if len(tensors) != num_layers and not (name in _OPTIONAL_LAYER_FIELDS and len(tensors) == 0):
            none = " or none" if name in _OPTIONAL_LAYER_FIELDS else ""
            raise ValueError(f"{op}: `{name}` must hold one tensor per layer ({num_layers}){none}, got {len(tensors)}")
        for i, t in enumerate(tensors):
            expect(op, f"{name}[{i}]", t, device=dev)
            t0 = tensors[0]
            for what, got, want in (("dtype", t.dtype, t0.dtype), ("shape", tuple(t.shape), tuple(t0.shape)),
                                    ("strides", t.stride(), t0.stride())):
                if got != want:
                    shown = (dtype_text(want), dtype_text(got)) if what == "dtype" else (want, got)
                    raise ValueError(f"{op}: layer {i}'s `{name}` must have layer 0's {what} {shown[0]}, got {shown[1]}")
    return num_layers


def _layer0(lists):
    return [None if len(t) == 0 else t[0] for t in lists]


def _layered(family, kind, layer_table, rest):
    """Checks the lists of {family}_{kind}_layers; returns (layer count, layer 0's tensors, the tail)."""
    fields = _LAYER_FIELDS[family]
    lists, tail = rest[:len(fields)], rest[len(fields):]
    num_layers = layer_lists(f"{family}_{kind}_layers", layer_table, lists, fields)
    return num_layers, _layer0(lists), tail


def _layers_out(op, out, num_layers, ck):
    expect(op, "out", out, shape=(num_layers, None, *ck.shape[1:]), dtypes=(torch.float32, torch.float64),
           device=ck.device)


def check_mamba2_commit_layers(layer_table, *rest):
    _, (ck, rc, rs, x, B, dt, nc, nv, A, seed, err), (num_accepted, max_draft_tokens, *tail) = \
        _layered("mamba2", "commit", layer_table, rest)
    check_mamba2_commit(ck, rc, rs, x, B, dt, nc, nv, num_accepted, A, max_draft_tokens, *tail, seed, err)


def check_mamba2_flush_layers(layer_table, *rest):
    _, (ck, rc, rs, x, B, dt, nc, nv, A, seed, err), tail = _layered("mamba2", "flush", layer_table, rest)
    check_mamba2_flush(ck, rc, rs, x, B, dt, nc, A, *tail, seed)


def check_mamba2_materialize_layers(layer_table, *rest):
    num_layers, (ck, rc, rs, x, B, dt, nc, nv, A, seed, err), (out, *tail) = \
        _layered("mamba2", "materialize", layer_table, rest)
    _layers_out("mamba2_materialize_layers", out, num_layers, ck)
    check_mamba2_materialize(ck, x, B, dt, nc, A, out[0], *tail)


_GDN_CHECKS = _delta_checks("gdn")


def check_gdn_commit_layers(layer_table, *rest):
    _, (ck, rc, rs, k, v, g, beta, u, nc, nv, err), tail = _layered("gdn", "commit", layer_table, rest)
    _GDN_CHECKS["gdn_commit"](ck, rc, rs, k, v, g, beta, u, nc, nv, *tail, err)


def check_gdn_flush_layers(layer_table, *rest):
    _, (ck, rc, rs, k, v, g, beta, u, nc, nv, err), tail = _layered("gdn", "flush", layer_table, rest)
    _GDN_CHECKS["gdn_flush"](ck, rc, rs, k, v, g, beta, u, nc, *tail)


def check_gdn_materialize_layers(layer_table, *rest):
    num_layers, (ck, rc, rs, k, v, g, beta, u, nc, nv, err), (out, *tail) = \
        _layered("gdn", "materialize", layer_table, rest)
    _layers_out("gdn_materialize_layers", out, num_layers, ck)
    _GDN_CHECKS["gdn_materialize"](ck, k, v, g, beta, u, nc, out[0], *tail)


OP_CHECKS = {
    "make_read_copy": check_make_read_copy,
    "mamba2_update": check_mamba2_update,
    "mamba2_step": check_mamba2_step,
    "mamba2_verify": check_mamba2_verify,
    "mamba2_commit": check_mamba2_commit,
    "mamba2_flush": check_mamba2_flush,
    "mamba2_materialize": check_mamba2_materialize,
    "mamba2_update_snapshots": check_mamba2_update_snapshots,
    "load": check_load,
    "reset": check_reset,
    "stagger_cursors": check_stagger_cursors,
    "copy_slots": check_copy_slots,
    "fill_slots_table": check_fill_slots_table,
    "copy_slots_table": check_copy_slots_table,
    "mamba2_commit_layers": check_mamba2_commit_layers,
    "mamba2_flush_layers": check_mamba2_flush_layers,
    "mamba2_materialize_layers": check_mamba2_materialize_layers,
    "gdn_commit_layers": check_gdn_commit_layers,
    "gdn_flush_layers": check_gdn_flush_layers,
    "gdn_materialize_layers": check_gdn_materialize_layers,
    **_GDN_CHECKS,
    **_delta_checks("kda"),
}
