// Cache slot management on the device, without host synchronisation (CUDA-graph safe): copy, fill and
// load per-slot byte ranges of the cache tensors of one layer, given device slot lists.
// Host-safe header: the API layer fills the params and calls the launchers.
//
// A cache tensor is slot-major: slot s owns the `bytes_per_slot` contiguous bytes at
// base + s * slot_stride (the slot stride is arbitrary, so strided pools work; inside a slot the
// tensor must be contiguous, which the API layer checks). Slot ids equal to pad_slot_id or outside
// [0, num_slots) are skipped: nothing is read or written for them.
//
//   copy_slots  pair i: every tensor's slot src[i] -> slot dst[i]. Gather semantics: every source is
//               read before any destination is written, in ONE launch: each CTA owns one byte range of
//               one tensor for ALL pairs, stages the sources of that range in shared memory, waits at
//               a barrier, then writes the destinations. Byte ranges of different CTAs are disjoint, so
//               no CTA can overwrite what another still has to read. Cost: the staging holds
//               num_pairs * chunk bytes, hence at most kCopySlotsMaxPairs pairs. A slot named twice
//               in dst gets one of its sources (unspecified which), as with torch index assignment.
//   fill_slots  entry i: every tensor's slot dst[i] (slot i when dst is null) is overwritten with the
//               tensor's 4-byte `fill` pattern (0 for state and buffers, 1.0f for fp8 scales), or, for
//               a tensor with `fill_slot_period` > 0 (one int32 per slot: the cursors of a staggered
//               flush), with dst[i] % fill_slot_period.
//   load_states row r: states[r] (fp32 or the checkpoint dtype) -> checkpoint slot slots[r] (slot r when
//               slots is null), converted as torch's .to() does (round-to-nearest-even; fp16 overflows
//               to inf); num_committed[slot] = 0. Read copies are regenerated afterwards by the caller
//               with launch_make_read_copy (read_copy.cuh).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/dtype.h"

namespace replayssm {

constexpr int kSlotOpsMaxTensors = 16;
// Staging of copy_slots: num_pairs * chunk bytes of shared memory, chunk >= 16 bytes, 48 KB at most.
constexpr int64_t kCopySlotsStagingBytes = 48 * 1024;
constexpr int64_t kCopySlotsMaxPairs = kCopySlotsStagingBytes / 16;

struct SlotTensor {
  void* base;              // slot 0
  int64_t slot_stride;     // bytes from one slot to the next (any value: strided pools)
  int64_t bytes_per_slot;  // contiguous bytes one slot owns
  uint32_t fill;           // fill_slots: 4-byte pattern (non-zero needs 4-byte aligned slots)
  uint32_t fill_slot_period;  // fill_slots: > 0 writes slot % period instead (a 4-byte slot only)
};

struct SlotOpsParams {
  SlotTensor tensors[kSlotOpsMaxTensors];
  int32_t num_tensors;
  int64_t num_slots;
  // copy_slots: src and dst, num_entries pairs. fill_slots: dst only; dst == nullptr means every
  // slot (num_entries == num_slots).
  const void* src;
  DType src_dtype;  // kInt32 / kInt64
  int64_t src_stride;
  const void* dst;
  DType dst_dtype;
  int64_t dst_stride;
  int64_t num_entries;
  int64_t pad_slot_id;
};

struct LoadStatesParams {
  const void* states;  // (batch, elems_per_slot) in effect: each row contiguous
  DType states_dtype;  // kFloat32 or checkpoint_dtype
  int64_t states_row_stride;  // elements
  void* checkpoint;
  DType checkpoint_dtype;     // kFloat32 / kBFloat16 / kFloat16
  int64_t ck_slot_stride;     // elements
  int64_t elems_per_slot;
  int32_t* num_committed;
  int64_t nc_stride;
  const void* slots;  // nullptr: row r uses slot r
  DType slots_dtype;
  int64_t slots_stride;
  int64_t pad_slot_id;
  int64_t num_slots;
  int64_t batch;
};

cudaError_t launch_copy_slots(const SlotOpsParams& params, cudaStream_t stream);
cudaError_t launch_fill_slots(const SlotOpsParams& params, cudaStream_t stream);
cudaError_t launch_load_states(const LoadStatesParams& params, cudaStream_t stream);

}  // namespace replayssm
