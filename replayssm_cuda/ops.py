"""Functional ops: validate the arguments, then run the compiled kernel or the reference.

Every op here has the signature of ``torch.ops.replayssm.<name>`` plus one Python-only keyword,
``backend``:
    "auto"       the compiled kernel when the tensors are on CUDA and this build has it; otherwise the
                 PyTorch reference. On CUDA tensors without a compiled kernel it warns once per op
                 (never a silent slow path).
    "cuda"       the compiled kernel or an error saying why it is not available.
    "reference"  always the PyTorch reference (reference.py), on any device.

Outputs are caller-allocated and returned; cache tensors are updated in place. Validation errors are
``ValueError``/``TypeError`` whose text names the op, the argument, what was expected and what was given.
"""

from __future__ import annotations

import warnings

import torch

from . import _extension, reference

BACKENDS = ("auto", "cuda", "reference")
CHECKPOINT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
READ_COPY_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)

_warned_fallback: set[tuple[str, str]] = set()


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------

def _shape_text(shape) -> str:
    return "(" + ", ".join("*" if d is None else str(d) for d in shape) + ")"


def expect(op: str, name: str, t, *, shape=None, dtypes=None, device=None, optional=False,
           last_dim_contiguous=False):
    """Check one tensor argument; `shape` may hold None for 'any size'. Returns the tensor.

    Every eager call of an op runs a dozen of these (a CUDA graph runs none), so the passing path is
    written for speed: plain loops and one read of each tensor attribute."""
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
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{op}: `{name}` must have dtype in {{{names}}}, got {str(t.dtype).replace('torch.', '')}")
    if device is not None and t.device != device:
        raise ValueError(f"{op}: `{name}` must be on {device} (like the cache), got {t.device}")
    if last_dim_contiguous and got and got[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{op}: `{name}` must have a contiguous last dimension (stride 1), got strides {t.stride()}")
    return t


def _expect_slots(op: str, slots, batch: int, num_slots: int, device):
    if slots is None:
        if batch > num_slots:
            raise ValueError(f"{op}: without `slots`, row r uses slot r, so batch ({batch}) must be "
                             f"<= num_slots ({num_slots}); pass `slots` (state_batch_indices)")
        return
    expect(op, "slots", slots, shape=(batch,), dtypes=INDEX_DTYPES, device=device)


def _expect_read_copy(op: str, checkpoint, read_copy, read_scale):
    if read_copy is None:
        if read_scale is not None:
            raise ValueError(f"{op}: `read_scale` is given but `read_copy` is None")
        return
    expect(op, "read_copy", read_copy, shape=tuple(checkpoint.shape), dtypes=READ_COPY_DTYPES,
           device=checkpoint.device, last_dim_contiguous=True)
    if read_copy.dtype == torch.float8_e4m3fn:
        expect(op, "read_scale", read_scale, shape=tuple(checkpoint.shape[:3]), dtypes=(torch.float32,),
               device=checkpoint.device)
    elif read_scale is not None:
        raise ValueError(f"{op}: `read_scale` is only for an fp8 read copy, got a "
                         f"{str(read_copy.dtype).replace('torch.', '')} read copy with a scale")


def _expect_rounding_seed(op: str, checkpoint, rounding_seed, checkpoint_name: str = "checkpoint"):
    """rounding_seed: None, or an int64 (2,) tensor [seed, offset] on the cache's device, and only for a
    bf16 / fp16 checkpoint (stochastic rounding of its stores; reference.stochastic_round)."""
    if rounding_seed is None:
        return
    if checkpoint.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"{op}: `rounding_seed` (stochastic rounding) is only for a bfloat16 or float16 "
                         f"{checkpoint_name}, got a {_dtype_text(checkpoint.dtype)} {checkpoint_name}; pass None")
    expect(op, "rounding_seed", rounding_seed, shape=(2,), dtypes=(torch.int64,), device=checkpoint.device)


def _expect_positive_int(op: str, name: str, value, upper=None):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (upper is not None and value > upper):
        bound = f"in [1, {upper}]" if upper is not None else ">= 1"
        raise ValueError(f"{op}: `{name}` must be an int {bound}, got {value!r}")


# --------------------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------------------

def why_not_compiled(name: str) -> str:
    """Why op `name` would not run compiled: for error and warning texts."""
    if not _extension.is_compiled():
        return f"the compiled extension is not available ({_extension.load_error()})"
    return f"this build has no compiled kernel for {name} (compiled: {', '.join(_extension.compiled_ops())})"


