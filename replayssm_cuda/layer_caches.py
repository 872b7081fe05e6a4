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

load stays per layer (each cache's load()): states have each layer's own shape and dtype, and a load
converts them and regenerates the read copy, which is not a byte copy that a table kernel can share.
"""

from __future__ import annotations

import torch

from . import _checks, _extension, ops
from .cache import _ReplayCache


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

    def __len__(self) -> int:
        return len(self.caches)

    def __repr__(self) -> str:
        families = sorted({cache.family for cache in self.caches})
        return (f"LayerCaches({len(self.caches)} layers ({', '.join(families)}), num_slots={self.num_slots}, "
                f"device={self.device}, one_launch={self.one_launch})")
