"""Functional ops: run the compiled kernel (which checks its arguments in C++) or the checked reference.

Every op here has the signature of ``torch.ops.replayssm.<name>`` plus one Python-only keyword,
``backend``:
    "auto"       the compiled kernel when the tensors are on CUDA and this build has a kernel that takes
                 them (shapes and dtypes from `replayssm_cuda.capabilities()`); otherwise the PyTorch
                 reference. On CUDA tensors without such a kernel it warns once per op and reason (never
                 a silent slow path).
    "cuda"       the compiled kernel or an error saying why it is not available.
    "reference"  always the PyTorch reference (reference.py), on any device.

Each call validates its arguments once: the compiled ops in C++, the reference in Python (_checks.py).
Deciding between the two reads a few shapes and dtypes and checks nothing else. Outputs are
caller-allocated and returned; cache tensors are updated in place. Errors name the op, the argument,
what was expected and what was given (ValueError / TypeError from the Python checks, RuntimeError from
the C++ ones).
"""

from __future__ import annotations

import warnings

import torch

from . import _checks, _extension, _library, reference
from ._checks import (ACTIVATION_DTYPES, CHECKPOINT_DTYPES, INDEX_DTYPES, READ_COPY_DTYPES,  # noqa: F401
                      dtype_text as _dtype_text, expect)

BACKENDS = ("auto", "cuda", "reference")

_warned_fallback: set[tuple[str, str]] = set()


# --------------------------------------------------------------------------------------------------
# What the compiled kernels take (replayssm_cuda.capabilities(); empty op lists without _C)
# --------------------------------------------------------------------------------------------------

def _dtype_set(names) -> frozenset:
    return frozenset(getattr(torch, n) for n in names)


class KernelTable:
    """What one family's compiled kernels take: its entry of `replayssm_cuda.capabilities()` (empty
    without _C). `shapes` are the checkpoint's last two dims ((P, N) Mamba-2, (V, K) GDN)."""

    def __init__(self, entry: dict):
        self.shapes = frozenset(tuple(s) for s in entry.get("shapes", ()))
        self.activation_dtypes = _dtype_set(entry.get("activation_dtypes", ()))
        self.update_dtypes = _dtype_set(entry.get("update_checkpoint_dtypes", ()))
        self.checkpoint_read_copy = frozenset((getattr(torch, ck), None if rc is None else getattr(torch, rc))
                                              for ck, rc in entry.get("checkpoint_read_copy", ()))
        self.checkpoint_dtypes = frozenset(ck for ck, _ in self.checkpoint_read_copy)
        self.max_buffer_len = entry.get("max_buffer_len", 0)
        self.max_draft_tokens = entry.get("max_draft_tokens", 0)   # verify's T and the snapshot ops' tokens
        # GDN / KDA: {(V, K, checkpoint dtype): L} where the fold takes fewer than max_buffer_len entries.
        self.fold_max_buffer_len = {(V, K, getattr(torch, ck)): L
                                    for V, K, ck, L in entry.get("fold_max_buffer_len", ())}

    def limit(self, dims_text: str, dims: tuple, checkpoint_dtype, read_copy_dtype, activation_dtype, *,
              update=False) -> str | None:
        """Why these kernels cannot take a cache of these dims and dtypes, or None. update: the
        conventional update (a state, no read copy) rather than the replay ops."""
        if dims not in self.shapes:
            dims_list = ", ".join(str(d) for d in dims)
            return f"{dims_text} = ({dims_list}) has no compiled kernel (compiled: {sorted(self.shapes)})"
        if update:
            if checkpoint_dtype not in self.update_dtypes:
                return f"a {_dtype_text(checkpoint_dtype)} checkpoint has no compiled kernel"
        elif (checkpoint_dtype, read_copy_dtype) not in self.checkpoint_read_copy:
            if checkpoint_dtype not in self.checkpoint_dtypes:
                return f"a {_dtype_text(checkpoint_dtype)} checkpoint has no compiled kernel"
            return (f"a {_dtype_text(read_copy_dtype)} read copy of a {_dtype_text(checkpoint_dtype)} checkpoint "
                    f"has no compiled kernel")
        if activation_dtype not in self.activation_dtypes:
            names = ", ".join(sorted(_dtype_text(d) for d in self.activation_dtypes))
            return f"{_dtype_text(activation_dtype)} activations have no compiled kernel ({names})"
        return None