def _run(name: str, backend: str, device: torch.device, reference_fn, *args, kernel_limit: str | None = None):
    """Run the compiled op or the reference. `kernel_limit` says why the compiled kernel cannot take
    these particular arguments (a shape or dtype it was not built for), or is None."""
    if backend not in BACKENDS:
        raise ValueError(f"{name}: `backend` must be one of {BACKENDS}, got {backend!r}")
    compiled = _extension.has_op(name) and kernel_limit is None
    if backend != "reference" and device.type == "cuda" and compiled:
        return getattr(torch.ops.replayssm, name)(*args)
    reason = why_not_compiled(name) if not _extension.has_op(name) else kernel_limit
    if backend == "cuda":
        if device.type != "cuda":
            raise ValueError(f"{name}: backend='cuda' needs CUDA tensors, got tensors on {device}")
        raise RuntimeError(f"{name}: backend='cuda' asked for, but {reason}")
    if backend == "auto" and device.type == "cuda" and (name, reason) not in _warned_fallback:
        _warned_fallback.add((name, reason))
        warnings.warn(f"replayssm_cuda: {name} runs the PyTorch reference on CUDA tensors because "
                      f"{reason}. Pass backend='reference' to accept this, or "
                      f"backend='cuda' to make it an error.", RuntimeWarning, stacklevel=3)
    return reference_fn(*args)


# What the compiled Mamba-2 kernels were built for (csrc/kernels/mamba2.cuh).
MAMBA2_KERNEL_SHAPES = {(64, 64), (64, 128), (80, 64), (80, 128), (128, 64), (128, 128)}
KERNEL_ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)
MAX_SNAPSHOT_TOKENS = 16          # csrc/kernels/mamba2_snapshots.cuh
MAX_COPY_SLOTS_PAIRS = 3072       # csrc/kernels/slot_ops.cuh: the one-launch gather's staging


def mamba2_kernel_limit(checkpoint, read_copy, x) -> str | None:
    """Why the compiled Mamba-2 kernels cannot take this cache and these activations, or None."""
    P, N = checkpoint.shape[2], checkpoint.shape[3]
    if (P, N) not in MAMBA2_KERNEL_SHAPES:
        return f"(head_dim, state_dim) = ({P}, {N}) has no compiled kernel (compiled: {sorted(MAMBA2_KERNEL_SHAPES)})"
    if checkpoint.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"a {_dtype_text(checkpoint.dtype)} checkpoint has no compiled kernel"
    if read_copy is not None and checkpoint.dtype != torch.float32 and read_copy.dtype != torch.float8_e4m3fn:
        return f"a {_dtype_text(read_copy.dtype)} read copy of a {_dtype_text(checkpoint.dtype)} checkpoint has no compiled kernel"
    if x.dtype not in KERNEL_ACTIVATION_DTYPES:
        return f"{_dtype_text(x.dtype)} activations have no compiled kernel (bfloat16, float16)"
    return None


# The speculative ops take up to this many draft tokens per verify (csrc/kernels/mamba2_spec.cuh).
KERNEL_MAX_DRAFT_TOKENS = 16


def mamba2_spec_kernel_limit(checkpoint, read_copy, activations, dt_buf, T=None, out=None) -> str | None:
    """Why the compiled verify/commit/flush/materialize kernels cannot take these arguments, or None.
    `activations` is x for verify, x_buf for the others; T the draft count (verify); out (materialize)."""
    limit = mamba2_kernel_limit(checkpoint, read_copy, activations)
    if limit is not None:
        return limit
    if dt_buf.dtype != torch.float32:
        return f"a {_dtype_text(dt_buf.dtype)} dt_buf has no compiled kernel (float32)"
    if T is not None and T > KERNEL_MAX_DRAFT_TOKENS:
        return f"T = {T} draft tokens exceed the compiled kernel's {KERNEL_MAX_DRAFT_TOKENS}"
    if out is not None and out.dtype != torch.float32:
        return f"a {_dtype_text(out.dtype)} out has no compiled kernel (float32)"
    return None


def _dtype_text(d) -> str:
    return str(d).replace("torch.", "")


# --------------------------------------------------------------------------------------------------
# Read copies and generic cache ops
# --------------------------------------------------------------------------------------------------

