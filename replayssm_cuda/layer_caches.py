"""LayerCaches: the slot management of every SSM layer of a model, one launch per call.

An engine resets the slots of finished requests and forks requests (copy_slots) in every SSM layer of
its model at once. Layer by layer that is one launch per layer (two for a reset with staggered_flush),
40-90 launches where one does: LayerCaches groups the layer caches and runs each call as ONE launch
over the tensors of all of them, with the same semantics as calling each layer's method in a loop:

    layers = LayerCaches([mamba_cache_0, gdn_cache_0, mamba_cache_1, ...])
    layers.reset(finished_slots)                 # every layer's reset(), staggered start included
    layers.copy_slots(parent_slots, child_slots)   # every layer's copy_slots(), a gather in every layer

The slot ops move bytes and know no family, so any mix of Mamba2Cache, GDNCache and KDACache (and of
checkpoint / read-copy dtypes) may be grouped; the caches must share num_slots, pad_slot_id and device.

Paths. On CUDA with the compiled table ops (and every cache running its own slot ops compiled), the
constructor builds once a device table of every cache tensor of every layer (replayssm_cuda._C.slot_table:
base, slot stride, bytes per slot, fill; one host-to-device copy, so construct outside CUDA-graph
capture). Each call then launches torch.ops.replayssm.fill_slots_table / copy_slots_table on the current
stream: no allocation, no host synchronisation, no host-to-device copy, so calls can be captured in a
CUDA graph. Everywhere else (CPU caches, the reference backend, a build without these ops) a call is the
loop over the layers' own methods: the same results, no launch saved. `one_launch` says which path runs.

copy_slots keeps the gather semantics across all layers (every source read before any destination is
written): a CTA owns one byte range of one tensor for all pairs, and the table builder rejects caches
whose tensors share memory. More pairs than one launch stages (capabilities()["cache"]
["copy_slots_max_pairs"]) run the loop, as each layer's copy_slots falls back itself.

Commit, flush and materialize of the SSM layers of a model of one family with a layer table (a group of
Mamba2Cache only, or of GDNCache only) run in one launch each too when every layer shares one shape,
dtype set and layout (the constructor checks it; layers that differ run the loop, with a RuntimeWarning
naming the layer and the field, kept in `fold_loop_reason`), so the kernels take layer 0's strides once
and each layer's pointers from a second device table built once (replayssm_cuda._C.mamba2_layer_table /
gdn_layer_table), with the layer a grid dimension. load runs the per-layer loads (each layer's load(),
on every path): one launch for all layers measured slower than the loop at batch 64 and 256
(docs/EXPERIMENTS.md), and load runs once per admitted request, outside the decode step:

    layers.commit(num_accepted, slots)   # every layer's commit(); one num_accepted [batch] for all layers
    layers.flush(slots)                  # every layer's flush()
    states = layers.materialize(slots)   # (layers, batch, *state shape) fp32: states[i] is layer i's
    layers.load(states, slots)           # every layer's load(states[i], slots)

commit and flush are one fold launch and one cursor launch in all (the per-layer ops are two each). A
group of several families (or of KDA layers, which run the reference) runs commit, flush and materialize
as the loop over its layers (materialize then returns a list). `one_launch_fold` says which path runs.
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from . import _checks, _extension, _schemas, ops
from .cache import _ReplayCache


@dataclass(frozen=True)
class _FoldFamily:
    """What the one-launch commit, flush and materialize of a group of one family need."""
    family: str
    shared: tuple[str, ...]          # the fields every layer shares (the kernels take layer 0's)
    table_builder: str               # replayssm_cuda._C.<table_builder>(*lists)
    lists: Callable                  # caches -> the *_layers ops' lists (their schema's order)
    flags: Callable                  # layer 0 -> the per-family arguments before slots (GDN: use_qk_l2norm)

    @property
    def layer_ops(self) -> tuple[str, str, str]:
        return _schemas.LAYER_OPS_OF[self.family]


def _every(caches, attr):
    """Every layer's tensor `attr` (empty where the layers have none: they all agree, as checked)."""
    tensors = [getattr(cache, attr, None) for cache in caches]
    return [] if tensors[0] is None else tensors