_CAPS = _extension.capabilities()
_COMPILED = frozenset(_extension.compiled_ops())
_CACHE_CAPS = _CAPS.get("cache", {})
MAMBA2_KERNELS = KernelTable(_CAPS.get("mamba2", {}))
GDN_KERNELS = KernelTable(_CAPS.get("gdn", {}))
KDA_KERNELS = KernelTable(_CAPS.get("kda", {}))   # GDN's kernels with the decay per key channel
DELTA_KERNELS = {"gdn": GDN_KERNELS, "kda": KDA_KERNELS}
MAMBA2_KERNEL_SHAPES = MAMBA2_KERNELS.shapes
KERNEL_ACTIVATION_DTYPES = MAMBA2_KERNELS.activation_dtypes
KERNEL_MAX_BUFFER_LEN = MAMBA2_KERNELS.max_buffer_len
KERNEL_MAX_DRAFT_TOKENS = MAMBA2_KERNELS.max_draft_tokens   # verify's T and the snapshot step's tokens
# The slot ops move bytes of any dtype; make_read_copy and load convert from these checkpoint dtypes.
_CACHE_CHECKPOINT_DTYPES = _dtype_set(_CACHE_CAPS.get("checkpoint_dtypes", ("float32", "bfloat16", "float16")))
READ_COPY_MAX_COLS = _CACHE_CAPS.get("read_copy_max_cols", 0)
MAX_COPY_SLOTS_PAIRS = _CACHE_CAPS.get("copy_slots_max_pairs", 0)


def why_not_compiled(name: str) -> str:
    """Why op `name` has no compiled kernel in this build: for error and warning texts."""
    if not _extension.is_compiled():
        return f"the compiled extension is not available ({_extension.load_error()})"
    return f"this build has no compiled kernel for {name} (compiled: {', '.join(_extension.compiled_ops())})"


def mamba2_limit(P, N, checkpoint_dtype, read_copy_dtype, activation_dtype, *, update=False) -> str | None:
    """Why the compiled Mamba-2 kernels cannot take a (P, N) cache of these dtypes, or None.
    update: the conventional update (a state, no read copy) rather than the replay ops."""
    return MAMBA2_KERNELS.limit("(head_dim, state_dim)", (P, N), checkpoint_dtype, read_copy_dtype, activation_dtype,
                                update=update)


def mamba2_kernel_limit(checkpoint, read_copy, x, *, update=False) -> str | None:
    """mamba2_limit of these tensors."""
    return mamba2_limit(checkpoint.shape[2], checkpoint.shape[3], checkpoint.dtype,
                        None if read_copy is None else read_copy.dtype, x.dtype, update=update)


def mamba2_spec_kernel_limit(checkpoint, read_copy, activations, dt_buf, T=None, out=None) -> str | None:
    """Why the compiled step/verify/commit/flush/materialize kernels cannot take these arguments, or None.
    `activations` is x (step, verify) or x_buf; T the draft count (verify); out (materialize)."""
    limit = mamba2_kernel_limit(checkpoint, read_copy, activations)
    if limit is not None:
        return limit
    if dt_buf.dtype != torch.float32:
        return f"a {_dtype_text(dt_buf.dtype)} dt_buf has no compiled kernel (float32)"
    if dt_buf.shape[2] > KERNEL_MAX_BUFFER_LEN:
        return f"buffer_len = {dt_buf.shape[2]} exceeds the compiled kernels' {KERNEL_MAX_BUFFER_LEN}"
    if T is not None and T > KERNEL_MAX_DRAFT_TOKENS:
        return f"T = {T} draft tokens exceed the compiled kernel's {KERNEL_MAX_DRAFT_TOKENS}"
    if out is not None and out.dtype != torch.float32:
        return f"a {_dtype_text(out.dtype)} out has no compiled kernel (float32)"
    return None


def _snapshots_kernel_limit(state, x, snapshots) -> str | None:
    limit = mamba2_kernel_limit(state, None, x, update=True)
    if limit is not None:
        return limit
    if snapshots.dtype != state.dtype:
        return (f"{_dtype_text(snapshots.dtype)} snapshots of a {_dtype_text(state.dtype)} state have no compiled "
                f"kernel (it writes snapshots in the state dtype)")
    if x.shape[1] > KERNEL_MAX_DRAFT_TOKENS:
        return f"T = {x.shape[1]} tokens exceed the compiled kernel's {KERNEL_MAX_DRAFT_TOKENS}"
    return None