def make_read_copy(checkpoint, read_copy, read_scale=None, slots=None, pad_slot_id: int = -1, *, backend="auto"):
    """Refresh the read copy (bf16/fp16/fp8-e4m3 + fp32 scales) of the named slots from the checkpoint."""
    op = "make_read_copy"
    expect(op, "checkpoint", checkpoint, shape=(None, None, None, None), dtypes=CHECKPOINT_DTYPES,
           last_dim_contiguous=True)
    expect(op, "read_copy", read_copy)
    _expect_read_copy(op, checkpoint, read_copy, read_scale)
    if slots is not None:
        expect(op, "slots", slots, shape=(None,), dtypes=INDEX_DTYPES, device=checkpoint.device)
    return _run(op, backend, checkpoint.device, reference.make_read_copy,
                checkpoint, read_copy, read_scale, slots, pad_slot_id)


# --------------------------------------------------------------------------------------------------
# Mamba-2
# --------------------------------------------------------------------------------------------------

def _expect_mamba2_inputs(op, checkpoint, x, dt, A, B, C, out, D, z, dt_bias, lead):
    """Inputs of one Mamba-2 token (lead = (batch,)) or of T tokens (lead = (batch, T))."""
    _, H, P, N = checkpoint.shape
    dev = checkpoint.device
    expect(op, "x", x, shape=(*lead, H, P), dtypes=ACTIVATION_DTYPES, device=dev, last_dim_contiguous=True)
    act = (x.dtype,)
    expect(op, "B", B, shape=(*lead, None, N), dtypes=act, device=dev, last_dim_contiguous=True)
    G = B.shape[-2]
    if G < 1 or H % G != 0:
        raise ValueError(f"{op}: the number of groups (B.shape[-2] = {G}) must divide the number of heads ({H})")
    expect(op, "C", C, shape=(*lead, G, N), dtypes=act, device=dev, last_dim_contiguous=True)
    expect(op, "dt", dt, shape=(*lead, H), dtypes=(x.dtype, torch.float32), device=dev)
    expect(op, "A", A, shape=(H,), dtypes=(torch.float32, torch.float64), device=dev)
    expect(op, "out", out, shape=(*lead, H, P), dtypes=act, device=dev, last_dim_contiguous=True)
    expect(op, "D", D, shape=(H,), dtypes=(torch.float32, torch.float64), device=dev, optional=True)
    expect(op, "z", z, shape=(*lead, H, P), dtypes=act, device=dev, optional=True, last_dim_contiguous=True)
    expect(op, "dt_bias", dt_bias, shape=(H,), dtypes=(torch.float32, torch.float64), device=dev, optional=True)
    return G


def _expect_mamba2_cache(op, checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed):
    expect(op, "checkpoint", checkpoint, shape=(None, None, None, None), dtypes=CHECKPOINT_DTYPES,
           last_dim_contiguous=True)
    S, H, P, N = checkpoint.shape
    dev = checkpoint.device
    _expect_read_copy(op, checkpoint, read_copy, read_scale)
    expect(op, "x_buf", x_buf, shape=(S, H, None, P), dtypes=ACTIVATION_DTYPES, device=dev, last_dim_contiguous=True)
    L = x_buf.shape[2]
    expect(op, "B_buf", B_buf, shape=(S, None, L, N), dtypes=(x_buf.dtype,), device=dev, last_dim_contiguous=True)
    expect(op, "dt_buf", dt_buf, shape=(S, H, L), dtypes=(torch.float32, torch.float64), device=dev)
    expect(op, "num_committed", num_committed, shape=(S,), dtypes=(torch.int32,), device=dev)
    return L


def mamba2_update(state, x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus=False,
                  slots=None, pad_slot_id: int = -1, rounding_seed=None, *, backend="auto"):
    """Conventional T=1 Mamba-2 decode (read, update and write the state). See reference.mamba2_update.
    rounding_seed: int64 (2,) [seed, offset] for stochastic rounding of a bf16 / fp16 state, or None."""
    op = "mamba2_update"
    expect(op, "state", state, shape=(None, None, None, None), dtypes=CHECKPOINT_DTYPES, last_dim_contiguous=True)
    _expect_mamba2_inputs(op, state, x, dt, A, B, C, out, D, z, dt_bias, (x.shape[0],) if x is not None else (0,))
    _expect_slots(op, slots, x.shape[0], state.shape[0], state.device)
    _expect_rounding_seed(op, state, rounding_seed, "state")
    _run(op, backend, state.device, reference.mamba2_update,
                state, x, dt, A, B, C, out, D, z, dt_bias, bool(dt_softplus), slots, pad_slot_id, rounding_seed,
                kernel_limit=mamba2_kernel_limit(state, None, x))
    return out  # the compiled ops return nothing