_FOLD_FAMILIES = {
    "mamba2": _FoldFamily(
        "mamba2",
        ("num_heads", "head_dim", "state_dim", "num_groups", "buffer_len", "max_draft_tokens", "activation_dtype",
         "aux_dtype", "staggered_flush", "backend"),
        "mamba2_layer_table",
        lambda caches: [*(_every(caches, a) for a in ("checkpoint", "read_copy", "read_scale", "x_buf", "B_buf",
                                                      "dt_buf", "num_committed", "num_verified")),
                        [cache.weights.A for cache in caches], _every(caches, "rounding_seed"),
                        _every(caches, "error_word")],
        lambda first: ()),
    "gdn": _FoldFamily(
        "gdn",
        ("num_heads", "num_v_heads", "head_k_dim", "head_v_dim", "buffer_len", "max_draft_tokens",
         "activation_dtype", "aux_dtype", "staggered_flush", "backend", "weights.use_qk_l2norm"),
        "gdn_layer_table",
        lambda caches: [_every(caches, a) for a in ("checkpoint", "read_copy", "read_scale", "k_buf", "v_buf",
                                                    "g_buf", "beta_buf", "u_buf", "num_committed", "num_verified",
                                                    "error_word")],
        lambda first: (first.weights.use_qk_l2norm,)),
}


