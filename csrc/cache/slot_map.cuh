// Rows -> slots, the rule every op of every family keeps: row r of a call uses slot slots[r] (int32
// or int64), or slot r without a slot tensor; a row whose slot is the pad id or outside [0, num_slots)
// touches no cache memory and gets zero output.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace replayssm {

// A slot index from an int32 or int64 index tensor (element stride `stride`).
__device__ __forceinline__ int64_t load_index(const void* base, DType dtype, int64_t i, int64_t stride) {
  return dtype == DType::kInt32 ? static_cast<int64_t>(__ldg(static_cast<const int32_t*>(base) + i * stride))
                                : static_cast<int64_t>(__ldg(static_cast<const int64_t*>(base) + i * stride));
}

// The slot id batch row `row` names, as given (slot r without a slot tensor).
template <class Params, class Row>
__device__ __forceinline__ int64_t named_slot(const Params& p, Row row) {
  return p.slots == nullptr ? static_cast<int64_t>(row) : load_index(p.slots, p.slots_dtype, row, p.slots_stride);
}

// Whether a named slot id is a misuse: neither the pad id nor in [0, num_slots).
template <class Params>
__device__ __forceinline__ bool slot_out_of_range(const Params& p, int64_t slot) {
  return slot != p.pad_slot_id && (slot < 0 || slot >= p.num_slots);
}

// Slot of batch row `row`, or -1 when the row touches nothing (pad id or out of range). Params: any
// params struct with slots, slots_dtype, slots_stride, pad_slot_id and num_slots.
template <class Params, class Row>
__device__ __forceinline__ int64_t resolve_slot(const Params& p, Row row) {
  const int64_t slot = named_slot(p, row);
  return (slot == p.pad_slot_id || slot < 0 || slot >= p.num_slots) ? -1 : slot;
}

// resolve_slot's answer read through L2 only (ld.global.cg: nothing kept in the SM's L1), for a CTA that
// has not yet waited for the kernel ahead (programmatic dependent launch): that kernel may still write
// the slots, so the answer only says what to ask L2 for, and nothing is decided by it. An L1 line
// filled before the wait could serve the real read after it a stale value; L2 is coherent.
template <class Params, class Row>
__device__ __forceinline__ int64_t peek_slot(const Params& p, Row row) {
  int64_t slot = static_cast<int64_t>(row);
  if (p.slots != nullptr) {
    slot = p.slots_dtype == DType::kInt32
               ? static_cast<int64_t>(__ldcg(static_cast<const int32_t*>(p.slots) + row * p.slots_stride))
               : static_cast<int64_t>(__ldcg(static_cast<const long long*>(p.slots) + row * p.slots_stride));
  }
  return (slot == p.pad_slot_id || slot < 0 || slot >= p.num_slots) ? -1 : slot;
}

}  // namespace replayssm