def mamba2_update_snapshots(state, x, dt, A, B, C, out, snapshots, D=None, z=None, dt_bias=None,
                            dt_softplus=False, slots=None, pad_slot_id: int = -1, *, backend="auto"):
    """Conventional speculative step: T tokens per row from the state, the state after every token into
    `snapshots` (batch, T, H, P, N); `state` is only read. See reference.mamba2_update_snapshots."""
    op = "mamba2_update_snapshots"
    expect(op, "state", state, shape=(None, None, None, None), dtypes=CHECKPOINT_DTYPES, last_dim_contiguous=True)
    expect(op, "x", x, shape=(None, None, None, None))
    batch, T = x.shape[:2]
    _expect_mamba2_inputs(op, state, x, dt, A, B, C, out, D, z, dt_bias, (batch, T))
    expect(op, "snapshots", snapshots, shape=(batch, T, *state.shape[1:]), dtypes=CHECKPOINT_DTYPES,
           device=state.device, last_dim_contiguous=True)
    _expect_slots(op, slots, batch, state.shape[0], state.device)
    _run(op, backend, state.device, reference.mamba2_update_snapshots,
         state, x, dt, A, B, C, out, snapshots, D, z, dt_bias, bool(dt_softplus), slots, pad_slot_id,
         kernel_limit=_snapshots_kernel_limit(state, x, snapshots))
    return out  # the compiled ops return nothing


def _snapshots_kernel_limit(state, x, snapshots) -> str | None:
    """Why the compiled mamba2_update_snapshots cannot take these tensors, or None."""
    limit = mamba2_kernel_limit(state, None, x)
    if limit is not None:
        return limit
    if snapshots.dtype != state.dtype:
        return (f"{_dtype_text(snapshots.dtype)} snapshots of a {_dtype_text(state.dtype)} state have no compiled "
                f"kernel (it writes snapshots in the state dtype)")
    if x.shape[1] > MAX_SNAPSHOT_TOKENS:
        return f"T = {x.shape[1]} tokens exceed the compiled kernel's {MAX_SNAPSHOT_TOKENS}"
    return None


def mamba2_verify(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed,
                  x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus=False,
                  slots=None, pad_slot_id: int = -1, *, backend="auto"):
    """Outputs of T draft tokens; entries appended after the committed history. See reference."""
    op = "mamba2_verify"
    L = _expect_mamba2_cache(op, checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed)
    expect(op, "x", x, shape=(None, None, None, None))
    batch, T = x.shape[:2]
    if T > L:
        raise ValueError(f"{op}: T (x.shape[1] = {T}) must be <= the buffer length L = {L}")
    G = _expect_mamba2_inputs(op, checkpoint, x, dt, A, B, C, out, D, z, dt_bias, (batch, T))
    if G != B_buf.shape[1]:
        raise ValueError(f"{op}: `B` has {G} groups but `B_buf` holds {B_buf.shape[1]}")
    _expect_slots(op, slots, batch, checkpoint.shape[0], checkpoint.device)
    _run(op, backend, checkpoint.device, reference.mamba2_verify,
         checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed,
         x, dt, A, B, C, out, D, z, dt_bias, bool(dt_softplus), slots, pad_slot_id,
         kernel_limit=mamba2_spec_kernel_limit(checkpoint, read_copy, x, dt_buf, T=T))
    return out  # the compiled ops return nothing


def mamba2_step(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed,
                x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus=False,
                max_draft_tokens: int = 1, slots=None, pad_slot_id: int = -1, rounding_seed=None,
                staggered_flush: bool = False, *, backend="auto"):
    """T=1 replay decode with the fold fused in. See reference.mamba2_step. rounding_seed: int64 (2,)
    [seed, offset] for stochastic rounding of a bf16 / fp16 checkpoint's folds, or None.
    staggered_flush: a launch hint, no change to the results: True when the slots fold at different
    steps (Mamba2Cache(staggered_flush=True), or continuous batching once requests have come and gone),
    False when they fold together (a batch admitted at once). The kernel then sizes its CTAs so that a
    step's few folding CTAs do not outlast it and, with a read copy, runs a small launch first that puts
    the folding rows at the front of the grid (True), or sizes them for the replay alone (False)."""
    op = "mamba2_step"
    if not isinstance(staggered_flush, bool):
        raise ValueError(f"{op}: `staggered_flush` must be a bool, got {staggered_flush!r}")
    L = _expect_mamba2_cache(op, checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed)
    _expect_positive_int(op, "max_draft_tokens", max_draft_tokens, L)
    expect(op, "x", x, shape=(None, None, None))
    G = _expect_mamba2_inputs(op, checkpoint, x, dt, A, B, C, out, D, z, dt_bias, (x.shape[0],))
    if G != B_buf.shape[1]:
        raise ValueError(f"{op}: `B` has {G} groups but `B_buf` holds {B_buf.shape[1]}")
    _expect_slots(op, slots, x.shape[0], checkpoint.shape[0], checkpoint.device)
    _expect_rounding_seed(op, checkpoint, rounding_seed)
    _run(op, backend, checkpoint.device, reference.mamba2_step,
                checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed,
                x, dt, A, B, C, out, D, z, dt_bias, bool(dt_softplus), max_draft_tokens, slots, pad_slot_id,
                rounding_seed, staggered_flush, kernel_limit=mamba2_kernel_limit(checkpoint, read_copy, x))
    return out  # the compiled ops return nothing


