// The step's order pass, for every family (staggered flush): a one-CTA launch before the step that
// lists the batch rows whose slot folds in this step first, then the others (each part in batch
// order), and resolves every row's slot on the way.
//
// Why: a folding CTA takes several times as long as a replaying one (it reads and writes the
// checkpoint and writes the read copy; the replay reads one tile). The step's CTAs start in grid order,
// row after row, so when a few slots fold in each step (staggered flush, continuous batching) the
// folding rows are spread through the batch, some start in the last wave, and the step lasts until
// they are done, long after the replaying CTAs. Started first, the folds overlap the replay instead.
//
// The step cannot order itself: the last CTA of a slot rewrites the slot's cursor once the slot's
// CTAs have read it, while CTAs of later rows may not have started, so only a launch before it sees
// every cursor as the step begins. Each family's launch plan says where the pass runs.
//
// Output (order, int32[2 batch]): position y < batch holds a batch row (with `fine_mark` set on the
// first `fine_rows` folding rows, for a family whose first folds take smaller CTAs, else 0), position
// batch + y that row's slot (-1: the row touches nothing).
#pragma once

#include <cstdint>

#include "cache/cursor.cuh"
#include "cache/slot_map.cuh"
#include "common/programmatic_launch.cuh"

namespace replayssm {

constexpr int kRowOrderThreads = 1024;
constexpr int kRowOrderMaxBatch = 65535;  // the steps' grid.y limit, checked by their dispatchers

// What the pass needs besides the rows' slots (resolve_slot's params).
struct RowOrderArgs {
  const int32_t* num_committed;  // the cursors, read as the step will read them
  int32_t* order;                // int32[2 batch], written
  int32_t batch;
  int32_t buffer_len;
  int32_t max_draft_tokens;  // folds_after_append's rule (cache/cursor.cuh)
  int32_t fine_rows;         // the first fine_rows folding rows get fine_mark
  int32_t fine_mark;
  // (experiment) order[2 batch + y]: the cursor of the slot at y (its low bits, as the step reads it; -1
  // where the row touches nothing), so the step's CTAs need not read it: order is then int32[3 batch].
  bool write_cursors;
  bool pdl_wait;     // launched with programmatic dependent launch: the cursors are read after the kernel ahead
  bool pdl_trigger;  // and the kernel after the pass may start early (launch/pdl.h)
  // The step after the pass is launched with PDL (launch/pdl.h, step_starts_during_order_pass): let it
  // launch at once; its CTAs wait for this pass to complete before they read the order.
  bool release_step;
};

namespace row_order_detail {

constexpr int kWarps = kRowOrderThreads / 32;

// Exclusive prefix over the CTA of a per-thread flag, in thread order; also the CTA's total.
__device__ __forceinline__ int cta_exclusive_prefix(bool flag, int* warp_counts, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u));
  total = 0;
  for (int i = 0; i < kWarps; ++i) {
    const int c = warp_counts[i];
    if (i < warp) before += c;
    total += c;
  }
  __syncthreads();  // warp_counts is reused by the next call
  return before;
}

}  // namespace row_order_detail

// SlotParams: any params struct resolve_slot takes (cache/slot_map.cuh).
template <class SlotParams>
__global__ void __launch_bounds__(kRowOrderThreads) row_order_kernel(const SlotParams p, const RowOrderArgs a) {
  // One bit per batch row: folds in this step. A warp's 32 consecutive rows are one ballot, one word.
  __shared__ uint32_t folds[(kRowOrderMaxBatch + 31) / 32];
  __shared__ int warp_counts[row_order_detail::kWarps];
  int32_t* const order_rows = a.order;
  int32_t* const order_slots = a.order + a.batch;
  // With PDL the slots and cursors are read only once the kernel ahead has ended; the step after this
  // pass waits for it in turn.
  wait_for_prior_grids(a.pdl_wait);
  if ((a.pdl_trigger || a.release_step) && threadIdx.x == 0) launch_dependent_grids();

  // Pass 1: which rows fold (slot and cursor), and how many.
  int num_folds = 0;
  for (int start = 0; start < a.batch; start += kRowOrderThreads) {
    const int row = start + static_cast<int>(threadIdx.x);
    bool f = false;
    if (row < a.batch) {
      const int64_t slot = resolve_slot(p, row);
      if (slot >= 0) {
        const int w = a.num_committed[slot] & kCursorMask;
        f = w < a.buffer_len && folds_after_append(w, a.max_draft_tokens, a.buffer_len);
      }
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, f);
    if ((threadIdx.x & 31) == 0) folds[row / 32] = ballot;
    num_folds += __syncthreads_count(f);
  }

  // Pass 2: place the rows, folds from 0, the others from num_folds, each part in batch order.
  int next_fold = 0, next_other = num_folds;
  for (int start = 0; start < a.batch; start += kRowOrderThreads) {
    const int row = start + static_cast<int>(threadIdx.x);
    const bool valid = row < a.batch;
    const bool f = valid && ((folds[row / 32] >> (row & 31)) & 1u);
    int chunk_folds = 0;
    const int fold_rank = row_order_detail::cta_exclusive_prefix(f, warp_counts, chunk_folds);
    // The valid rows of a chunk are its first threads, so the rows before this one that do not fold
    // are the threads before it less the folding ones: one prefix serves both parts.
    const int other_rank = static_cast<int>(threadIdx.x) - fold_rank;
    const int chunk_rows = a.batch - start < kRowOrderThreads ? a.batch - start : kRowOrderThreads;
    if (valid) {
      // The slot is resolved again rather than kept from pass 1: a chunk's threads hold no state across
      // chunks, and resolving is one L2-hot load.
      const int dst = f ? next_fold + fold_rank : next_other + other_rank;
      order_rows[dst] = row | (f && dst < a.fine_rows ? a.fine_mark : 0);
      const int64_t slot = resolve_slot(p, row);
      order_slots[dst] = static_cast<int32_t>(slot);
      if (a.write_cursors) order_slots[a.batch + dst] = slot >= 0 ? (a.num_committed[slot] & kCursorMask) : -1;
    }
    next_fold += chunk_folds;
    next_other += chunk_rows - chunk_folds;
  }
}

// The pass's launch (one CTA): cudaErrorInvalidValue where the batch or the slots do not fit its int32
// bookkeeping.
template <class SlotParams>
cudaError_t launch_row_order(const SlotParams& p, const RowOrderArgs& a, int64_t num_slots, cudaStream_t stream) {
  if (a.order == nullptr || a.batch > kRowOrderMaxBatch || num_slots > INT32_MAX) return cudaErrorInvalidValue;
  return launch_grid(row_order_kernel<SlotParams>, dim3(1), dim3(kRowOrderThreads), 0, stream, a.pdl_wait, p, a);
}

}  // namespace replayssm
