// The rows a fold op (commit, flush, materialize) folds, the same rule in every family, and the
// compaction of a chunk of rows into the list of those that fold, which a persistent fold grid walks.
//
// Commit: the cursor w moves past the accepted entries: num_accepted clamped to [0, num_verified[slot]]
// (the entries the slot's last verify appended, so no entry that verify did not write is ever
// accepted; accepted_entries) and to [0, L - w]; the row folds (all n = w + accepted entries) when the
// next verify of max_draft_tokens would not fit (n + max_draft_tokens > L, the flush-early rule). Flush: a row folds its w entries when w > 0.
// Materialize: every row (n = w). A cursor outside [0, L] folds nothing (materialize: a zero state).
// The fold kernel reads the cursors as they were; the cursor kernel (fold_cursor.h) writes the new
// ones after it, with the same rule.
#pragma once

#include <cstdint>

#include "cache/slot_map.cuh"

namespace replayssm {

// Fold modes, the values of every family's fold-mode enum (Mamba2FoldMode, GdnFoldMode).
constexpr int32_t kFoldCommit = 0;
constexpr int32_t kFoldFlush = 1;
constexpr int32_t kFoldMaterialize = 2;

// The entries commit accepts for `row` whose slot's last verify appended `verified` entries: its
// num_accepted clamped to [0, verified]. The one place a commit reads num_accepted: the fold kernels
// of every family and the cursor kernel (fold_cursor.cu) agree on it. Params: any params struct with
// num_accepted, num_accepted_dtype and num_accepted_stride.
template <class Params>
__device__ __forceinline__ int64_t accepted_entries(const Params& p, int64_t row, int verified) {
  const int64_t accepted = load_index(p.num_accepted, p.num_accepted_dtype, row, p.num_accepted_stride);
  const int64_t most = verified > 0 ? verified : 0;
  return accepted < 0 ? 0 : (accepted > most ? most : accepted);
}

// The cursor after commit accepts `accepted` entries at cursor w (0 <= w <= L).
__host__ __device__ __forceinline__ int cursor_after_accept(int w, int64_t accepted, int L) {
  const int64_t moved = accepted < 0 ? 0 : (accepted > L - w ? L - w : accepted);
  return w + static_cast<int>(moved);
}

// Entries a fold op folds for a row whose slot has cursor w, or -1 when the row folds nothing.
// accepted: the row's accepted_entries (commit only).
__device__ __forceinline__ int fold_entries(int32_t mode, int w, int64_t accepted, int L, int max_draft_tokens) {
  if (w < 0 || w > L) return -1;
  if (mode == kFoldCommit) {
    const int n = cursor_after_accept(w, accepted, L);
    return n + max_draft_tokens > L ? n : -1;
  }
  if (mode == kFoldFlush) return w > 0 ? w : -1;
  return w;
}

// The folding rows of one chunk of kThreads batch rows, in row order. Slots fit in int32 (a pool of
// 2^31 slots of at least 64 x 64 fp32 elements is far beyond any GPU); entry counts (<= 64) in int8.
template <int kThreads>
struct FoldRowList {
  int32_t slot[kThreads];  // -1: no state to fold (materialize writes a zero state)
  int32_t row[kThreads];
  int8_t n[kThreads];      // entries to fold
  int32_t warp_counts[kThreads / 32];
};

// Every thread of the CTA calls it for rows chunk .. chunk + kThreads - 1 (its own row: chunk + tid):
// `probe(row, &slot, &n)` says whether the row is an item of the op (then slot and n are stored; slot
// -1 for a zero state). Returns the number of items, listed in row order. Begins with a CTA barrier (the
// previous chunk's readers of the list are done) and ends with one (the list is complete).
template <int kThreads, class Probe>
__device__ __forceinline__ int collect_fold_rows(FoldRowList<kThreads>& list, int64_t chunk, Probe probe) {
  const int tid = static_cast<int>(threadIdx.x);
  int64_t slot = -1;
  int n = -1;
  const bool item = probe(chunk + tid, slot, n);
  const unsigned ballot = __ballot_sync(0xffffffffu, item);
  __syncthreads();
  if ((tid & 31) == 0) list.warp_counts[tid / 32] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << (tid & 31)) - 1u));
  int count = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < tid / 32) before += list.warp_counts[w];
    count += list.warp_counts[w];
  }
  if (item) {
    list.slot[before] = static_cast<int32_t>(slot);
    list.row[before] = static_cast<int32_t>(chunk + tid);
    list.n[before] = static_cast<int8_t>(n);
  }
  __syncthreads();
  return count;
}

}  // namespace replayssm