def mamba2_commit(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, num_accepted,
                  A, max_draft_tokens: int, slots=None, pad_slot_id: int = -1, rounding_seed=None, *,
                  backend="auto"):
    """Accept verified entries (a device-side cursor move) and fold where the next verify would not fit.
    rounding_seed: as in mamba2_step."""
    op = "mamba2_commit"
    L = _expect_mamba2_cache(op, checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed)
    _expect_positive_int(op, "max_draft_tokens", max_draft_tokens, L)
    expect(op, "num_accepted", num_accepted, shape=(None,), dtypes=INDEX_DTYPES, device=checkpoint.device)
    expect(op, "A", A, shape=(checkpoint.shape[1],), dtypes=(torch.float32, torch.float64), device=checkpoint.device)
    _expect_slots(op, slots, num_accepted.shape[0], checkpoint.shape[0], checkpoint.device)
    _expect_rounding_seed(op, checkpoint, rounding_seed)
    return _run(op, backend, checkpoint.device, reference.mamba2_commit,
                checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, num_accepted,
                A, max_draft_tokens, slots, pad_slot_id, rounding_seed,
                kernel_limit=mamba2_spec_kernel_limit(checkpoint, read_copy, x_buf, dt_buf))


def mamba2_flush(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, A,
                 slots=None, pad_slot_id: int = -1, rounding_seed=None, *, backend="auto"):
    """Fold everything committed into the checkpoints of the named slots (all when None).
    rounding_seed: as in mamba2_step."""
    op = "mamba2_flush"
    _expect_mamba2_cache(op, checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed)
    expect(op, "A", A, shape=(checkpoint.shape[1],), dtypes=(torch.float32, torch.float64), device=checkpoint.device)
    if slots is not None:
        expect(op, "slots", slots, shape=(None,), dtypes=INDEX_DTYPES, device=checkpoint.device)
    _expect_rounding_seed(op, checkpoint, rounding_seed)
    return _run(op, backend, checkpoint.device, reference.mamba2_flush,
                checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, A, slots, pad_slot_id,
                rounding_seed, kernel_limit=mamba2_spec_kernel_limit(checkpoint, read_copy, x_buf, dt_buf))


def mamba2_materialize(checkpoint, x_buf, B_buf, dt_buf, num_committed, A, out,
                       slots=None, pad_slot_id: int = -1, *, backend="auto"):
    """Full-precision state at the committed position into `out` (batch, H, P, N); cache unchanged."""
    op = "mamba2_materialize"
    _expect_mamba2_cache(op, checkpoint, None, None, x_buf, B_buf, dt_buf, num_committed)
    expect(op, "A", A, shape=(checkpoint.shape[1],), dtypes=(torch.float32, torch.float64), device=checkpoint.device)
    expect(op, "out", out, shape=(None, *checkpoint.shape[1:]), dtypes=(torch.float32, torch.float64),
           device=checkpoint.device)
    _expect_slots(op, slots, out.shape[0], checkpoint.shape[0], checkpoint.device)
    _run(op, backend, checkpoint.device, reference.mamba2_materialize,
         checkpoint, x_buf, B_buf, dt_buf, num_committed, A, out, slots, pad_slot_id,
         kernel_limit=mamba2_spec_kernel_limit(checkpoint, None, x_buf, dt_buf, out=out))
    return out  # the compiled ops return nothing


# --------------------------------------------------------------------------------------------------
# Gated DeltaNet (family "gdn") and KDA (family "kda")
# --------------------------------------------------------------------------------------------------