class LayerCaches:
    """The caches of the SSM layers of one model, for slot management in one launch per call."""

    def __init__(self, caches):
        name = "LayerCaches"
        if isinstance(caches, _ReplayCache) or not isinstance(caches, (list, tuple)):
            raise TypeError(f"{name}: `caches` must be a list of layer caches (Mamba2Cache, GDNCache, KDACache), "
                            f"got {type(caches).__name__}")
        if not caches:
            raise ValueError(f"{name}: `caches` must hold at least one layer cache, got an empty list")
        first = caches[0]
        seen: dict[int, int] = {}
        for i, cache in enumerate(caches):
            if not isinstance(cache, _ReplayCache):
                raise TypeError(f"{name}: `caches[{i}]` must be a Mamba2Cache, GDNCache or KDACache, "
                                f"got {type(cache).__name__}")
            if id(cache) in seen:
                raise ValueError(f"{name}: `caches[{i}]` must be a different cache from every other, got the cache "
                                 f"of caches[{seen[id(cache)]}] again")
            seen[id(cache)] = i
            for attr in ("num_slots", "pad_slot_id", "device"):
                if getattr(cache, attr) != getattr(first, attr):
                    raise ValueError(f"{name}: `caches[{i}]` must have {attr} = {getattr(first, attr)} like caches[0], "
                                     f"got {getattr(cache, attr)}")
        self.caches = tuple(caches)
        self.num_slots = first.num_slots
        self.pad_slot_id = first.pad_slot_id
        self.device = first.device
        self.one_launch = self._can_launch_once()
        if self.one_launch:
            self._tensors, fill_values, fill_periods = self._table_entries()
            self._fill_values, self._fill_periods = fill_values, fill_periods
            self._table = _extension._C.slot_table(self._tensors, fill_values, fill_periods)
        # A group of one family with a layer table (Mamba-2 or GDN): one shape and layout (checked here),
        # one-launch fold ops. A group whose layers differ (a test rig, a model with two layer widths)
        # loops over its layers for these ops; the reason is kept and said once, so the slow path is never
        # silent.
        families = {cache.family for cache in self.caches}
        self._fold = _FOLD_FAMILIES.get(first.family) if len(families) == 1 else None
        if self._fold is None:
            self.fold_loop_reason = (f"the layers are of several families ({', '.join(sorted(families))})"
                                     if len(families) > 1 else f"{first.family} layers have no layer table")
        else:
            self.fold_loop_reason = self._mismatch()
            if self.fold_loop_reason is not None:
                warnings.warn(f"LayerCaches: commit, flush and materialize loop over the layers: "
                              f"{self.fold_loop_reason}", RuntimeWarning, stacklevel=2)
                self._fold = None
        if self._fold is not None:
            self._layer_lists = self._fold.lists(self.caches)
        self.one_launch_fold = self._fold is not None and self._can_fold_once()
        if self.one_launch_fold:
            self._layer_table = getattr(_extension._C, self._fold.table_builder)(*self._layer_lists)
            # The ops and the per-family arguments, resolved once: commit, flush and materialize are on the
            # decode step's hot path.
            self._commit_op, self._flush_op, self._materialize_op = (ops.KERNELS[op] for op in self._fold.layer_ops)
            self._flags = self._fold.flags(first)

    @property
    def fold_family(self) -> str | None:
        """The family whose layers share one layer table ("mamba2" or "gdn": commit, flush and materialize
        run as one launch each where one_launch_fold, and materialize returns one (layers, batch, ...)
        tensor), or None where these ops loop over the layers (several families, KDA, layers that differ)."""
        return None if self._fold is None else self._fold.family

    def _mismatch(self) -> str | None:
        """Why the layers cannot share one layer table (None when every layer has caches[0]'s shapes, dtypes,
        buffer geometry and tensor layouts)."""
        first = self.caches[0]
        for i, cache in enumerate(self.caches[1:], start=1):
            for attr in self._fold.shared:
                got, want = operator.attrgetter(attr)(cache), operator.attrgetter(attr)(first)
                if got != want:
                    return f"the layers differ in {attr}: caches[{i}].{attr} = {got}, caches[0].{attr} = {want}"
            for attr in ("checkpoint", "read_copy", "read_scale", "rounding_seed", *cache._buffers()):
                a, b = getattr(cache, attr, None), getattr(first, attr, None)
                if (a is None) != (b is None):
                    what = {"read_copy": "a read copy", "read_scale": "fp8 read scales",
                            "rounding_seed": "stochastic rounding"}.get(attr, attr)
                    return (f"the layers differ in having {what}: caches[{i}] {'has' if a is not None else 'has not'}, "
                            f"caches[0] {'has' if b is not None else 'has not'}")
                if a is None:
                    continue
                for what, got, want in (("dtype", a.dtype, b.dtype), ("strides", a.stride(), b.stride())):
                    if got != want:
                        return (f"the layers differ in the {what} of {attr}: caches[{i}].{attr} has {got}, "
                                f"caches[0].{attr} {want}")
        return None

    def _can_fold_once(self) -> bool:
        """True where every layer runs its commit, flush and materialize compiled and this build has the
        layered ops and the table builder of the group's family."""
        fold = self._fold
        if not all(ops.has_kernel(op) for op in fold.layer_ops) or not hasattr(_extension._C, fold.table_builder):
            return False
        return all(cache._compiled[cache._family_ops[kind]] for cache in self.caches
                   for kind in ("commit", "flush", "materialize"))

    def _can_launch_once(self) -> bool:
        """True where every cache runs its own slot ops compiled and this build has the table ops."""
        if not all(ops.has_kernel(op) for op in ("fill_slots_table", "copy_slots_table")):
            return False
        if not hasattr(_extension._C, "slot_table"):
            return False
        for cache in self.caches:
            needed = ["reset", "copy_slots"] + (["stagger_cursors"] if self._staggered(cache) else [])
            if not all(cache._compiled[op] for op in needed):
                return False
        return True

    @staticmethod
    def _staggered(cache) -> bool:
        """reset() of this cache also staggers its cursors (cache._stagger)."""
        return cache.staggered_flush and cache.flush_period > 1

    def _table_entries(self):
        """Every cache tensor of every layer with its reset fill: 1.0 for fp8 scales, slot % flush_period
        for the cursors of a staggered cache, 0 for everything else."""
        tensors, values, periods = [], [], []
        for cache in self.caches:
            for t in cache._slot_tensors:
                tensors.append(t)
                values.append(1.0 if t is cache.read_scale else 0.0)
                periods.append(cache.flush_period if t is cache.num_committed and self._staggered(cache) else 0)
        return tensors, values, periods

    def reset(self, slots=None):
        """Every layer's reset(slots): zero the checkpoint, read copy, buffers and cursor of the slots (all
        when None), fp8 scales to 1, and with staggered_flush start slot s's cursor at s % flush_period."""
        _checks.slots_type("reset", slots)
        if self.one_launch:
            ops.KERNELS["fill_slots_table"](self._tensors, self._table, self._fill_values, self._fill_periods, slots,
                                            self.pad_slot_id)
            return
        for cache in self.caches:
            cache.reset(slots)

    def copy_slots(self, src_slots, dst_slots):
        """Every layer's copy_slots(src_slots, dst_slots): slot src_slots[i] -> dst_slots[i] (fork), a
        gather; pairs naming pad_slot_id or an out-of-range slot are skipped."""
        _checks.slots_type("copy_slots", src_slots, "src_slots")
        _checks.slots_type("copy_slots", dst_slots, "dst_slots")
        if self.one_launch and not (isinstance(src_slots, torch.Tensor)
                                    and src_slots.shape[0] > ops.MAX_COPY_SLOTS_PAIRS):
            ops.KERNELS["copy_slots_table"](self._tensors, self._table, src_slots, dst_slots, self.pad_slot_id)
            return
        for cache in self.caches:
            cache.copy_slots(src_slots, dst_slots)

    # ---- the fold ops: one launch each for a group of one family with a layer table; load: the loop ------

    def commit(self, num_accepted, slots=None):
        """Every layer's commit(num_accepted, slots): one num_accepted (batch,) for all layers (an engine
        accepts the same tokens in every layer of a sequence); device tensors, no host sync."""
        _checks.slots_type("commit", slots)
        if not self.one_launch_fold:
            for cache in self.caches:
                cache.commit(num_accepted, slots)
            return
        self._commit_op(self._layer_table, *self._layer_lists, num_accepted, self.caches[0].max_draft_tokens,
                        *self._flags, slots, self.pad_slot_id)
        for cache in self.caches:   # validate=True on a layer: check() it after the call, as its commit() does
            cache._check_if_validating()

    def flush(self, slots=None):
        """Every layer's flush(slots): fold all committed tokens of the slots (all when None)."""
        _checks.slots_type("flush", slots)
        if not self.one_launch_fold:
            for cache in self.caches:
                cache.flush(slots)
            return
        self._flush_op(self._layer_table, *self._layer_lists, *self._flags, slots, self.pad_slot_id)

    def materialize(self, slots=None, out=None):
        """Every layer's materialize(slots): for a group of one family with a layer table one (layers,
        batch, *state shape) tensor (Mamba-2 (H, P, N), GDN (HV, V, K); in the caches' aux dtype, fp32;
        `out` if given), states[i] layer i's state at each row's committed position; for any other group
        a list of the layers' states. The caches are unchanged."""
        _checks.slots_type("materialize", slots)
        if self._fold is None:
            if out is not None:
                raise ValueError("LayerCaches.materialize: `out` is for a group of Mamba-2 or GDN layers of one "
                                 f"shape (one state shape); this group returns a list ({self.fold_loop_reason}), "
                                 "got out")
            return [cache.materialize(slots) for cache in self.caches]
        first = self.caches[0]
        if out is None:
            batch = self.num_slots if slots is None else slots.shape[0]
            out = torch.empty(len(self.caches), batch, *first.checkpoint.shape[1:], dtype=first.aux_dtype,
                              device=self.device)
        if not self.one_launch_fold:
            ops.expect("LayerCaches.materialize", "out", out, shape=(len(self.caches), None, *first.checkpoint.shape[1:]),
                       dtypes=(first.aux_dtype,), device=self.device)
            for i, cache in enumerate(self.caches):
                cache.materialize(slots, out=out[i])
            return out
        self._materialize_op(self._layer_table, *self._layer_lists, out, *self._flags, slots, self.pad_slot_id)
        return out

    def load(self, states, slots=None):
        """Every layer's load(states[i], slots): states a (layers, batch, *state shape) tensor (what
        materialize returns) or a list of the layers' states."""
        _checks.slots_type("load", slots)
        if isinstance(states, (list, tuple)):
            if len(states) != len(self.caches):
                raise ValueError(f"LayerCaches.load: `states` must hold one state tensor per layer "
                                 f"({len(self.caches)}), got {len(states)}")
            for cache, state in zip(self.caches, states):
                cache.load(state, slots)
            return
        if not isinstance(states, torch.Tensor) or states.dim() < 1 or states.shape[0] != len(self.caches):
            got = tuple(states.shape) if isinstance(states, torch.Tensor) else type(states).__name__
            raise ValueError(f"LayerCaches.load: `states` must be a (layers = {len(self.caches)}, batch, ...) tensor "
                             f"or a list of one state per layer, got {got}")
        # The per-layer loads, also on the compiled path (see the module docstring).
        for i, cache in enumerate(self.caches):
            cache.load(states[i], slots)

    def __len__(self) -> int:
        return len(self.caches)

    def __repr__(self) -> str:
        families = sorted({cache.family for cache in self.caches})
        return (f"LayerCaches({len(self.caches)} layers ({', '.join(families)}), num_slots={self.num_slots}, "
                f"device={self.device}, one_launch={self.one_launch}, one_launch_fold={self.one_launch_fold})")
