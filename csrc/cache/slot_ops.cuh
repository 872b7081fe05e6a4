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
#include <string>

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

// ---- the model-level form: any number of tensors, in a device table ----------------------------------
//
// An engine resets and forks every SSM layer of a model at once. copy_slots_table / fill_slots_table do
// what copy_slots / fill_slots do, for the tensors of all layers in one launch: the tensors are described
// by a table in device memory, built once (build_slot_table, then one host-to-device copy) and read by
// every launch, so a call passes only the slot lists and stays CUDA-graph capturable. Gather semantics
// hold across all tensors for the same reason as in one layer: a CTA owns one byte range of one tensor
// for every pair, and build_slot_table rejects tensors whose slot byte ranges overlap, so no CTA writes
// bytes another CTA reads.
//
// The table, int64 words:
//   [0] geometry fingerprint: num_slots and every tensor's base, slot stride and bytes per slot
//   [1] fill fingerprint: every tensor's fill and fill_slot_period
//   [2] num_tensors T, [3] num_slots
//   [4, 4 + 4T)  T SlotTensor records (32 bytes each)
//   then, for each chunk size 16 << k (k = 0 .. kSlotTableChunkSizes - 1), T + 1 block offsets: the
//   blocks of tensor i are [first[i], first[i + 1]) when a block moves that many bytes of a slot.
// Each launch compares the fingerprints it was given (computed from the tensors of the call) with the
// table's and traps on a mismatch (a table built for other tensors), like a device-side assert.
constexpr int kSlotTableHeader = 4;
constexpr int kSlotTableChunkSizes = 9;  // 16 B .. 4 KB

struct SlotTableParams {
  const int64_t* table;  // device
  int32_t num_tensors;
  uint64_t geometry_fingerprint;
  uint64_t fill_fingerprint;  // checked by fill_slots_table only
  int64_t num_slots;
  // As in SlotOpsParams.
  const void* src;
  DType src_dtype;
  int64_t src_stride;
  const void* dst;
  DType dst_dtype;
  int64_t dst_stride;
  int64_t num_entries;
  int64_t pad_slot_id;
};

// Host side. The words of a table of `num_tensors` tensors.
int64_t slot_table_len(int64_t num_tensors);
uint64_t slot_geometry_fingerprint(const SlotTensor* tensors, int64_t num_tensors, int64_t num_slots);
uint64_t slot_fill_fingerprint(const SlotTensor* tensors, int64_t num_tensors);
// Writes the table of `tensors` into `out` (host memory, slot_table_len words). Returns an empty string,
// or why the tensors are outside the contract (a non-zero fill needs 4-byte aligned slots, a
// fill_slot_period a 4-byte slot; no two tensors' slot byte ranges may overlap).
std::string build_slot_table(const SlotTensor* tensors, int64_t num_tensors, int64_t num_slots, int64_t* out);

// `tensors` are the host records of the call (the launch sizes its grid from them).
cudaError_t launch_copy_slots_table(const SlotTableParams& params, const SlotTensor* tensors, cudaStream_t stream);
cudaError_t launch_fill_slots_table(const SlotTableParams& params, const SlotTensor* tensors, cudaStream_t stream);

}  // namespace replayssm