def _expect_delta_cache(op, family, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf,
                        u_buf, num_committed):
    expect(op, "checkpoint", checkpoint, shape=(None, None, None, None), dtypes=CHECKPOINT_DTYPES,
           last_dim_contiguous=True)
    S, HV, V, K = checkpoint.shape
    dev = checkpoint.device
    _expect_read_copy(op, checkpoint, read_copy, read_scale)
    expect(op, "k_buf", k_buf, shape=(S, None, None, K), dtypes=ACTIVATION_DTYPES, device=dev, last_dim_contiguous=True)
    H, L = k_buf.shape[1], k_buf.shape[2]
    if H < 1 or HV % H != 0:
        raise ValueError(f"{op}: the number of v-heads ({HV}) must be a multiple of the number of "
                         f"q/k heads (k_buf.shape[1] = {H})")
    aux = (torch.float32, torch.float64)
    expect(op, "v_buf", v_buf, shape=(S, HV, L, V), dtypes=(k_buf.dtype,), device=dev, last_dim_contiguous=True)
    g_shape = (S, HV, L, K) if family == "kda" else (S, HV, L)
    expect(op, "g_buf", g_buf, shape=g_shape, dtypes=aux, device=dev)
    expect(op, "beta_buf", beta_buf, shape=(S, HV, L), dtypes=aux, device=dev)
    expect(op, "u_buf", u_buf, shape=(S, HV, L, V), dtypes=aux, device=dev, last_dim_contiguous=True)
    expect(op, "num_committed", num_committed, shape=(S,), dtypes=(torch.int32,), device=dev)
    return H, L


def _expect_delta_inputs(op, family, checkpoint, H, q, k, v, a, b, A_log, dt_bias, out, lead):
    _, HV, V, K = checkpoint.shape
    dev = checkpoint.device
    expect(op, "q", q, shape=(*lead, H, K), dtypes=ACTIVATION_DTYPES, device=dev, last_dim_contiguous=True)
    act = (q.dtype,)
    expect(op, "k", k, shape=(*lead, H, K), dtypes=act, device=dev, last_dim_contiguous=True)
    expect(op, "v", v, shape=(*lead, HV, V), dtypes=act, device=dev, last_dim_contiguous=True)
    gate_shape = (*lead, HV, K) if family == "kda" else (*lead, HV)
    expect(op, "a", a, shape=gate_shape, dtypes=(q.dtype, torch.float32), device=dev)
    expect(op, "b", b, shape=(*lead, HV), dtypes=(q.dtype, torch.float32), device=dev)
    expect(op, "A_log", A_log, shape=(HV,), dtypes=(torch.float32, torch.float64), device=dev)
    expect(op, "dt_bias", dt_bias, shape=(HV, K) if family == "kda" else (HV,),
           dtypes=(torch.float32, torch.float64), device=dev)
    expect(op, "out", out, shape=(*lead, HV, V), dtypes=act, device=dev, last_dim_contiguous=True)


