// The step's order pass (staggered flush): a one-CTA launch before the step that lists the batch rows
// whose slot folds in this step first, then the others, and resolves every row's slot on the way.
//
// Why: a folding CTA takes several times as long as a replaying one (it reads and writes the fp32
// checkpoint and writes the read copy; the replay reads the copy only). The step's CTAs start in grid
// order, row after row, so when a few slots fold in each step (staggered flush, continuous batching)
// the folding rows are spread through the batch, some start in the last wave, and the step lasts until
// they are done, long after the replaying CTAs (without the pass, staggered cycles with an fp8 read copy
// 41-70% slower than lock-step ones). Started first, the folds overlap the replay instead.
//
// The step cannot order itself: the last CTA of a slot rewrites the slot's cursor once the slot's
// CTAs have read it, while CTAs of later rows may not have started, so only a launch before it sees
// every cursor as the step begins. The launch plan (plan_mamba2_step, launch/mamba2_policy.cpp) says
// where the pass runs: with a read copy, more than one wave of CTAs and more than one head per CTA, or
// with a fold split (the first folding rows in smaller CTAs than the rest), whose rows the pass marks.
#include "common/programmatic_launch.cuh"
#include "families/mamba2/params.h"
#include "families/mamba2/tile.cuh"

namespace replayssm {
namespace mamba2 {
namespace {

constexpr int kOrderThreads = 1024;
constexpr int kOrderWarps = kOrderThreads / 32;
constexpr int kMaxBatch = 65535;  // the step's grid.y limit, checked by the dispatcher

// Exclusive prefix over the CTA of a per-thread flag, in thread order; also the CTA's total.
__device__ __forceinline__ int cta_exclusive_prefix(bool flag, int* warp_counts, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u));
  total = 0;
  for (int i = 0; i < kOrderWarps; ++i) {
    const int c = warp_counts[i];
    if (i < warp) before += c;
    total += c;
  }
  __syncthreads();  // warp_counts is reused by the next call
  return before;
}

__global__ void __launch_bounds__(kOrderThreads) step_row_order_kernel(const Mamba2Params p, const Mamba2StepLaunch launch) {
  // One bit per batch row: folds in this step. A warp's 32 consecutive rows are one ballot, one word.
  __shared__ uint32_t folds[(kMaxBatch + 31) / 32];
  __shared__ int warp_counts[kOrderWarps];
  int32_t* const order_rows = p.row_order;
  int32_t* const order_slots = p.row_order + p.batch;
  // Launched with PDL (launch.pdl): the slots and cursors are read only once the kernel ahead has ended;
  // the step after this pass waits for it in turn.
  wait_for_prior_grids(launch.pdl);
  if (launch.pdl && threadIdx.x == 0) launch_dependent_grids();

  // Pass 1: which rows fold (slot and cursor), and how many.
  int num_folds = 0;
  for (int start = 0; start < p.batch; start += kOrderThreads) {
    const int row = start + static_cast<int>(threadIdx.x);
    bool f = false;
    if (row < p.batch) {
      const int64_t slot = resolve_slot(p, row);
      if (slot >= 0) {
        const int w = p.num_committed[slot] & kCursorMask;
        f = w < p.buffer_len && step_folds(p, w, p.buffer_len);
      }
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, f);
    if ((threadIdx.x & 31) == 0) folds[row / 32] = ballot;
    num_folds += __syncthreads_count(f);
  }

  // Pass 2: place the rows, folds from 0, the others from num_folds, each part in batch order.
  int next_fold = 0, next_other = num_folds;
  for (int start = 0; start < p.batch; start += kOrderThreads) {
    const int row = start + static_cast<int>(threadIdx.x);
    const bool valid = row < p.batch;
    const bool f = valid && ((folds[row / 32] >> (row & 31)) & 1u);
    int chunk_folds = 0;
    const int fold_rank = cta_exclusive_prefix(f, warp_counts, chunk_folds);
    // The valid rows of a chunk are its first threads, so the rows before this one that do not fold
    // are the threads before it less the folding ones: one prefix serves both parts.
    const int other_rank = static_cast<int>(threadIdx.x) - fold_rank;
    const int chunk_rows = p.batch - start < kOrderThreads ? p.batch - start : kOrderThreads;
    if (valid) {
      // The slot is resolved again rather than kept from pass 1: a chunk's threads hold no state across
      // chunks, and resolving is one L2-hot load.
      const int dst = f ? next_fold + fold_rank : next_other + other_rank;
      // The first launch.fold_split_rows folding rows take the fold split's smaller CTAs (0 without one).
      order_rows[dst] = row | (f && dst < launch.fold_split_rows ? kFineFoldRow : 0);
      order_slots[dst] = static_cast<int32_t>(resolve_slot(p, row));
    }
    next_fold += chunk_folds;
    next_other += chunk_rows - chunk_folds;
  }
}

}  // namespace

cudaError_t launch_step_row_order(const Mamba2Params& p, const Mamba2StepLaunch& launch, cudaStream_t stream) {
  if (p.row_order == nullptr || p.batch > kMaxBatch || p.num_slots > INT32_MAX) return cudaErrorInvalidValue;
  return launch_grid(step_row_order_kernel, dim3(1), dim3(kOrderThreads), 0, stream, launch.pdl, p, launch);
}

}  // namespace mamba2
}  // namespace replayssm