def cache_op_limit(checkpoint_dtype, cols: int, has_read_copy: bool) -> str | None:
    """Why make_read_copy / load cannot take a checkpoint of this dtype and last dim, or None."""
    if checkpoint_dtype not in _CACHE_CHECKPOINT_DTYPES:
        return f"a {_dtype_text(checkpoint_dtype)} checkpoint has no compiled kernel"
    if has_read_copy and cols > READ_COPY_MAX_COLS:
        return f"a read copy of {cols} columns exceeds the compiled kernel's {READ_COPY_MAX_COLS}"
    return None


def _read_copy_limit(checkpoint, read_copy) -> str | None:
    return cache_op_limit(checkpoint.dtype, checkpoint.shape[3], True)


def _load_limit(checkpoint, read_copy, states) -> str | None:
    limit = cache_op_limit(checkpoint.dtype, checkpoint.shape[3], read_copy is not None)
    if limit is None and states.dtype not in (torch.float32, checkpoint.dtype):
        limit = (f"{_dtype_text(states.dtype)} states for a {_dtype_text(checkpoint.dtype)} checkpoint have no "
                 f"compiled kernel (float32 or the checkpoint dtype)")
    return limit


def _copy_slots_limit(src_slots) -> str | None:
    if src_slots.shape[0] > MAX_COPY_SLOTS_PAIRS:
        return f"{src_slots.shape[0]} pairs exceed the compiled kernel's {MAX_COPY_SLOTS_PAIRS}"
    return None


# --------------------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------------------

def warn_fallback(names: str, reason: str, stacklevel: int) -> None:
    """Once per (ops, reason): `names` run the reference on CUDA tensors under backend='auto'."""
    if (names, reason) in _warned_fallback:
        return
    _warned_fallback.add((names, reason))
    verb = "run" if ", " in names else "runs"
    warnings.warn(f"replayssm_cuda: {names} {verb} the PyTorch reference on CUDA tensors because {reason}. "
                  f"Pass backend='reference' to accept this, or backend='cuda' to make it an error.",
                  RuntimeWarning, stacklevel=stacklevel + 1)


def check_backend(owner: str, backend) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"{owner}: `backend` must be one of {BACKENDS}, got {backend!r}")


def _use_kernel(name: str, backend: str, tensor, limit=None, *limit_args) -> bool:
    """True: call torch.ops.replayssm.<name> (C++ checks the arguments). False: check them here and run
    the reference. `tensor` is the argument whose device decides; `limit(*limit_args)` says why the
    compiled kernel does not take these arguments (None: it does). Anything malformed is left to the
    checks of the path chosen (the limit's own errors mean "let the kernel's checks say what is wrong")."""
    if backend == "reference":
        return False
    if backend != "auto" and backend != "cuda":
        check_backend(name, backend)
    if not isinstance(tensor, torch.Tensor):
        return False
    if not tensor.is_cuda:
        if backend == "cuda":
            raise ValueError(f"{name}: backend='cuda' needs CUDA tensors, got tensors on {tensor.device}")
        return False
    if name in _COMPILED:
        reason = None
        if limit is not None:
            try:
                reason = limit(*limit_args)
            except (AttributeError, IndexError, TypeError):
                reason = None
        if reason is None:
            return True
    else:
        reason = why_not_compiled(name)
    if backend == "cuda":
        raise RuntimeError(f"{name}: backend='cuda' asked for, but {reason}")
    warn_fallback(name, reason, stacklevel=4)
    return False


# torch.ops.replayssm.<name>.default of every op (the CUDA kernel on CUDA tensors where compiled).
KERNELS = {name: getattr(torch.ops.replayssm, name).default for name in _library.SCHEMAS}


def has_kernel(name: str) -> bool:
    """True when this build compiled a CUDA kernel for op `name`."""
    return name in _COMPILED


def _call(name: str, backend: str, tensor, limit, limit_args: tuple, args: tuple) -> None:
    if _use_kernel(name, backend, tensor, limit, *limit_args):
        KERNELS[name](*args)
    else:
        _checks.OP_CHECKS[name](*args)
        _library.REFERENCE[name](*args)


# --------------------------------------------------------------------------------------------------
# Read copies
# --------------------------------------------------------------------------------------------------