def _delta_ops(family: str):
    """The six replay ops and the conventional update of one delta-rule family (gdn or kda)."""

    def update(state, q, k, v, a, b, A_log, dt_bias, out, scale=None, use_qk_l2norm=True,
               slots=None, pad_slot_id: int = -1, *, backend="auto"):
        op = f"{family}_update"
        expect(op, "state", state, shape=(None, None, None, None), dtypes=CHECKPOINT_DTYPES, last_dim_contiguous=True)
        expect(op, "q", q, shape=(None, None, None))
        if state.shape[1] % q.shape[1] != 0:
            raise ValueError(f"{op}: the number of v-heads ({state.shape[1]}) must be a multiple of the "
                             f"number of q/k heads (q.shape[1] = {q.shape[1]})")
        _expect_delta_inputs(op, family, state, q.shape[1], q, k, v, a, b, A_log, dt_bias, out, (q.shape[0],))
        _expect_slots(op, slots, q.shape[0], state.shape[0], state.device)
        _run(op, backend, state.device, reference.delta_update,
                    state, q, k, v, a, b, A_log, dt_bias, out, scale, bool(use_qk_l2norm), slots, pad_slot_id)
        return out  # the compiled ops return nothing

    def verify(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
               q, k, v, a, b, A_log, dt_bias, out, scale=None, use_qk_l2norm=True,
               slots=None, pad_slot_id: int = -1, *, backend="auto"):
        op = f"{family}_verify"
        H, L = _expect_delta_cache(op, family, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf,
                                   beta_buf, u_buf, num_committed)
        expect(op, "q", q, shape=(None, None, H, None))
        batch, T = q.shape[:2]
        if T > L:
            raise ValueError(f"{op}: T (q.shape[1] = {T}) must be <= the buffer length L = {L}")
        _expect_delta_inputs(op, family, checkpoint, H, q, k, v, a, b, A_log, dt_bias, out, (batch, T))
        _expect_slots(op, slots, batch, checkpoint.shape[0], checkpoint.device)
        _run(op, backend, checkpoint.device, reference.delta_verify,
                    checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                    q, k, v, a, b, A_log, dt_bias, out, scale, bool(use_qk_l2norm), slots, pad_slot_id)
        return out  # the compiled ops return nothing

    def step(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
             q, k, v, a, b, A_log, dt_bias, out, scale=None, use_qk_l2norm=True, max_draft_tokens: int = 1,
             slots=None, pad_slot_id: int = -1, *, backend="auto"):
        op = f"{family}_step"
        H, L = _expect_delta_cache(op, family, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf,
                                   beta_buf, u_buf, num_committed)
        _expect_positive_int(op, "max_draft_tokens", max_draft_tokens, L)
        expect(op, "q", q, shape=(None, H, None))
        _expect_delta_inputs(op, family, checkpoint, H, q, k, v, a, b, A_log, dt_bias, out, (q.shape[0],))
        _expect_slots(op, slots, q.shape[0], checkpoint.shape[0], checkpoint.device)
        _run(op, backend, checkpoint.device, reference.delta_step,
                    checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                    q, k, v, a, b, A_log, dt_bias, out, scale, bool(use_qk_l2norm), max_draft_tokens,
                    slots, pad_slot_id)
        return out  # the compiled ops return nothing

    def commit(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
               num_accepted, max_draft_tokens: int, use_qk_l2norm=True, slots=None, pad_slot_id: int = -1,
               *, backend="auto"):
        op = f"{family}_commit"
        _, L = _expect_delta_cache(op, family, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf,
                                   beta_buf, u_buf, num_committed)
        _expect_positive_int(op, "max_draft_tokens", max_draft_tokens, L)
        expect(op, "num_accepted", num_accepted, shape=(None,), dtypes=INDEX_DTYPES, device=checkpoint.device)
        _expect_slots(op, slots, num_accepted.shape[0], checkpoint.shape[0], checkpoint.device)
        return _run(op, backend, checkpoint.device, reference.delta_commit,
                    checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                    num_accepted, max_draft_tokens, bool(use_qk_l2norm), slots, pad_slot_id)

    def flush(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
              use_qk_l2norm=True, slots=None, pad_slot_id: int = -1, *, backend="auto"):
        op = f"{family}_flush"
        _expect_delta_cache(op, family, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf,
                            beta_buf, u_buf, num_committed)
        if slots is not None:
            expect(op, "slots", slots, shape=(None,), dtypes=INDEX_DTYPES, device=checkpoint.device)
        return _run(op, backend, checkpoint.device, reference.delta_flush,
                    checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
                    bool(use_qk_l2norm), slots, pad_slot_id)

    def materialize(checkpoint, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed, out,
                    use_qk_l2norm=True, slots=None, pad_slot_id: int = -1, *, backend="auto"):
        op = f"{family}_materialize"
        _expect_delta_cache(op, family, checkpoint, None, None, k_buf, v_buf, g_buf, beta_buf, u_buf,
                            num_committed)
        expect(op, "out", out, shape=(None, *checkpoint.shape[1:]), dtypes=(torch.float32, torch.float64),
               device=checkpoint.device)
        _expect_slots(op, slots, out.shape[0], checkpoint.shape[0], checkpoint.device)
        _run(op, backend, checkpoint.device, reference.delta_materialize,
                    checkpoint, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed, out,
                    bool(use_qk_l2norm), slots, pad_slot_id)
        return out  # the compiled ops return nothing

    return update, verify, step, commit, flush, materialize


gdn_update, gdn_verify, gdn_step, gdn_commit, gdn_flush, gdn_materialize = _delta_ops("gdn")
kda_update, kda_verify, kda_step, kda_commit, kda_flush, kda_materialize = _delta_ops("kda")


# --------------------------------------------------------------------------------------------------
# Family-independent cache ops
# --------------------------------------------------------------------------------------------------

