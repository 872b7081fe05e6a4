// Read-copy generation: checkpoint (fp32/bf16/fp16) -> read copy (bf16/fp16/fp8-e4m3 + fp32 scales).
// Host-safe header: the API layer fills ReadCopyParams and calls the launcher.
//
// Per (slot, head, row), with x = the row of `cols` checkpoint values in fp32:
//   bf16: rne(x)                 fp16: rne(clamp(x, +-65504))
//   fp8 : amax = max|x|; inv = 448 / amax, scale = amax / 448 (both 1 when amax == 0, IEEE division);
//         q = e4m3_rne(clamp(x * inv, +-448)); read_scale = scale
// Bitwise equal to replayssm_cuda.reference.make_read_copy.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/dtype.h"

namespace replayssm {

// Largest row length the kernel handles: one warp, kChunk (8) elements per lane.
constexpr int64_t kReadCopyMaxCols = 256;

struct ReadCopyParams {
  // (num_slots, heads, rows, cols), last dim contiguous; read only.
  const void* checkpoint;
  // (num_slots, heads, rows, cols), last dim contiguous; written for every selected slot.
  void* read_copy;
  // (num_slots, heads, rows) fp32; written when read_copy_dtype == kFloat8E4M3, else nullptr.
  float* read_scale;
  // (num_entries,) int32/int64 slot indices, or nullptr: entry i is slot i for i < num_slots.
  // Entries equal to pad_slot_id or outside [0, num_slots) are skipped (nothing read or written).
  const void* slots;

  DType checkpoint_dtype;  // kFloat32 / kBFloat16 / kFloat16
  DType read_copy_dtype;   // kBFloat16 / kFloat16 / kFloat8E4M3
  DType slots_dtype;       // kInt32 / kInt64; ignored when slots == nullptr

  int64_t num_slots;
  int64_t heads;
  int64_t rows;
  int64_t cols;         // 1 .. kReadCopyMaxCols
  int64_t num_entries;  // slots length, or num_slots when slots == nullptr
  int64_t pad_slot_id;

  // Strides in elements (64-bit: slot pools may exceed 2^31 elements and need not be contiguous).
  int64_t checkpoint_slot_stride, checkpoint_head_stride, checkpoint_row_stride;
  int64_t read_copy_slot_stride, read_copy_head_stride, read_copy_row_stride;
  int64_t read_scale_slot_stride, read_scale_head_stride, read_scale_row_stride;
  int64_t slots_stride;
};

// Launches on `stream`; returns cudaErrorInvalidValue for params outside the contract above (the API
// layer validates first, so that is a programming error), else the launch status.
cudaError_t launch_make_read_copy(const ReadCopyParams& params, cudaStream_t stream);

}  // namespace replayssm