def make_read_copy(checkpoint, read_copy, read_scale=None, slots=None, pad_slot_id: int = -1, *, backend="auto"):
    """Refresh the read copy (bf16/fp16/fp8-e4m3 + fp32 scales) of the named slots from the checkpoint."""
    _checks.slots_type("make_read_copy", slots)
    _call("make_read_copy", backend, checkpoint, _read_copy_limit, (checkpoint, read_copy),
          (checkpoint, read_copy, read_scale, slots, pad_slot_id))


# --------------------------------------------------------------------------------------------------
# Mamba-2
# --------------------------------------------------------------------------------------------------

def mamba2_update(state, x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus=False,
                  slots=None, pad_slot_id: int = -1, rounding_seed=None, *, backend="auto"):
    """Conventional T=1 Mamba-2 decode (read, update and write the state). See reference.mamba2_update.
    rounding_seed: int64 (2,) [seed, offset] for stochastic rounding of a bf16 / fp16 state, or None."""
    _checks.slots_type("mamba2_update", slots)
    _call("mamba2_update", backend, state, _update_limit, (state, x),
          (state, x, dt, A, B, C, out, D, z, dt_bias, bool(dt_softplus), slots, pad_slot_id, rounding_seed))
    return out


def _update_limit(state, x):
    return mamba2_kernel_limit(state, None, x, update=True)


def mamba2_update_snapshots(state, x, dt, A, B, C, out, snapshots, D=None, z=None, dt_bias=None,
                            dt_softplus=False, slots=None, pad_slot_id: int = -1, *, backend="auto"):
    """Conventional speculative step: T tokens per row from the state, the state after every token into
    `snapshots` (batch, T, H, P, N); `state` is only read. See reference.mamba2_update_snapshots."""
    _checks.slots_type("mamba2_update_snapshots", slots)
    _call("mamba2_update_snapshots", backend, state, _snapshots_kernel_limit, (state, x, snapshots),
          (state, x, dt, A, B, C, out, snapshots, D, z, dt_bias, bool(dt_softplus), slots, pad_slot_id))
    return out


def mamba2_verify(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, num_verified,
                  x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus=False,
                  slots=None, pad_slot_id: int = -1, error_word=None, *, backend="auto"):
    """Outputs of T draft tokens; entries appended after the committed history, their count recorded
    in num_verified[slot] (int32 (num_slots,)) for the commit. error_word: int32 (4,) that records the
    first misuse (Mamba2Cache.check), or None. See reference."""
    _checks.slots_type("mamba2_verify", slots)
    _call("mamba2_verify", backend, checkpoint, _verify_limit, (checkpoint, read_copy, x, dt_buf),
          (checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, num_verified,
           x, dt, A, B, C, out, D, z, dt_bias, bool(dt_softplus), slots, pad_slot_id, error_word))
    return out


def _verify_limit(checkpoint, read_copy, x, dt_buf):
    return mamba2_spec_kernel_limit(checkpoint, read_copy, x, dt_buf, T=x.shape[1])


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
    _checks.slots_type("mamba2_step", slots)
    _call("mamba2_step", backend, checkpoint, mamba2_spec_kernel_limit, (checkpoint, read_copy, x, dt_buf),
          (checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, x, dt, A, B, C, out, D, z,
           dt_bias, bool(dt_softplus), max_draft_tokens, slots, pad_slot_id, rounding_seed, staggered_flush))
    return out


def mamba2_commit(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, num_verified,
                  num_accepted, A, max_draft_tokens: int, slots=None, pad_slot_id: int = -1, rounding_seed=None,
                  error_word=None, *, backend="auto"):
    """Accept verified entries (a device-side cursor move) and fold where the next verify would not fit.
    num_accepted is clamped to [0, num_verified[slot]] (what the slot's last verify appended), which
    becomes 0. rounding_seed: as in mamba2_step. error_word: as in mamba2_verify."""
    _checks.slots_type("mamba2_commit", slots)
    _call("mamba2_commit", backend, checkpoint, mamba2_spec_kernel_limit, (checkpoint, read_copy, x_buf, dt_buf),
          (checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, num_verified, num_accepted, A,
           max_draft_tokens, slots, pad_slot_id, rounding_seed, error_word))


