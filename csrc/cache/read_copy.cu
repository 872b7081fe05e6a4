// Read-copy generation kernel. Memory-bound: every checkpoint byte is read once, every read-copy byte
// written once. A row of `cols` elements is handled by a group of `threads_per_row` lanes (a power of
// two, 8 elements each), so one warp covers 32 / threads_per_row rows; the fp8 row max is a shuffle
// reduction inside the group.
#include "cache/read_copy.cuh"

#include <climits>

#include "cache/slot_map.cuh"
#include "cache/variants.h"
#include "common/convert.cuh"

namespace replayssm {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kWarpsPerBlock = kThreadsPerBlock / 32;

template <DType kCheckpoint, DType kReadCopy>
struct ReadCopyTraits {
  using In = typename Storage<kCheckpoint>::type;
  using Out = typename Storage<kReadCopy>::type;
  static constexpr bool kFp8 = kReadCopy == DType::kFloat8E4M3;
  static_assert(kCheckpoint == DType::kFloat32 || kCheckpoint == DType::kBFloat16 || kCheckpoint == DType::kFloat16,
                "checkpoint must be fp32, bf16 or fp16");
  static_assert(kReadCopy == DType::kBFloat16 || kReadCopy == DType::kFloat16 || kFp8,
                "read copy must be bf16, fp16 or fp8-e4m3");
  static_assert(kChunk * sizeof(In) % 16 == 0, "a chunk of checkpoint elements must be whole 16-byte vectors");
  static_assert(kChunk * kReadCopyMaxCols / kChunk <= 32 * kChunk, "a row must fit in one warp");
};

template <DType kCheckpoint, DType kReadCopy>
__global__ void __launch_bounds__(kThreadsPerBlock)
make_read_copy_kernel(const ReadCopyParams p, int threads_per_row_log2) {
  using Traits = ReadCopyTraits<kCheckpoint, kReadCopy>;
  using In = typename Traits::In;
  using Out = typename Traits::Out;

  const int lane = threadIdx.x & 31;
  const int threads_per_row = 1 << threads_per_row_log2;
  const int rows_per_warp = 32 >> threads_per_row_log2;
  const int col0 = (lane & (threads_per_row - 1)) * kChunk;
  const int cols = static_cast<int>(p.cols);

  const int64_t rows_per_entry = p.heads * p.rows;
  const int64_t total_rows = p.num_entries * rows_per_entry;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t warp_stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock * rows_per_warp;

  // `first` is warp-uniform, so every lane runs the same iterations and reaches the shuffles.
  for (int64_t first = warp * rows_per_warp; first < total_rows; first += warp_stride) {
    const int64_t row = first + (lane >> threads_per_row_log2);
    bool active = false;
    const In* src = nullptr;
    Out* dst = nullptr;
    int64_t slot = 0, head = 0, r = 0;
    if (row < total_rows) {
      const int64_t entry = row / rows_per_entry;
      const int64_t rest = row - entry * rows_per_entry;
      head = rest / p.rows;
      r = rest - head * p.rows;
      slot = p.slots == nullptr ? entry : load_index(p.slots, p.slots_dtype, entry, p.slots_stride);
      active = slot != p.pad_slot_id && slot >= 0 && slot < p.num_slots;
      if (active) {
        src = static_cast<const In*>(p.checkpoint) + slot * p.checkpoint_slot_stride +
              head * p.checkpoint_head_stride + r * p.checkpoint_row_stride;
        dst = static_cast<Out*>(p.read_copy) + slot * p.read_copy_slot_stride + head * p.read_copy_head_stride +
              r * p.read_copy_row_stride;
      }
    }

    float v[kChunk];
    if (active && col0 < cols) {
      load_chunk(src, col0, cols, v);
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = 0.0f;
    }

    if constexpr (Traits::kFp8) {
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) amax = max_keep_nan(amax, fabsf(v[i]));
      amax = group_max_keep_nan(amax, threads_per_row);
      const float inv = fp8_inverse_scale(amax);
      const float scale = fp8_scale(amax);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = fp8_scaled(v[i], inv);
      if (active && col0 == 0) {
        p.read_scale[slot * p.read_scale_slot_stride + head * p.read_scale_head_stride +
                     r * p.read_scale_row_stride] = scale;
      }
    }

    if (active && col0 < cols) store_chunk(dst, col0, cols, v);
  }
}

template <DType kCheckpoint, DType kReadCopy>
cudaError_t launch(const ReadCopyParams& p, cudaStream_t stream) {
  const int64_t chunks_per_row = (p.cols + kChunk - 1) / kChunk;
  int log2 = 0;
  while ((int64_t{1} << log2) < chunks_per_row) ++log2;
  const int64_t rows_per_block = static_cast<int64_t>(kWarpsPerBlock) * (32 >> log2);
  const int64_t total_rows = p.num_entries * p.heads * p.rows;
  // One pass over the rows when the grid allows; the kernel's grid-stride loop covers the rest.
  const int64_t blocks = (total_rows + rows_per_block - 1) / rows_per_block;
  const unsigned grid = static_cast<unsigned>(blocks < INT_MAX ? blocks : INT_MAX);
  make_read_copy_kernel<kCheckpoint, kReadCopy><<<grid, kThreadsPerBlock, 0, stream>>>(p, log2);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_make_read_copy(const ReadCopyParams& p, cudaStream_t stream) {
  if (p.cols < 1 || p.cols > kReadCopyMaxCols || p.num_slots < 0 || p.heads < 0 || p.rows < 0 ||
      p.num_entries < 0 || p.checkpoint == nullptr || p.read_copy == nullptr) {
    return cudaErrorInvalidValue;
  }
  if ((p.read_copy_dtype == DType::kFloat8E4M3) != (p.read_scale != nullptr)) return cudaErrorInvalidValue;
  if (p.slots != nullptr && p.slots_dtype != DType::kInt32 && p.slots_dtype != DType::kInt64) {
    return cudaErrorInvalidValue;
  }
  if (p.num_entries == 0 || p.heads == 0 || p.rows == 0) return cudaSuccess;
  return REPLAYSSM_DTYPE_SWITCH(p.checkpoint_dtype, "checkpoint dtype", REPLAYSSM_CACHE_CHECKPOINT_DTYPES,
                                [&](auto ckpt) {
    return REPLAYSSM_DTYPE_SWITCH(p.read_copy_dtype, "read copy dtype", REPLAYSSM_CACHE_READ_COPY_DTYPES,
                                  [&](auto read) {
      return launch<decltype(ckpt)::value, decltype(read)::value>(p, stream);
    });
  });
}

}  // namespace replayssm
