// ReplaySSM Mamba-2 step (T=1), one launch per decode step. One CTA of 256 threads per (batch row,
// group, block of the group's heads); it takes its heads one after the other.
//
// Let w = num_committed[slot] buffered tokens precede the current one (entry w), Lambda_j =
// A * sum_{i<=j} dt_i and wgt_j = dt_j exp(Lambda_w - Lambda_j).
//   replay step (the buffer still has room after this token):
//     y = e^{Lambda_w} (S_read C) + sum_{j<=w} wgt_j (B_j . C) x_j + D x;   append x, B, dt at entry w
//     reads the read copy (or the checkpoint) once; writes nothing of the state.
//   fold step (w + 1 + max_draft_tokens > L; the same for all heads of a CTA, they share the slot):
//     S = e^{Lambda_w} S_c + sum_{j<=w} (wgt_j x_j) (outer) B_j;  y = S C + D x;  write S and its read copy
//     reads the checkpoint once and writes it once, like the conventional update, plus the copy.
//
// Latency and instruction count, not arithmetic, decide the replay step: it streams half the bytes
// of the conventional update or less, so whatever a CTA does besides loading state shows. Hence:
//   - a ring of S source tiles (read copy or checkpoint, S = 2..8, ~64 KB) filled by bulk copies
//     (TMA) on one mbarrier per stage, the first S issued before the cursor is known, a stage refilled
//     as soon as its head is done with it: loads never wait for the cursor;
//   - what only depends on the group is done once per CTA (B_j . C by lane groups splitting the
//     entries), and every operand of a head is requested one or two heads ahead of its use.
// The CTA's phases, over one traits type (StepTraits, step_layout.cuh):
//   prologue (step_cta.cuh)          barriers; the CTA's row, slot and heads; the first tiles, the first
//                                    x window and the window dots' loads before the cursor; the cursor
//   tensor-core replay               fp8 copies, 16-bit copies of the activations' type and the fp32
//     (step_tensor_replay.cuh)       checkpoint in tf32 pairs: warp-specialised, no CTA barrier per head
//   CUDA-core replay                 a 16-bit source of the other 16-bit type than the activations
//     (step_core_replay.cuh)
//   fold (step_fold.cuh)             the arithmetic of fold.cuh, shared with the fold kernel
//   cursor ticket (StepCta::take_ticket) early in a replaying CTA, at the end of a folding one
// docs/TUNING.md has the launch rules and what they measured; docs/EXPERIMENTS.md what was tried and lost.
//
// With programmatic dependent launch (launch/pdl.h), a CTA initialises its barriers before it waits for
// the kernel ahead of it, and touches global memory only after (common/programmatic_launch.cuh).
//
// The cursor of a slot is shared by the slot's CTAs (H / heads-per-CTA of them), so none may change
// it before all have read it: each CTA adds a ticket (1 << 16) to num_committed[slot] after all its
// threads have read it, and the CTA that draws the last ticket writes the new cursor, which also clears
// the tickets. Nothing crosses launches.
//
// With a staggered flush (the caller's staggered_flush hint) and a read copy, a one-CTA launch before
// the step (step_order.cu) may list the rows whose slot folds first, and CTA row y takes the row it
// lists (kOrdered): folding CTAs last several replay CTAs, and started late they end the step. Where
// all CTAs fit in one wave, the launch plan may instead split the folds (mamba2_fold_split): the pass
// marks the first folding rows, whose CTAs take a part of the replay-sized block each, the other parts
// by helper rows at the top of the grid, so that the few folds of a staggered step run in parallel.
//
// This header holds the kernel template; instantiations/step_p<P>_n<N>.cu instantiate it per shape (so
// the shapes compile in parallel) and step.cu picks the shape at run time.
#pragma once

#include "common/programmatic_launch.cuh"
#include "families/mamba2/step_core_replay.cuh"
#include "families/mamba2/step_fold.cuh"
#include "families/mamba2/step_tensor_replay.cuh"

namespace replayssm {
namespace mamba2 {

// The template arguments are StepTraits' (step_layout.cuh says what each one is for).
template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kRound, bool kOrdered, bool kTf32Replay,
          bool kTwoGroups = false>
__global__ void __launch_bounds__(kThreads, (StepLayout<kP, kN, kCopy ? kRead : kCkpt, kAct, kTf32Replay>::kCtasPerSm))
    step_kernel(const Mamba2Params p, const Mamba2StepLaunch launch) {
  using T = StepTraits<kP, kN, kCkpt, kCopy, kRead, kAct, kRound, kOrdered, kTf32Replay, kTwoGroups>;
  extern __shared__ __align__(128) unsigned char smem_base[];
  StepCta<T> cta(p, smem_base);
  step_init_barriers(cta);
  // Launched with PDL (common/programmatic_launch.cuh), the CTA may have started before the kernel ahead
  // of it ended (the previous step, the order pass, an engine's kernel that wrote the slots or the
  // activations): only the barriers above and the L2 prefetches of warm_l2 come before the wait, every
  // other global access after it.
  if constexpr (!T::kOrdered) {
    if (launch.warm_l2 && threadIdx.x < 32) step_warm_l2<T>(p, launch);
  }
  wait_for_prior_grids(launch.pdl_wait || launch.after_order_pass);
  if (threadIdx.x == 0) {
    if (launch.pdl_trigger) launch_dependent_grids();
    REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineStart);
  }
  if (!step_assign(cta, launch)) return;
  StepEarly<T> early;
  step_issue_early(cta, early);
  if (!step_read_cursor(cta)) return;
  if (!cta.fold) {
    if constexpr (T::kTensorReplay) {
      step_tensor_replay(cta, early);
    } else {
      step_core_replay(cta, early);
    }
    step_append_B(cta);
  } else {
    step_fold(cta);
  }
  if (cta.tid == 0 && cta.fold) {
    REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineConsumerEnd);
    cta.take_ticket();
  }
}

}  // namespace mamba2
}  // namespace replayssm