def mamba2_flush(checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, A,
                 slots=None, pad_slot_id: int = -1, rounding_seed=None, *, backend="auto"):
    """Fold everything committed into the checkpoints of the named slots (all when None).
    rounding_seed: as in mamba2_step."""
    _checks.slots_type("mamba2_flush", slots)
    _call("mamba2_flush", backend, checkpoint, mamba2_spec_kernel_limit, (checkpoint, read_copy, x_buf, dt_buf),
          (checkpoint, read_copy, read_scale, x_buf, B_buf, dt_buf, num_committed, A, slots, pad_slot_id,
           rounding_seed))


def mamba2_materialize(checkpoint, x_buf, B_buf, dt_buf, num_committed, A, out,
                       slots=None, pad_slot_id: int = -1, *, backend="auto"):
    """Full-precision state at the committed position into `out` (batch, H, P, N); cache unchanged."""
    _checks.slots_type("mamba2_materialize", slots)
    _call("mamba2_materialize", backend, checkpoint, _materialize_limit, (checkpoint, x_buf, dt_buf, out),
          (checkpoint, x_buf, B_buf, dt_buf, num_committed, A, out, slots, pad_slot_id))
    return out


def _materialize_limit(checkpoint, x_buf, dt_buf, out):
    return mamba2_spec_kernel_limit(checkpoint, None, x_buf, dt_buf, out=out)


# --------------------------------------------------------------------------------------------------
# Gated DeltaNet (family "gdn") and KDA (family "kda")
# --------------------------------------------------------------------------------------------------

def gdn_limit(V, K, checkpoint_dtype, read_copy_dtype, activation_dtype, *, update=False,
              family: str = "gdn") -> str | None:
    """Why the compiled GDN kernels (family "kda": KDA's, the same kernels with the decay per key
    channel) cannot take a cache with (head_v_dim, head_k_dim) = (V, K) of these dtypes, or None.
    update: the conventional update and its snapshot variant (a state, no read copy)."""
    return DELTA_KERNELS[family].limit("(head_v_dim, head_k_dim)", (V, K), checkpoint_dtype, read_copy_dtype,
                                       activation_dtype, update=update)


def gdn_kernel_limit(checkpoint, read_copy, activations, *, buffers=(), weights=(), T=None, out=None,
                     snapshots=None, family: str = "gdn") -> str | None:
    """Why the compiled GDN kernels (family "kda": KDA's) cannot take these arguments, or None.
    `activations`: q (update, update_snapshots: whose dtype sets the activations) or k_buf (the replay
    ops: the cache's); `buffers`: g_buf, beta_buf, u_buf (the replay ops); `weights`: A_log, dt_bias; T:
    verify's drafts or the snapshot op's tokens; out: materialize's state; snapshots: update_snapshots'."""
    kernels = DELTA_KERNELS[family]
    update = not buffers
    limit = gdn_limit(checkpoint.shape[2], checkpoint.shape[3], checkpoint.dtype,
                      None if read_copy is None else read_copy.dtype, activations.dtype, update=update, family=family)
    if limit is not None:
        return limit
    for name, t in zip(("g_buf", "beta_buf", "u_buf"), buffers):
        if t.dtype != torch.float32:
            return f"a {_dtype_text(t.dtype)} {name} has no compiled kernel (float32)"
    if buffers and buffers[0].shape[2] > kernels.max_buffer_len:
        return f"buffer_len = {buffers[0].shape[2]} exceeds the compiled kernels' {kernels.max_buffer_len}"
    # KDA's fold keeps the window's (L, K) log decays beside a checkpoint tile in a CTA's shared memory
    # (capabilities()["kda"]["fold_max_buffer_len"]). The C++ refuses only the fold's ops (commit, flush,
    # materialize); the step and verify of such a cache go to the reference too, so that its ops run on one path.
    fold_max = kernels.fold_max_buffer_len.get((*checkpoint.shape[2:], checkpoint.dtype))
    if buffers and fold_max is not None and buffers[0].shape[2] > fold_max:
        V, K = checkpoint.shape[2:]
        return (f"KDA's fold keeps the window's per-channel decays in shared memory: with a "
                f"{_dtype_text(checkpoint.dtype)} checkpoint of (head_v_dim, head_k_dim) = ({V}, {K}) buffer_len "
                f"must be <= {fold_max}, got {buffers[0].shape[2]}")
    for name, t in zip(("A_log", "dt_bias"), weights):
        if t.dtype != torch.float32:
            return f"a {_dtype_text(t.dtype)} {name} has no compiled kernel (float32)"
    if T is not None and T > kernels.max_draft_tokens:
        return f"T = {T} tokens exceed the compiled kernel's {kernels.max_draft_tokens}"
    if out is not None and out.dtype != torch.float32:
        return f"a {_dtype_text(out.dtype)} out has no compiled kernel (float32)"
    if snapshots is not None and snapshots.dtype != checkpoint.dtype:
        return (f"{_dtype_text(snapshots.dtype)} snapshots of a {_dtype_text(checkpoint.dtype)} state have no compiled "
                f"kernel (it writes snapshots in the state dtype)")
    return None


