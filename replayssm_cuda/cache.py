"""State objects: one per SSM layer, owning the preallocated ReplaySSM cache of a pool of slots.

A cache checks its configuration once, allocates the checkpoint, the optional read copy, the input
buffers and the device-side cursors, decides once per op whether the compiled kernel or the PyTorch
reference runs it, and then calls that op with its tensors:

    cache = Mamba2Cache(num_slots=256, num_heads=96, head_dim=80, state_dim=128, num_groups=8,
                        weights=Mamba2Weights(A=A, D=D, dt_bias=dt_bias), buffer_len=16,
                        read_copy_dtype=torch.bfloat16, device="cuda")
    y = cache.step(x, dt, B, C, z, slots=state_batch_indices)        # plain decode
    y = cache.verify(x, dt, B, C, z, slots=...)                        # T draft tokens, (batch, T, ...)
    y = cache.verify_varlen(x, dt, B, C, z, cu_seqlens=..., slots=...) # or flattened, (total_tokens, ...)
    cache.commit(num_accepted, slots=...)                              # device tensor, no host sync

Commit is safe by construction: each slot records on the device how many entries its last verify
appended (num_verified), and commit accepts num_accepted clamped to [0, that count], then zeroes it, so
a count larger than the drafts, a negative one or a second commit without a verify never accepts a
buffer entry that no verify wrote. Misuse is counted, not silent: verify and commit record the first
one (a count outside that range, a slot id neither in range nor the pad id) in a device-side error word
that `cache.check()` reads and raises (a host synchronisation: for debugging, tests, or now and then);
`validate=True` checks after every op.

On the compiled path a method hands its arguments straight to torch.ops.replayssm.* (which checks them
in C++), runs without host synchronisation and can be captured in a CUDA graph; on the reference path
it checks the per-call inputs in Python (never its own tensors again) and runs replayssm_cuda.reference.
Under torch.compile every method calls the torch op, which traces as an opaque in-place op.
`python -m replayssm_cuda info` lists the compiled ops. Methods take `slots` (state_batch_indices,
int32/int64; row r uses slot r when None); rows whose slot is `pad_slot_id` or out of range touch
nothing and get zero output. Activations must have the cache's activation_dtype (no silent cast).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from . import _checks, ops
from ._checks import dtype_text as _dtype_name
from ._library import REFERENCE

# Buffer entries of a delta-rule slot are about 4x larger than a Mamba-2 slot's, so their buffers stay
# short (docs/DESIGN.md section 6).
MAX_BUFFER_LEN = {"mamba2": 64, "gdn": 16, "kda": 16}
MAX_DRAFT_TOKENS = 16
# The codes of a cache's error word (csrc/cache/error_word.cuh, reference.ERROR_*): the op kind and
# what was wrong.
ERROR_CODES = {1: ("verify", "slot"), 2: ("commit", "slot"), 3: ("commit", "accepted")}

_is_compiling = torch.compiler.is_compiling


@dataclass(frozen=True)
class Mamba2Weights:
    """Per-layer Mamba-2 parameters: A (H,) fp32, <= 0 (A = -exp(A_log), a decay rate); D, dt_bias (H,)
    fp32 or None."""
    A: torch.Tensor
    D: torch.Tensor | None = None
    dt_bias: torch.Tensor | None = None
    dt_softplus: bool = True


@dataclass(frozen=True)
class DeltaRuleWeights:
    """Per-layer GDN / KDA parameters: A_log (HV,); dt_bias (HV,) for GDN, (HV, K) for KDA;
    scale defaults to K^-0.5."""
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    scale: float | None = None
    use_qk_l2norm: bool = True


@dataclass(frozen=True)
class _DraftLayout:
    """Where each flattened draft token of a varlen verify sits in verify's dense (batch, T, ...) block.

    Flat token i belongs to row r = searchsorted(cu_seqlens[1:], i, right=True) at position
    t = i - cu_seqlens[r]; it goes to row r * T + t of the block flattened to (batch * T + 1, ...). The
    extra last row takes the tokens outside every row: those from cu_seqlens[-1] on (an engine's padding
    of total_tokens to a graph's size) and any that a malformed cu_seqlens puts past a row's first T, so
    that no index leaves the block; they get zero output and are not verified. All of it is device ops on
    shapes the host knows, with no read of cu_seqlens: a CUDA graph can capture it."""
    batch: int
    T: int
    pos: torch.Tensor      # (total_tokens,) int64 row of the flattened block
    counts: torch.Tensor   # (batch,) draft tokens of each row, clamped to [0, T]

    @classmethod
    def of(cls, cu_seqlens: torch.Tensor, batch: int, T: int, total: int) -> "_DraftLayout":
        i = torch.arange(total, dtype=cu_seqlens.dtype, device=cu_seqlens.device)
        row = torch.searchsorted(cu_seqlens[1:], i, right=True)          # in [0, batch]
        t = i - cu_seqlens[row]
        inside = (row < batch) & (t >= 0) & (t < T)
        pos = torch.where(inside, row * T + t, batch * T)
        counts = (cu_seqlens[1:] - cu_seqlens[:-1]).clamp(0, T)
        return cls(batch, T, pos, counts)

    def pack(self, flat: torch.Tensor | None) -> torch.Tensor | None:
        """(total_tokens, ...) -> (batch, T, ...), zeros where a row has fewer than T drafts."""
        if flat is None:
            return None
        block = flat.new_zeros(self.batch * self.T + 1, *flat.shape[1:])
        block.index_copy_(0, self.pos, flat)
        return self.dense(block)

    def dense(self, block: torch.Tensor) -> torch.Tensor:
        """The (batch, T, ...) view of a block (batch * T + 1, ...), without its extra row."""
        return block[:-1].view(self.batch, self.T, *block.shape[1:])

    def out_block(self, out: torch.Tensor) -> torch.Tensor:
        """The dense output block for `out` (total_tokens, ...); its extra row stays zero."""
        block = out.new_empty(self.batch * self.T + 1, *out.shape[1:])
        block[-1].zero_()
        return block

    def unpack(self, block: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The flattened tokens' rows of the dense output block into `out` (total_tokens, ...)."""
        return torch.index_select(block, 0, self.pos, out=out)


def _cache_device(name: str, device) -> torch.device:
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = (f"torch {torch.__version__} is a CPU-only build" if torch.version.cuda is None
                   else f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU")
            raise RuntimeError(f"{name}: device={str(device)!r} needs CUDA, but {why}; pass device='cpu' "
                               f"(the PyTorch reference)")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class _ReplayCache:
    """What every family shares: configuration checks, allocation, cursors, the choice of path per op,
    the slot ops. A family's __init__ calls _ReplayCache.__init__, allocates its buffers and weights,
    then _finish_init."""

    family: str
    # Each family's update / step / verify / commit / flush / materialize op names.
    _family_ops: dict[str, str]

    def __init__(self, num_slots, state_shape, *, buffer_len, max_draft_tokens, checkpoint_dtype,
                 read_copy_dtype, activation_dtype, pad_slot_id, device, backend, checkpoint, staggered_flush,
                 validate=False):
        name = type(self).__name__
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"{name}: `num_slots` must be an int >= 1, got {num_slots!r}")
        for dim_name, dim in state_shape.items():
            if not isinstance(dim, int) or dim < 1:
                raise ValueError(f"{name}: `{dim_name}` must be an int >= 1, got {dim!r}")
        max_len = MAX_BUFFER_LEN[self.family]
        if not isinstance(buffer_len, int) or not 1 <= buffer_len <= max_len:
            raise ValueError(f"{name}: `buffer_len` must be an int in [1, {max_len}], got {buffer_len!r}")
        if not isinstance(max_draft_tokens, int) or not 1 <= max_draft_tokens <= min(MAX_DRAFT_TOKENS, buffer_len):
            raise ValueError(f"{name}: `max_draft_tokens` must be an int in [1, min({MAX_DRAFT_TOKENS}, "
                             f"buffer_len={buffer_len})], got {max_draft_tokens!r}")
        if checkpoint_dtype not in ops.CHECKPOINT_DTYPES:
            raise ValueError(f"{name}: `checkpoint_dtype` must be one of float32, bfloat16, float16 "
                             f"(float64 on the reference backend), got {_dtype_name(checkpoint_dtype)}")
        if read_copy_dtype is not None and read_copy_dtype not in ops.READ_COPY_DTYPES:
            raise ValueError(f"{name}: `read_copy_dtype` must be None, bfloat16, float16 or float8_e4m3fn, "
                             f"got {_dtype_name(read_copy_dtype)}")
        if read_copy_dtype is not None and buffer_len == 1:
            raise ValueError(f"{name}: a read copy needs buffer_len >= 2 (with buffer_len=1 every step "
                             f"rewrites the checkpoint), got read_copy_dtype={_dtype_name(read_copy_dtype)} "
                             f"with buffer_len=1")
        if activation_dtype not in ops.ACTIVATION_DTYPES:
            raise ValueError(f"{name}: `activation_dtype` must be one of bfloat16, float16, float32 "
                             f"(float64 on the reference backend), got {_dtype_name(activation_dtype)}")
        if not isinstance(pad_slot_id, int) or isinstance(pad_slot_id, bool):
            raise ValueError(f"{name}: `pad_slot_id` must be an int, got {pad_slot_id!r}")
        ops.check_backend(name, backend)
        if not isinstance(staggered_flush, bool):
            raise ValueError(f"{name}: `staggered_flush` must be a bool, got {staggered_flush!r}")
        if not isinstance(validate, bool):
            raise ValueError(f"{name}: `validate` must be a bool, got {validate!r}")
        if max_draft_tokens == buffer_len > 1:
            warnings.warn(f"{name}: buffer_len == max_draft_tokens == {buffer_len}: every step folds the buffer "
                          f"into the checkpoint (a slot folds every buffer_len - max_draft_tokens + 1 tokens), "
                          f"so the replay saves nothing; use buffer_len > max_draft_tokens", UserWarning,
                          stacklevel=3)

        self.device = _cache_device(name, device)
        if backend == "cuda" and self.device.type != "cuda":
            raise ValueError(f"{name}: backend='cuda' needs device='cuda', got device={str(self.device)!r}")
        self.num_slots = num_slots
        self.buffer_len = buffer_len
        self.max_draft_tokens = max_draft_tokens
        self.activation_dtype = activation_dtype
        self.pad_slot_id = pad_slot_id
        self.backend = backend
        self.staggered_flush = staggered_flush
        # A slot folds when its next verify of max_draft_tokens would not fit: every `period` tokens.
        self.flush_period = buffer_len - max_draft_tokens + 1
        # fp64 caches (reference only) keep their fp32 buffer quantities in fp64 too.
        self.aux_dtype = torch.float64 if checkpoint_dtype == torch.float64 else torch.float32

        shape = (num_slots, *state_shape.values())
        if checkpoint is None:
            self.checkpoint = torch.zeros(shape, dtype=checkpoint_dtype, device=self.device)
        else:
            # A view into an engine's own pool (e.g. one layer of a (slots, layers, ...) tensor).
            ops.expect(name, "checkpoint", checkpoint, shape=shape, dtypes=(checkpoint_dtype,),
                       device=self.device, last_dim_contiguous=True)
            self.checkpoint = checkpoint
        self.read_copy = None if read_copy_dtype is None else torch.zeros(shape, dtype=read_copy_dtype, device=self.device)
        self.read_scale = (torch.ones(shape[:3], dtype=torch.float32, device=self.device)
                           if read_copy_dtype == torch.float8_e4m3fn else None)
        self.num_committed = torch.zeros(num_slots, dtype=torch.int32, device=self.device)
        # Entries each slot's last verify appended: the most its commit accepts (0 after a commit, load
        # or reset). copy_slots copies it with the buffers it describes, so a fork between a verify and
        # its commit may commit in either slot.
        self.num_verified = torch.zeros(num_slots, dtype=torch.int32, device=self.device)
        # The first misuse verify or commit detected, [code, row, value, limit] (ERROR_CODES), written
        # on the device and read only by check(); validate=True checks after every op.
        self.error_word = torch.zeros(4, dtype=torch.int32, device=self.device)
        self.validate = validate

    # ---- what the families provide ------------------------------------------------------------------

    def _buffers(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _family_limit(self, op: str) -> str | None:
        """Why the compiled kernel of family op `op` (update, step, ...) cannot take this cache, or None."""
        raise NotImplementedError

    # ---- the path of each op, chosen once ------------------------------------------------------------

    def _finish_init(self):
        self._buffer_list = list(self._buffers().values())
        self._slot_tensors = self.cache_tensors
        self._choose_paths()
        if self.read_copy is not None:
            self._run("make_read_copy", (self.checkpoint, self.read_copy, self.read_scale, None, self.pad_slot_id))
        self._stagger(None)

    def _choose_paths(self):
        """self._compiled[op]: True where the compiled kernel runs op (this cache on CUDA, the op compiled,
        its shapes and dtypes among what the kernel takes), else the reference. backend='cuda' makes any
        reference op an error here, backend='auto' warns once for those on CUDA."""
        name = type(self).__name__
        cols, has_copy = self.checkpoint.shape[3], self.read_copy is not None
        unused = "step" if self.buffer_len == 1 else "update"    # step() runs the update at buffer_len 1
        limits = {op: self._family_limit(kind) for kind, op in self._family_ops.items() if kind != unused}
        limits["make_read_copy"] = ops.cache_op_limit(self.checkpoint.dtype, cols, True)
        limits["load"] = ops.cache_op_limit(self.checkpoint.dtype, cols, has_copy)
        limits.update(reset=None, stagger_cursors=None, copy_slots=None)
        if not has_copy:
            del limits["make_read_copy"]
        self._compiled = {op: False for op in limits}
        if self.backend == "reference" or self.device.type != "cuda":
            return
        reasons: dict[str, list[str]] = {}
        for op, limit in limits.items():
            reason = ops.why_not_compiled(op) if not ops.has_kernel(op) else limit
            if reason is None:
                self._compiled[op] = True
            else:
                reasons.setdefault(reason, []).append(op)
        if self.backend == "cuda" and reasons:
            raise RuntimeError(f"{name}: backend='cuda' asked for, but "
                               + "; ".join(f"{reason} ({', '.join(names)})" for reason, names in reasons.items()))
        for reason, names in reasons.items():
            ops.warn_fallback(", ".join(names), reason, stacklevel=4)

    def _run(self, op: str, args: tuple) -> None:
        """Run op on the path chosen for it; the reference path's callers have checked their inputs.
        With validate=True, check() after it (eagerly, outside CUDA-graph capture)."""
        if self._compiled[op] or _is_compiling():
            ops.KERNELS[op](*args)
        else:
            REFERENCE[op](*args)
        self._check_if_validating()

    def _check_if_validating(self) -> None:
        """validate=True: check() now, eagerly (not under torch.compile, not during CUDA-graph capture)."""
        if self.validate and not _is_compiling() and not (self.device.type == "cuda"
                                                           and torch.cuda.is_current_stream_capturing()):
            self.check()

    def check(self) -> None:
        """Raise ValueError for the first misuse a verify or commit recorded since the last check (the op,
        the row and the value), and clear the record. Reads the device-side error word, so it
        synchronises with the device: for debugging and tests, or once in a while in serving; the ops
        themselves never wait on it. Misuse that is recorded: a slot id neither in [0, num_slots) nor
        pad_slot_id (the row was treated as a pad), a num_accepted outside [0, the entries the slot's
        last verify appended] (it was clamped there)."""
        code, row, value, limit = self.error_word.tolist()
        if code == 0:
            return
        self.error_word.zero_()
        name = type(self).__name__
        kind, what = ERROR_CODES.get(code, ("?", None))
        op = self._family_ops.get(kind, kind)
        if what == "slot":
            raise ValueError(f"{name}.check: {op} row {row}: slot id {value} is neither in [0, num_slots={limit}) "
                             f"nor pad_slot_id={self.pad_slot_id}; the row was treated as a pad (zero output, "
                             f"nothing written)")
        if what == "accepted":
            raise ValueError(f"{name}.check: {op} row {row}: num_accepted = {value} is outside [0, {limit}] (the "
                             f"entries the slot's last verify appended); it was clamped to that range")
        raise ValueError(f"{name}.check: unknown error code {code} (row {row}, value {value}, limit {limit})")

    def _reference_path(self, op: str) -> bool:
        """True where a method must check its per-call inputs (the reference path, eagerly)."""
        return not self._compiled[op] and not _is_compiling()

    # ---- family-independent methods ----------------------------------------------------------------

    @property
    def cache_tensors(self) -> list[torch.Tensor]:
        """Everything a slot owns, slot-major: checkpoint, read copy, scales, buffers, cursor, verified count."""
        tensors = [self.checkpoint, self.read_copy, self.read_scale, *self._buffers().values(), self.num_committed,
                   self.num_verified]
        return [t for t in tensors if t is not None]

    def bytes_per_slot(self) -> dict[str, int]:
        """Memory of one slot, per tensor and in total (for sizing a slot pool)."""
        sizes = {"checkpoint": self.checkpoint[0].numel() * self.checkpoint.element_size()}
        if self.read_copy is not None:
            sizes["read_copy"] = self.read_copy[0].numel() * self.read_copy.element_size()
        if self.read_scale is not None:
            sizes["read_scale"] = self.read_scale[0].numel() * self.read_scale.element_size()
        for buf_name, buf in self._buffers().items():
            sizes[buf_name] = buf[0].numel() * buf.element_size()
        sizes["num_committed"] = self.num_committed.element_size()
        sizes["num_verified"] = self.num_verified.element_size()
        sizes["total"] = sum(sizes.values())
        return sizes

    def load(self, states, slots=None):
        """Write prefill states (batch, *state shape) into the slots; regenerate read copies; empty buffers."""
        _checks.slots_type("load", slots)
        if self._reference_path("load"):
            _checks.load_states("load", self.checkpoint, states, slots)
        self._run("load", (self.checkpoint, self.read_copy, self.read_scale, self.num_committed, states, slots,
                           self.pad_slot_id))
        # No verify is pending in a loaded slot: stagger_cursors with period 1 and no buffers sets the
        # named slots' counter (here num_verified) to slot % 1 = 0, on the device like load itself.
        # Without slots, load's rows are slots 0 .. batch - 1 (stagger_cursors' None means every slot).
        loaded = slots if slots is not None else torch.arange(states.shape[0], device=self.device)
        self._run("stagger_cursors", ([], self.num_verified, loaded, self.pad_slot_id, 1))
        self._stagger(loaded)  # the loaded slots only: the others may hold live sequences

    def reset(self, slots=None):
        """Zero the checkpoint, read copy, buffers, cursor and verified count of the slots (all when None)."""
        _checks.slots_type("reset", slots)
        if self._reference_path("reset"):
            _checks.slot_list("reset", "slots", slots, self.device)
        self._run("reset", (self.checkpoint, self.read_copy, self.read_scale, [*self._buffer_list, self.num_verified],
                            self.num_committed, slots, self.pad_slot_id))
        self._stagger(slots)

    def _stagger(self, slots):
        """With staggered_flush, start slot s with s % flush_period neutral (zero) buffer entries: its
        first fold comes that many tokens early and every later one stays offset, so slots that start
        together do not all fold in the same step (the step that folds costs ~2.5x a plain one)."""
        if self.staggered_flush and self.flush_period > 1:
            self._run("stagger_cursors", (self._buffer_list, self.num_committed, slots, self.pad_slot_id,
                                          self.flush_period))

    def copy_slots(self, src_slots, dst_slots):
        """Copy checkpoint, read copy, buffers and cursor of src_slots[i] to dst_slots[i] (fork); pairs
        naming pad_slot_id or an out-of-range slot are skipped."""
        args = (self._slot_tensors, src_slots, dst_slots, self.pad_slot_id)
        _checks.slots_type("copy_slots", src_slots, "src_slots")
        _checks.slots_type("copy_slots", dst_slots, "dst_slots")
        if self._reference_path("copy_slots"):
            _checks.copy_pairs("copy_slots", src_slots, dst_slots, self.device)
            REFERENCE["copy_slots"](*args)
            return
        if not _is_compiling() and isinstance(src_slots, torch.Tensor) and src_slots.shape[0] > ops.MAX_COPY_SLOTS_PAIRS:
            # More pairs than one launch stages: the reference, or an error under backend='cuda'.
            ops.copy_slots(*args, backend=self.backend)
            return
        ops.KERNELS["copy_slots"](*args)

    def _cache_args(self) -> tuple:
        """The cache tensors in the order of the family's step, flush (checkpoint ... num_committed)."""
        return self._cache

    def _spec_cache_args(self) -> tuple:
        """The cache tensors in the order of the family's verify and commit (... num_committed, num_verified)."""
        return (*self._cache, self.num_verified)

    def _check_draft_count(self, op: str, T: int):
        if T > self.max_draft_tokens:
            raise ValueError(f"{type(self).__name__}.{op}: T={T} draft tokens exceed max_draft_tokens="
                             f"{self.max_draft_tokens} set at construction")

    def _draft_layout(self, op: str, cu_seqlens, max_draft_tokens, slots, flat: dict) -> _DraftLayout:
        """Checks the layout arguments of a varlen verify (the values of cu_seqlens on the reference path
        only: reading them elsewhere would be a host sync) and places the flattened tokens."""
        name = f"{type(self).__name__}.verify_varlen"
        T = self.max_draft_tokens if max_draft_tokens is None else max_draft_tokens
        if not isinstance(T, int) or isinstance(T, bool) or not 1 <= T <= self.max_draft_tokens:
            raise ValueError(f"{name}: `max_draft_tokens` must be None or an int in [1, {self.max_draft_tokens}] "
                             f"(max_draft_tokens set at construction), got {max_draft_tokens!r}")
        _checks.slots_type(op, slots)
        batch, total = _checks.varlen(op, cu_seqlens, slots, self.device, flat)
        # Without slots the batch comes from cu_seqlens; _limit_verified indexes num_verified with it.
        _checks.slots(op, slots, batch, self.num_slots, self.device)
        if self._reference_path(op):
            _checks.varlen_values(op, cu_seqlens, total, T)
        return _DraftLayout.of(cu_seqlens, batch, T, total)

    def _limit_verified(self, slots, counts: torch.Tensor) -> None:
        """After a varlen verify, lower num_verified[slot] (which the dense verify set to T) to the row's
        own draft count, so that commit accepts at most the drafts the row had. A pad or out-of-range row
        names slot 0 with the int32 maximum, which changes nothing; row r uses slot r without `slots`."""
        if slots is None:
            idx, src = torch.arange(counts.shape[0], device=self.device), counts
        else:
            idx = slots.long()
            named = (idx != self.pad_slot_id) & (idx >= 0) & (idx < self.num_slots)
            idx = torch.where(named, idx, 0)
            src = torch.where(named, counts, torch.iinfo(torch.int32).max)
        self.num_verified.scatter_reduce_(0, idx, src.to(self.num_verified.dtype), reduce="amin")

    def _state_out(self, op: str, slots, out):
        """materialize's output: allocated (batch, *state shape) in the aux dtype, or the caller's, checked
        on the reference path."""
        _checks.slots_type(op, slots)
        if out is None:
            batch = self.num_slots if slots is None else slots.shape[0]
            return torch.empty(batch, *self.checkpoint.shape[1:], dtype=self.aux_dtype, device=self.device)
        if self._reference_path(op):
            _checks.state_out(op, self.checkpoint, out)
        return out


class Mamba2Cache(_ReplayCache):
    """ReplaySSM cache of one Mamba-2 layer: checkpoint (slots, H, P, N), buffers of x, B and dt."""

    family = "mamba2"
    _family_ops = {kind: f"mamba2_{kind}" for kind in ("update", "step", "verify", "commit", "flush", "materialize")}

    def __init__(self, num_slots: int, num_heads: int, head_dim: int, state_dim: int, num_groups: int,
                 weights: Mamba2Weights, *, buffer_len: int = 16, max_draft_tokens: int = 1,
                 checkpoint_dtype=torch.float32, read_copy_dtype=None, activation_dtype=torch.bfloat16,
                 pad_slot_id: int = -1, device=None, backend: str = "auto", checkpoint=None,
                 staggered_flush: bool = False, stochastic_rounding: bool = False, seed: int = 0,
                 validate: bool = False):
        """stochastic_rounding: a bf16 / fp16 checkpoint rounds its folds (and the L=1 update)
        stochastically, unbiased, instead of to nearest (reference.stochastic_round); the cache owns the
        device tensor `rounding_seed` = [seed, offset] that the ops advance. Give each layer its own seed.
        staggered_flush: slots start with different fold phases (_stagger), and step() passes the flag on
        to ops.mamba2_step as its launch hint (smaller CTAs for steps in which only a few slots fold, and
        with a read copy the folding rows first). validate: check() after every op, which raises the
        first misuse verify or commit recorded (synchronising: for debugging)."""
        if not isinstance(stochastic_rounding, bool):
            raise ValueError(f"Mamba2Cache: `stochastic_rounding` must be a bool, got {stochastic_rounding!r}")
        if stochastic_rounding and checkpoint_dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"Mamba2Cache: stochastic_rounding=True needs checkpoint_dtype bfloat16 or float16, "
                             f"got {_dtype_name(checkpoint_dtype)}")
        if not isinstance(seed, int) or isinstance(seed, bool) or not -2**63 <= seed < 2**63:
            raise ValueError(f"Mamba2Cache: `seed` must be an int in [-2**63, 2**63), got {seed!r}")
        super().__init__(num_slots, {"num_heads": num_heads, "head_dim": head_dim, "state_dim": state_dim},
                         buffer_len=buffer_len, max_draft_tokens=max_draft_tokens,
                         checkpoint_dtype=checkpoint_dtype, read_copy_dtype=read_copy_dtype,
                         activation_dtype=activation_dtype, pad_slot_id=pad_slot_id, device=device,
                         backend=backend, checkpoint=checkpoint, staggered_flush=staggered_flush, validate=validate)
        if not isinstance(num_groups, int) or num_groups < 1 or num_heads % num_groups != 0:
            raise ValueError(f"Mamba2Cache: `num_groups` must divide num_heads={num_heads}, got {num_groups!r}")
        if not isinstance(weights, Mamba2Weights):
            raise TypeError(f"Mamba2Cache: `weights` must be a Mamba2Weights, got {type(weights).__name__}")
        _checks.mamba2_weights("Mamba2Cache", num_heads, self.device, weights.A, weights.D, weights.dt_bias,
                               prefix="weights.")
        if not isinstance(weights.dt_softplus, bool):
            raise ValueError(f"Mamba2Cache: `weights.dt_softplus` must be a bool, got {weights.dt_softplus!r}")
        not_decay = ~(weights.A <= 0)   # NaN too
        if bool(not_decay.any()):
            head = int(not_decay.nonzero()[0, 0])
            raise ValueError(f"Mamba2Cache: `weights.A` must be <= 0 (a decay rate, A = -exp(A_log)), got "
                             f"{weights.A[head].item()!r} at head {head}")
        self.weights = weights
        self.num_heads, self.head_dim, self.state_dim, self.num_groups = num_heads, head_dim, state_dim, num_groups
        S, L = num_slots, buffer_len
        self.x_buf = torch.zeros(S, num_heads, L, head_dim, dtype=activation_dtype, device=self.device)
        self.B_buf = torch.zeros(S, num_groups, L, state_dim, dtype=activation_dtype, device=self.device)
        self.dt_buf = torch.zeros(S, num_heads, L, dtype=self.aux_dtype, device=self.device)
        # Per cache, not per slot: the random bits already depend on the slot.
        self.rounding_seed = (torch.tensor([seed, 0], dtype=torch.int64, device=self.device)
                              if stochastic_rounding else None)
        self._cache = (self.checkpoint, self.read_copy, self.read_scale, self.x_buf, self.B_buf, self.dt_buf,
                       self.num_committed)
        self._finish_init()

    def _buffers(self):
        return {"x_buf": self.x_buf, "B_buf": self.B_buf, "dt_buf": self.dt_buf}

    def _family_limit(self, kind):
        ck = self.checkpoint
        limit = ops.mamba2_limit(self.head_dim, self.state_dim, ck.dtype,
                                 None if self.read_copy is None or kind == "update" else self.read_copy.dtype,
                                 self.activation_dtype, update=kind == "update")
        if limit is None and kind != "update":
            if self.aux_dtype != torch.float32:
                limit = f"a {_dtype_name(self.aux_dtype)} dt_buf has no compiled kernel (float32)"
            elif self.buffer_len > ops.KERNEL_MAX_BUFFER_LEN:
                limit = f"buffer_len = {self.buffer_len} exceeds the compiled kernels' {ops.KERNEL_MAX_BUFFER_LEN}"
            elif kind == "verify" and self.max_draft_tokens > ops.KERNEL_MAX_DRAFT_TOKENS:
                limit = (f"max_draft_tokens = {self.max_draft_tokens} exceeds the compiled kernel's "
                         f"{ops.KERNEL_MAX_DRAFT_TOKENS}")
        return limit

    def _inputs(self, op, x, dt, B, C, out, z, slots, ndim):
        lead = _checks.lead_of(op, "x", x, ndim)
        _checks.mamba2_inputs(op, self.num_heads, self.head_dim, self.state_dim, self.activation_dtype, self.device,
                              x, dt, B, C, out, z, lead, self.num_groups)
        _checks.slots(op, slots, lead[0], self.num_slots, self.device)

    def step(self, x, dt, B, C, z=None, slots=None, out=None):
        """One decode token per row: x, z (batch, H, P); dt (batch, H); B, C (batch, G, N). Returns y."""
        w = self.weights
        if self.buffer_len == 1:   # nothing to buffer: the conventional update is the L=1 replay
            op = "mamba2_update"
            _checks.slots_type(op, slots)
            out = torch.empty_like(x) if out is None else out
            if self._reference_path(op):
                self._inputs(op, x, dt, B, C, out, z, slots, 3)
            self._run(op, (self.checkpoint, x, dt, w.A, B, C, out, w.D, z, w.dt_bias, w.dt_softplus, slots,
                           self.pad_slot_id, self.rounding_seed))
            return out
        op = "mamba2_step"
        _checks.slots_type(op, slots)
        out = torch.empty_like(x) if out is None else out
        if self._reference_path(op):
            self._inputs(op, x, dt, B, C, out, z, slots, 3)
        self._run(op, (*self._cache, x, dt, w.A, B, C, out, w.D, z, w.dt_bias, w.dt_softplus, self.max_draft_tokens,
                       slots, self.pad_slot_id, self.rounding_seed, self.staggered_flush))
        return out

    def verify(self, x, dt, B, C, z=None, slots=None, out=None):
        """Outputs of T draft tokens per row (x (batch, T, H, P) ...); commits nothing."""
        op = "mamba2_verify"
        self._check_draft_count("verify", x.shape[1] if x.dim() == 4 else 0)
        _checks.slots_type(op, slots)
        w = self.weights
        out = torch.empty_like(x) if out is None else out
        if self._reference_path(op):
            self._inputs(op, x, dt, B, C, out, z, slots, 4)
        self._run(op, (*self._spec_cache_args(), x, dt, w.A, B, C, out, w.D, z, w.dt_bias, w.dt_softplus, slots,
                       self.pad_slot_id, self.error_word))
        return out

    def verify_varlen(self, x, dt, B, C, z=None, *, cu_seqlens, max_draft_tokens=None, slots=None, out=None):
        """verify of flattened drafts, as engines pass them: x, z, out (total_tokens, H, P); dt
        (total_tokens, H); B, C (total_tokens, G, N); row r's drafts are tokens cu_seqlens[r] ..
        cu_seqlens[r + 1] - 1 (0 .. max_draft_tokens of them). Packs them into verify's dense block of
        max_draft_tokens (the cache's unless given) per row, runs it and unpacks the outputs. Returns out."""
        op = "mamba2_verify"
        layout = self._draft_layout(op, cu_seqlens, max_draft_tokens, slots,
                                    {"x": x, "dt": dt, "B": B, "C": C, "z": z, "out": out})
        out = torch.empty_like(x) if out is None else out
        if self._reference_path(op):
            _checks.mamba2_inputs(op, self.num_heads, self.head_dim, self.state_dim, self.activation_dtype,
                                  self.device, x, dt, B, C, out, z, (x.shape[0],), self.num_groups)
        block = layout.out_block(out)
        self.verify(*(layout.pack(t) for t in (x, dt, B, C, z)), slots=slots, out=layout.dense(block))
        self._limit_verified(slots, layout.counts)
        return layout.unpack(block, out)

    def commit(self, num_accepted, slots=None):
        """Keep the first num_accepted[r] verified tokens of each row (device tensor; no host sync),
        num_accepted clamped to [0, the tokens the slot's last verify appended]; a second commit without
        a verify keeps nothing."""
        op = "mamba2_commit"
        _checks.slots_type(op, slots)
        if self._reference_path(op):
            ops.expect(op, "num_accepted", num_accepted, shape=(None,), dtypes=ops.INDEX_DTYPES, device=self.device)
            _checks.slots(op, slots, num_accepted.shape[0], self.num_slots, self.device)
        self._run(op, (*self._spec_cache_args(), num_accepted, self.weights.A, self.max_draft_tokens, slots,
                       self.pad_slot_id, self.rounding_seed, self.error_word))

    def flush(self, slots=None):
        """Fold all committed tokens of the slots (all when None) into their checkpoints."""
        op = "mamba2_flush"
        _checks.slots_type(op, slots)
        if self._reference_path(op):
            _checks.slot_list(op, "slots", slots, self.device)
        self._run(op, (*self._cache, self.weights.A, slots, self.pad_slot_id, self.rounding_seed))

    def materialize(self, slots=None, out=None):
        """Full-precision state (batch, H, P, N) at each row's committed position; cache unchanged."""
        op = "mamba2_materialize"
        out = self._state_out(op, slots, out)
        if self._reference_path(op):
            _checks.slots(op, slots, out.shape[0], self.num_slots, self.device)
        self._run(op, (self.checkpoint, self.x_buf, self.B_buf, self.dt_buf, self.num_committed, self.weights.A, out,
                       slots, self.pad_slot_id))
        return out


class _DeltaRuleCache(_ReplayCache):
    """ReplaySSM cache of one GDN or KDA layer: checkpoint (slots, HV, V, K), buffers of raw k and v,
    the gates g and beta, and the corrected values u."""

    def __init__(self, num_slots: int, num_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                 weights: DeltaRuleWeights, *, buffer_len: int = 16, max_draft_tokens: int = 1,
                 checkpoint_dtype=torch.float32, read_copy_dtype=None, activation_dtype=torch.bfloat16,
                 pad_slot_id: int = -1, device=None, backend: str = "auto", checkpoint=None,
                 staggered_flush: bool = False, validate: bool = False):
        name = type(self).__name__
        super().__init__(num_slots, {"num_v_heads": num_v_heads, "head_v_dim": head_v_dim, "head_k_dim": head_k_dim},
                         buffer_len=buffer_len, max_draft_tokens=max_draft_tokens,
                         checkpoint_dtype=checkpoint_dtype, read_copy_dtype=read_copy_dtype,
                         activation_dtype=activation_dtype, pad_slot_id=pad_slot_id, device=device,
                         backend=backend, checkpoint=checkpoint, staggered_flush=staggered_flush, validate=validate)
        if not isinstance(num_heads, int) or num_heads < 1 or num_v_heads % num_heads != 0:
            raise ValueError(f"{name}: `num_v_heads` ({num_v_heads}) must be a multiple of `num_heads`, "
                             f"got num_heads={num_heads!r}")
        if not isinstance(weights, DeltaRuleWeights):
            raise TypeError(f"{name}: `weights` must be a DeltaRuleWeights, got {type(weights).__name__}")
        _checks.delta_weights(name, self.family, num_v_heads, head_k_dim, self.device, weights.A_log,
                              weights.dt_bias, prefix="weights.")
        _checks.scale(name, weights.scale)
        if not isinstance(weights.use_qk_l2norm, bool):
            raise ValueError(f"{name}: `weights.use_qk_l2norm` must be a bool, got {weights.use_qk_l2norm!r}")
        self.weights = weights
        self.num_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim = num_heads, num_v_heads, head_k_dim, head_v_dim
        S, L, aux = num_slots, buffer_len, self.aux_dtype
        self.k_buf = torch.zeros(S, num_heads, L, head_k_dim, dtype=activation_dtype, device=self.device)
        self.v_buf = torch.zeros(S, num_v_heads, L, head_v_dim, dtype=activation_dtype, device=self.device)
        g_shape = (S, num_v_heads, L, head_k_dim) if self.family == "kda" else (S, num_v_heads, L)
        self.g_buf = torch.zeros(g_shape, dtype=aux, device=self.device)
        self.beta_buf = torch.zeros(S, num_v_heads, L, dtype=aux, device=self.device)
        self.u_buf = torch.zeros(S, num_v_heads, L, head_v_dim, dtype=aux, device=self.device)
        self._cache = (self.checkpoint, self.read_copy, self.read_scale, self.k_buf, self.v_buf, self.g_buf,
                       self.beta_buf, self.u_buf, self.num_committed)
        self._finish_init()

    def _buffers(self):
        return {"k_buf": self.k_buf, "v_buf": self.v_buf, "g_buf": self.g_buf, "beta_buf": self.beta_buf,
                "u_buf": self.u_buf}

    def _family_limit(self, kind):
        # The kernels take what capabilities()[family] lists (KDA: GDN's kernels with the decay per key
        # channel); an op this build does not compile is _choose_paths' to report.
        update = kind == "update"
        kernels = ops.DELTA_KERNELS[self.family]
        limit = ops.gdn_limit(self.head_v_dim, self.head_k_dim, self.checkpoint.dtype,
                              None if self.read_copy is None or update else self.read_copy.dtype,
                              self.activation_dtype, update=update, family=self.family)
        w = self.weights
        if limit is None:
            for name, t in (("weights.A_log", w.A_log), ("weights.dt_bias", w.dt_bias)):
                if t.dtype != torch.float32:
                    return f"a {_dtype_name(t.dtype)} {name} has no compiled kernel (float32)"
        if limit is None and not update:
            if self.aux_dtype != torch.float32:
                limit = f"{_dtype_name(self.aux_dtype)} g_buf, beta_buf and u_buf have no compiled kernel (float32)"
            elif self.buffer_len > kernels.max_buffer_len:
                limit = f"buffer_len = {self.buffer_len} exceeds the compiled kernels' {kernels.max_buffer_len}"
            elif kind == "verify" and self.max_draft_tokens > kernels.max_draft_tokens:
                limit = (f"max_draft_tokens = {self.max_draft_tokens} exceeds the compiled kernel's "
                         f"{kernels.max_draft_tokens}")
        return limit

    def _inputs(self, op, q, k, v, a, b, out, slots, ndim):
        lead = _checks.lead_of(op, "q", q, ndim)
        _checks.delta_inputs(op, self.family, self.num_heads, self.num_v_heads, self.head_v_dim, self.head_k_dim,
                             self.activation_dtype, self.device, q, k, v, a, b, out, lead)
        _checks.slots(op, slots, lead[0], self.num_slots, self.device)

    def step(self, q, k, v, a, b, slots=None, out=None):
        """One decode token per row: q, k (batch, H, K); v (batch, HV, V); a (batch, HV) for GDN,
        (batch, HV, K) for KDA; b (batch, HV). Returns o (batch, HV, V)."""
        w = self.weights
        kind = "update" if self.buffer_len == 1 else "step"
        op = self._family_ops[kind]
        _checks.slots_type(op, slots)
        out = torch.empty_like(v) if out is None else out
        if self._reference_path(op):
            self._inputs(op, q, k, v, a, b, out, slots, 3)
        if kind == "update":
            self._run(op, (self.checkpoint, q, k, v, a, b, w.A_log, w.dt_bias, out, w.scale, w.use_qk_l2norm, slots,
                           self.pad_slot_id))
        else:
            self._run(op, (*self._cache, q, k, v, a, b, w.A_log, w.dt_bias, out, w.scale, w.use_qk_l2norm,
                           self.max_draft_tokens, slots, self.pad_slot_id, self.staggered_flush))
        return out

    def verify(self, q, k, v, a, b, slots=None, out=None):
        """Outputs of T draft tokens per row (q (batch, T, H, K) ...); commits nothing."""
        op = self._family_ops["verify"]
        self._check_draft_count("verify", q.shape[1] if q.dim() == 4 else 0)
        _checks.slots_type(op, slots)
        w = self.weights
        out = torch.empty_like(v) if out is None else out
        if self._reference_path(op):
            self._inputs(op, q, k, v, a, b, out, slots, 4)
        self._run(op, (*self._spec_cache_args(), q, k, v, a, b, w.A_log, w.dt_bias, out, w.scale,
                       w.use_qk_l2norm, slots, self.pad_slot_id, self.error_word))
        return out

    def verify_varlen(self, q, k, v, a, b, *, cu_seqlens, max_draft_tokens=None, slots=None, out=None):
        """verify of flattened drafts, as engines pass them: q, k (total_tokens, H, K); v, out
        (total_tokens, HV, V); a, b (total_tokens, HV) (KDA: a (total_tokens, HV, K)); row r's drafts are
        tokens cu_seqlens[r] .. cu_seqlens[r + 1] - 1 (0 .. max_draft_tokens of them). Packs them into
        verify's dense block of max_draft_tokens (the cache's unless given) per row, runs it and unpacks
        the outputs. Returns out."""
        op = self._family_ops["verify"]
        layout = self._draft_layout(op, cu_seqlens, max_draft_tokens, slots,
                                    {"q": q, "k": k, "v": v, "a": a, "b": b, "out": out})
        out = torch.empty_like(v) if out is None else out
        if self._reference_path(op):
            _checks.delta_inputs(op, self.family, self.num_heads, self.num_v_heads, self.head_v_dim, self.head_k_dim,
                                 self.activation_dtype, self.device, q, k, v, a, b, out, (q.shape[0],))
        block = layout.out_block(out)
        self.verify(*(layout.pack(t) for t in (q, k, v, a, b)), slots=slots, out=layout.dense(block))
        self._limit_verified(slots, layout.counts)
        return layout.unpack(block, out)

    def commit(self, num_accepted, slots=None):
        """Keep the first num_accepted[r] verified tokens of each row (device tensor; no host sync),
        num_accepted clamped to [0, the tokens the slot's last verify appended]; a second commit without
        a verify keeps nothing."""
        op = self._family_ops["commit"]
        _checks.slots_type(op, slots)
        if self._reference_path(op):
            ops.expect(op, "num_accepted", num_accepted, shape=(None,), dtypes=ops.INDEX_DTYPES, device=self.device)
            _checks.slots(op, slots, num_accepted.shape[0], self.num_slots, self.device)
        self._run(op, (*self._spec_cache_args(), num_accepted, self.max_draft_tokens,
                       self.weights.use_qk_l2norm, slots, self.pad_slot_id, self.error_word))

    def flush(self, slots=None):
        """Fold all committed tokens of the slots (all when None) into their checkpoints."""
        op = self._family_ops["flush"]
        _checks.slots_type(op, slots)
        if self._reference_path(op):
            _checks.slot_list(op, "slots", slots, self.device)
        self._run(op, (*self._cache, self.weights.use_qk_l2norm, slots, self.pad_slot_id))

    def materialize(self, slots=None, out=None):
        """Full-precision state (batch, HV, V, K) at each row's committed position; cache unchanged."""
        op = self._family_ops["materialize"]
        out = self._state_out(op, slots, out)
        if self._reference_path(op):
            _checks.slots(op, slots, out.shape[0], self.num_slots, self.device)
        self._run(op, (self.checkpoint, self.k_buf, self.v_buf, self.g_buf, self.beta_buf, self.u_buf,
                       self.num_committed, out, self.weights.use_qk_l2norm, slots, self.pad_slot_id))
        return out


class GDNCache(_DeltaRuleCache):
    """ReplaySSM cache of one Gated DeltaNet layer (scalar decay per v-head)."""
    family = "gdn"
    _family_ops = {kind: f"gdn_{kind}" for kind in ("update", "step", "verify", "commit", "flush", "materialize")}


class KDACache(_DeltaRuleCache):
    """ReplaySSM cache of one Kimi Delta Attention layer (decay per v-head and key channel)."""
    family = "kda"
    _family_ops = {kind: f"kda_{kind}" for kind in ("update", "step", "verify", "commit", "flush", "materialize")}
