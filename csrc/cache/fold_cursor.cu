// The cursor kernel of commit and flush (fold_cursor.h).
#include "cache/error_word.cuh"
#include "cache/fold_cursor.h"
#include "cache/fold_rows.cuh"

namespace replayssm {
namespace {

__device__ __forceinline__ void move_cursors(const CursorMoveParams& p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row == 0 && p.rounding_seed != nullptr) p.rounding_seed[1] += 1;
  if (row >= p.batch) return;
  const int64_t named = named_slot(p, row);
  if (p.mode == kFoldCommit && slot_out_of_range(p, named)) {
    record_error(p.error_word, kErrorCommitSlot, row, named, p.num_slots);
  }
  const int64_t slot = resolve_slot(p, row);
  if (slot < 0) return;
  const int L = p.buffer_len;
  const int w = p.num_committed[slot];
  if (p.mode == kFoldFlush) {
    if (w > 0 && w <= L) p.num_committed[slot] = 0;
    return;
  }
  const int verified = p.num_verified[slot];
  const int64_t accepted = accepted_entries(p, row, verified);
  if (p.error_word != nullptr) {
    const int64_t asked = load_index(p.num_accepted, p.num_accepted_dtype, row, p.num_accepted_stride);
    if (asked != accepted) record_error(p.error_word, kErrorCommitAccepted, row, asked, verified > 0 ? verified : 0);
  }
  p.num_verified[slot] = 0;
  if (w < 0 || w > L) return;
  const int n = cursor_after_accept(w, accepted, L);
  p.num_committed[slot] = n + p.max_draft_tokens > L ? 0 : n;
}

__global__ void move_cursors_kernel(const CursorMoveParams p) { move_cursors(p); }

__global__ void move_cursors_layers_kernel(const CursorMoveParams p, const LayerTableArgs layers) {
  const LayerPointers& lp = layer_pointers(layers, static_cast<int>(blockIdx.y));
  CursorMoveParams q = p;
  q.num_committed = lp.num_committed;
  q.num_verified = lp.num_verified;
  q.rounding_seed = lp.rounding_seed;
  q.error_word = p.mode == kFoldCommit ? lp.error_word : nullptr;
  move_cursors(q);
}

}  // namespace

cudaError_t launch_move_cursors(const CursorMoveParams& p, cudaStream_t stream) {
  if (p.num_committed == nullptr || p.batch < 0 || (p.mode != kFoldCommit && p.mode != kFoldFlush) ||
      (p.mode == kFoldCommit && (p.num_accepted == nullptr || p.num_verified == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 && p.rounding_seed == nullptr) return cudaSuccess;
  constexpr int kRowsPerBlock = 256;
  const int64_t rows = p.batch > 0 ? p.batch : 1;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  move_cursors_kernel<<<static_cast<unsigned>(blocks), kRowsPerBlock, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_move_cursors_layers(const CursorMoveParams& p, const LayerTableArgs& layers, cudaStream_t stream) {
  if (p.batch < 0 || (p.mode != kFoldCommit && p.mode != kFoldFlush) ||
      (p.mode == kFoldCommit && p.num_accepted == nullptr) || layers.table == nullptr || layers.num_layers < 1 ||
      layers.num_layers > 65535) {
    return cudaErrorInvalidValue;
  }
  constexpr int kRowsPerBlock = 256;
  const int64_t rows = p.batch > 0 ? p.batch : 1;  // batch 0: one thread per layer advances its seed
  const dim3 grid(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(layers.num_layers));
  move_cursors_layers_kernel<<<grid, kRowsPerBlock, 0, stream>>>(p, layers);
  return cudaGetLastError();
}

}  // namespace replayssm