def _delta_ops(family: str):
    """The replay ops and the conventional updates of one delta-rule family (gdn or kda), on the same
    kernels (capabilities()["gdn"] / ["kda"]): a call runs compiled where its op is compiled and
    gdn_kernel_limit finds nothing the kernel does not take; else the reference."""
    names = {op: f"{family}_{op}" for op in ("update", "update_snapshots", "verify", "step", "commit", "flush",
                                             "materialize")}

    def limit(*args, **kwargs):   # called with an op's arguments only where the op is compiled
        return gdn_kernel_limit(*args, **kwargs, family=family)

    def update(state, q, k, v, a, b, A_log, dt_bias, out, scale=None, use_qk_l2norm=True,
               slots=None, pad_slot_id: int = -1, *, backend="auto"):
        op = names["update"]
        _checks.slots_type(op, slots)
        _call(op, backend, state, lambda: limit(state, None, q, weights=(A_log, dt_bias)), (),
              (state, q, k, v, a, b, A_log, dt_bias, out, scale, bool(use_qk_l2norm), slots, pad_slot_id))
        return out

    def update_snapshots(state, q, k, v, a, b, A_log, dt_bias, out, snapshots, scale=None, use_qk_l2norm=True,
                         slots=None, pad_slot_id: int = -1, *, backend="auto"):
        op = names["update_snapshots"]
        _checks.slots_type(op, slots)
        _call(op, backend, state,
              lambda: limit(state, None, q, weights=(A_log, dt_bias), T=q.shape[1], snapshots=snapshots),
              (), (state, q, k, v, a, b, A_log, dt_bias, out, snapshots, scale, bool(use_qk_l2norm), slots,
                   pad_slot_id))
        return out

    def verify(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
               num_verified, q, k, v, a, b, A_log, dt_bias, out, scale=None, use_qk_l2norm=True,
               slots=None, pad_slot_id: int = -1, error_word=None, *, backend="auto"):
        op = names["verify"]
        _checks.slots_type(op, slots)
        _call(op, backend, checkpoint,
              lambda: limit(checkpoint, read_copy, k_buf, buffers=(g_buf, beta_buf, u_buf), weights=(A_log, dt_bias),
                            T=q.shape[1]), (),
              (checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
               num_verified, q, k, v, a, b, A_log, dt_bias, out, scale, bool(use_qk_l2norm), slots, pad_slot_id,
               error_word))
        return out

    def step(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
             q, k, v, a, b, A_log, dt_bias, out, scale=None, use_qk_l2norm=True, max_draft_tokens: int = 1,
             slots=None, pad_slot_id: int = -1, staggered_flush: bool = False, *, backend="auto"):
        op = names["step"]
        _checks.slots_type(op, slots)
        _call(op, backend, checkpoint,
              lambda: limit(checkpoint, read_copy, k_buf, buffers=(g_buf, beta_buf, u_buf), weights=(A_log, dt_bias)),
              (),
              (checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
               q, k, v, a, b, A_log, dt_bias, out, scale, bool(use_qk_l2norm), max_draft_tokens, slots, pad_slot_id,
               staggered_flush))
        return out

    def commit(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
               num_verified, num_accepted, max_draft_tokens: int, use_qk_l2norm=True, slots=None,
               pad_slot_id: int = -1, error_word=None, *, backend="auto"):
        op = names["commit"]
        _checks.slots_type(op, slots)
        _call(op, backend, checkpoint,
              lambda: limit(checkpoint, read_copy, k_buf, buffers=(g_buf, beta_buf, u_buf)), (),
              (checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
               num_verified, num_accepted, max_draft_tokens, bool(use_qk_l2norm), slots, pad_slot_id, error_word))

    def flush(checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
              use_qk_l2norm=True, slots=None, pad_slot_id: int = -1, *, backend="auto"):
        op = names["flush"]
        _checks.slots_type(op, slots)
        _call(op, backend, checkpoint,
              lambda: limit(checkpoint, read_copy, k_buf, buffers=(g_buf, beta_buf, u_buf)), (),
              (checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
               bool(use_qk_l2norm), slots, pad_slot_id))

    def materialize(checkpoint, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed, out,
                    use_qk_l2norm=True, slots=None, pad_slot_id: int = -1, *, backend="auto"):
        op = names["materialize"]
        _checks.slots_type(op, slots)
        _call(op, backend, checkpoint,
              lambda: limit(checkpoint, None, k_buf, buffers=(g_buf, beta_buf, u_buf), out=out), (),
              (checkpoint, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed, out, bool(use_qk_l2norm),
               slots, pad_slot_id))
        return out

    fns = {"update": update, "update_snapshots": update_snapshots, "verify": verify, "step": step,
           "commit": commit, "flush": flush, "materialize": materialize}
    for kind, fn in fns.items():
        fn.__name__ = fn.__qualname__ = names[kind]
        fn.__doc__ = f"torch.ops.replayssm.{names[kind]}; see reference.delta_{kind}."
    step.__doc__ += (" staggered_flush: a launch hint, no change to the results (as mamba2_step's: where the CTAs "
                     "take more than one wave an order pass starts the folding rows first).")
    return fns