def load(checkpoint, read_copy, read_scale, num_committed, states, slots=None, pad_slot_id: int = -1, *,
         backend="auto"):
    """Write prefill states (batch, *checkpoint.shape[1:]) into the named slots, regenerate their read
    copies and empty their buffers."""
    op = "load"
    expect(op, "checkpoint", checkpoint, shape=(None, None, None, None), dtypes=CHECKPOINT_DTYPES)
    _expect_read_copy(op, checkpoint, read_copy, read_scale)
    expect(op, "num_committed", num_committed, shape=(checkpoint.shape[0],), dtypes=(torch.int32,),
           device=checkpoint.device)
    expect(op, "states", states, shape=(None, *checkpoint.shape[1:]), dtypes=CHECKPOINT_DTYPES,
           device=checkpoint.device)
    _expect_slots(op, slots, states.shape[0], checkpoint.shape[0], checkpoint.device)
    limit = None
    if checkpoint.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        limit = f"a {_dtype_text(checkpoint.dtype)} checkpoint has no compiled kernel"
    elif states.dtype not in (torch.float32, checkpoint.dtype):
        limit = (f"{_dtype_text(states.dtype)} states for a {_dtype_text(checkpoint.dtype)} checkpoint have no "
                 f"compiled kernel (float32 or the checkpoint dtype)")
    return _run(op, backend, checkpoint.device, reference.load,
                checkpoint, read_copy, read_scale, num_committed, states, slots, pad_slot_id, kernel_limit=limit)


def reset(checkpoint, read_copy, read_scale, buffers, num_committed, slots=None, pad_slot_id: int = -1, *,
          backend="auto"):
    """Zero the checkpoint, read copy, buffers and cursors of the named slots (all when None)."""
    op = "reset"
    expect(op, "checkpoint", checkpoint, shape=(None, None, None, None), dtypes=CHECKPOINT_DTYPES)
    if slots is not None:
        expect(op, "slots", slots, shape=(None,), dtypes=INDEX_DTYPES, device=checkpoint.device)
    return _run(op, backend, checkpoint.device, reference.reset,
                checkpoint, read_copy, read_scale, list(buffers), num_committed, slots, pad_slot_id)


def stagger_cursors(buffers, num_committed, period: int, slots=None, pad_slot_id: int = -1, *, backend="auto"):
    """Staggered flush: fill the buffers of the named slots (all when None) with zeros, which are neutral
    entries, and set each cursor to slot % period. Slots started together then fold at different steps.
    period = buffer_len - max_draft_tokens + 1 spreads folds over every step of a cycle."""
    op = "stagger_cursors"
    expect(op, "num_committed", num_committed, shape=(None,), dtypes=(torch.int32,))
    buffers = list(buffers)
    for i, t in enumerate(buffers):
        expect(op, f"buffers[{i}]", t, device=num_committed.device)
        if t.dim() < 3 or t.shape[0] != num_committed.shape[0]:
            raise ValueError(f"{op}: buffers[{i}] must be (num_slots={num_committed.shape[0]}, heads, buffer_len, ...), "
                             f"got shape {_shape_text(t.shape)}")
        if not isinstance(period, int) or not 1 <= period <= t.shape[2]:
            raise ValueError(f"{op}: `period` must be an int in [1, buffer_len={t.shape[2]}], got {period!r}")
    if not buffers and (not isinstance(period, int) or period < 1):
        raise ValueError(f"{op}: `period` must be an int >= 1, got {period!r}")
    if slots is not None:
        expect(op, "slots", slots, shape=(None,), dtypes=INDEX_DTYPES, device=num_committed.device)
    return _run(op, backend, num_committed.device, reference.stagger_cursors,
                buffers, num_committed, slots, pad_slot_id, period)


def copy_slots(cache_tensors, src_slots, dst_slots, pad_slot_id: int = -1, *, backend="auto"):
    """Copy everything a slot owns from src_slots[i] to dst_slots[i] (for forking a sequence). Sources
    are read before destinations are written (a gather); pairs naming pad_slot_id or an out-of-range
    slot are skipped."""
    op = "copy_slots"
    tensors = [t for t in cache_tensors if t is not None]
    if not tensors:
        raise ValueError(f"{op}: `cache_tensors` holds no tensor")
    num_slots, dev = tensors[0].shape[0], tensors[0].device
    for i, t in enumerate(tensors):
        expect(op, f"cache_tensors[{i}]", t, device=dev)
        if t.shape[0] != num_slots:
            raise ValueError(f"{op}: every cache tensor must have {num_slots} slots in dim 0, "
                             f"cache_tensors[{i}] has {t.shape[0]}")
    expect(op, "src_slots", src_slots, shape=(None,), dtypes=INDEX_DTYPES, device=dev)
    expect(op, "dst_slots", dst_slots, shape=(src_slots.shape[0],), dtypes=INDEX_DTYPES, device=dev)
    limit = None
    if src_slots.shape[0] > MAX_COPY_SLOTS_PAIRS:
        limit = f"{src_slots.shape[0]} pairs exceed the compiled kernel's {MAX_COPY_SLOTS_PAIRS}"
    return _run(op, backend, dev, reference.copy_slots, tensors, src_slots, dst_slots, pad_slot_id,
                kernel_limit=limit)