_GDN_OPS, _KDA_OPS = _delta_ops("gdn"), _delta_ops("kda")
gdn_update, gdn_update_snapshots, gdn_verify, gdn_step, gdn_commit, gdn_flush, gdn_materialize = _GDN_OPS.values()
kda_update, kda_update_snapshots, kda_verify, kda_step, kda_commit, kda_flush, kda_materialize = _KDA_OPS.values()


# --------------------------------------------------------------------------------------------------
# Family-independent cache ops
# --------------------------------------------------------------------------------------------------

def load(checkpoint, read_copy, read_scale, num_committed, states, slots=None, pad_slot_id: int = -1, *,
         backend="auto"):
    """Write prefill states (batch, *checkpoint.shape[1:]) into the named slots, regenerate their read
    copies and empty their buffers."""
    _checks.slots_type("load", slots)
    _call("load", backend, checkpoint, _load_limit, (checkpoint, read_copy, states),
          (checkpoint, read_copy, read_scale, num_committed, states, slots, pad_slot_id))


def reset(checkpoint, read_copy, read_scale, buffers, num_committed, slots=None, pad_slot_id: int = -1, *,
          backend="auto"):
    """Zero the checkpoint, read copy, buffers and cursors of the named slots (all when None)."""
    _checks.slots_type("reset", slots)
    _call("reset", backend, checkpoint, None, (),
          (checkpoint, read_copy, read_scale, list(buffers), num_committed, slots, pad_slot_id))


def stagger_cursors(buffers, num_committed, period: int, slots=None, pad_slot_id: int = -1, *, backend="auto"):
    """Staggered flush: fill the buffers of the named slots (all when None) with zeros, which are neutral
    entries, and set each cursor to slot % period. Slots started together then fold at different steps.
    period = buffer_len - max_draft_tokens + 1 spreads folds over every step of a cycle."""
    _checks.slots_type("stagger_cursors", slots)
    _call("stagger_cursors", backend, num_committed, None, (),
          (list(buffers), num_committed, slots, pad_slot_id, period))


def copy_slots(cache_tensors, src_slots, dst_slots, pad_slot_id: int = -1, *, backend="auto"):
    """Copy everything a slot owns from src_slots[i] to dst_slots[i] (for forking a sequence). Sources
    are read before destinations are written (a gather); pairs naming pad_slot_id or an out-of-range
    slot are skipped. None entries of cache_tensors are left out."""
    _checks.slots_type("copy_slots", src_slots, "src_slots")
    _checks.slots_type("copy_slots", dst_slots, "dst_slots")
    tensors = [t for t in cache_tensors if t is not None]
    _call("copy_slots", backend, tensors[0] if tensors else None, _copy_slots_limit, (src_slots,),
          (tensors, src_slots, dst_slots, pad_slot_id))
