// Host side of the Mamba-2 step: the launch (CTA sizes, the order pass, the two-group kernel) and the
// dtype dispatch of one (P, N) shape, instantiated once per shape (instantiations/step_p<P>_n<N>.cu).
#pragma once

#include "families/mamba2/launch_rules.h"
#include "families/mamba2/step_kernel.cuh"

namespace replayssm {
namespace mamba2 {

// kOrdered = false: sizes the launch and runs the step, or hands it to the ordered step (below).
// kOrdered = true: p.heads_per_cta is already chosen; runs the order pass, then the ordered step.
// kTf32Replay: the tensor-core replay of an fp32 checkpoint without a copy (the only kernel of that
// pair: a CUDA-core form lost at every batch, docs/EXPERIMENTS.md).
template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kRound, bool kOrdered,
          bool kTf32Replay>
cudaError_t launch_step_kernel(const Mamba2Params& params, cudaStream_t stream) {
  constexpr DType kSrc = kCopy ? kRead : kCkpt;
  using Layout = StepLayout<kP, kN, kSrc, kAct, kTf32Replay>;
  auto kernel = step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound, kOrdered, kTf32Replay>;
  const size_t smem = Layout::bytes(params.buffer_len);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  if constexpr (kOrdered) {
    err = launch_step_row_order(params, stream);
    if (err != cudaSuccess) return err;
    const int helper_rows = params.fold_split > 1 ? params.fold_split_rows * (params.fold_split - 1) : 0;
    kernel<<<dim3(params.heads / params.heads_per_cta, params.batch + helper_rows), kThreads, smem, stream>>>(params);
    return cudaGetLastError();
  } else {
    int ctas_per_sm = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kThreads, smem);
    if (err != cudaSuccess) return err;
    if (ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
    Mamba2Params p = params;
    // Waves of CTAs: where the replay runs on tensor cores (bf16 / fp16 / fp8 copies) its per-CTA set-up
    // is the larger part of a CTA at batch 32-128, and two waves of larger CTAs beat four of smaller ones
    // (session 13, runs 3-4: fp8 step at batch 128 65.0 -> 57.2 us nano4b, 79.0 -> 66.7 us super120b; bf16
    // step at batch 64 48.5 -> 44.1 / 53.6 -> 49.2 us). But when only a few slots fold in a step
    // (staggered flush), the step lasts as long as its folding CTAs, which larger CTAs make longer (bf16
    // copy, batch 64: staggered mean step 76.5 -> 86.8 us nano4b): there, and for the CUDA-core kernels
    // (no-copy step mixed at two waves: super120b batch 128 147.7 -> 151.6 us), four. Without the hint,
    // a batch whose whole-group CTAs fill every SM in one wave takes them in every kernel (batch 32 at 8
    // groups; session 21), and a smaller one the smallest part of a group whose CTAs still all fit in that
    // one wave (batch 4-16 at 8 groups; session 23): see choose_heads_per_cta. Past one wave, the CUDA-core
    // kernels at two CTAs an SM take the largest part of a group whose CTAs fill their last wave
    // (full_waves; session 26: nano4b's no-copy step at batch 64 80.5 -> 74.9 us), and the tf32 replay
    // down to half-size CTAs where the `waves` rule's leave more than 5% of their waves' slots empty
    // (fill_last_wave; session 38: nano4b batch 80 89.9 -> 86.5 us). With a bf16 / fp16 copy, half-size
    // CTAs where whole groups would make fewer than four waves (half_below_four_waves; session 39: the
    // bf16 cycle at batch 112 -2.2% nano4b, -3.6% super120b).
    const int waves = Layout::kTensorReplay && !p.staggered_flush ? 2 : 4;
    // (Measured with a bf16 copy of an fp32 checkpoint; the fp16 copy, of fp16 activations, is the same
    // kernel form and takes it unmeasured.)
    constexpr bool kCopy16 = kCopy && Layout::kTensorReplay && kRead != DType::kFloat8E4M3 && kCkpt == DType::kFloat32;
    p.heads_per_cta = choose_heads_per_cta(p.batch, p.heads, p.groups, ctas_per_sm, "REPLAYSSM_STEP_HEADS_PER_CTA", waves,
                                           /*one_wave=*/!p.staggered_flush,
                                           /*full_waves=*/!Layout::kTensorReplay && !p.staggered_flush,
                                           /*fill_last_wave=*/kTf32Replay && !p.staggered_flush,
                                           /*half_below_four_waves=*/kCopy16 && !p.staggered_flush);
    // Two whole groups a CTA (a read copy on tensor cores, without the hint; by rule only an fp8 copy,
    // past one wave of whole groups, in one wave or in waves they fill to 95%: choose_two_group_ctas),
    // in their own kernel of the same layout.
    if constexpr (kCopy && Layout::kTensorReplay) {
      if (!p.staggered_flush &&
          choose_two_group_ctas(p.batch, p.groups, ctas_per_sm, /*by_rule=*/kRead == DType::kFloat8E4M3)) {
        auto two_group_kernel = step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound, false, kTf32Replay, true>;
        err = cudaFuncSetAttribute(two_group_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        if (err != cudaSuccess) return err;
        p.heads_per_cta = 2 * (p.heads / p.groups);
        two_group_kernel<<<dim3(p.groups / 2, p.batch), kThreads, smem, stream>>>(p);
        return cudaGetLastError();
      }
    }
    const dim3 grid(p.heads / p.heads_per_cta, p.batch);
    // Staggered flush with a read copy: the folding rows first (mamba2_step_order.cu), where a fold costs
    // 4-8 replay steps. Only with more than one wave of CTAs (in one, every CTA starts at once) and more
    // than one head per CTA (one-head folding CTAs are short; the pass's launch cost more than it won:
    // nano4b batch 32, 1 head per CTA, fp8 copy, staggered mean step 47.6 -> 51.7 us in session 14's run
    // 1). Without a copy a fold costs ~2 replay steps, and the CUDA-core kernels go without the pass
    // (staggered cycles within 0-7% of lock-step ones); the tensor-core replay of the fp32 checkpoint
    // (kTf32Replay) takes it as the copies do (session 27). REPLAYSSM_STEP_ORDER=0 turns the pass (and so
    // the fold split) off (step_order_pass).
    if constexpr (kCopy || kTf32Replay) {
      const bool order = p.staggered_flush && p.row_order != nullptr && step_order_pass();
      // The fold split (choose_fold_split): where whole-group CTAs of every row fit in one wave and the
      // hint's launch above would make 3 or more, the first folding rows in smaller CTAs than the
      // replaying ones, all of them in one wave.
      if (order) {
        const FoldSplit split = choose_fold_split(p.batch, p.heads, p.groups, p.buffer_len, ctas_per_sm, p.heads_per_cta);
        if (split.split > 1) {
          p.heads_per_cta = split.heads_per_cta;
          p.fold_split = split.split;
          p.fold_split_rows = split.rows;
          return launch_step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound, true, kTf32Replay>(p, stream);
        }
      }
      // Without a copy a fold is shorter, and the pass paid only from 3 heads per CTA: at 2 (nano4b batch
      // 24-32) the staggered mean step was 7-8% slower with it, at 3 even, at 4 and more 5-11% faster
      // (session 27, runs 7-8, scripts/staggered_launch_sweep.py "auto nosplit noorder").
      constexpr int kMinOrderedHeads = kCopy ? 2 : 3;
      if (order && p.heads_per_cta >= kMinOrderedHeads &&
          static_cast<int64_t>(grid.x) * grid.y > static_cast<int64_t>(ctas_per_sm) * multiprocessor_count()) {
        return launch_step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound, true, kTf32Replay>(p, stream);
      }
    }
    kernel<<<grid, kThreads, smem, stream>>>(p);
    return cudaGetLastError();
  }
}

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct>
cudaError_t launch_step(const Mamba2Params& p, cudaStream_t stream) {
  constexpr bool kTf32Replay = kCkpt == DType::kFloat32 && !kCopy;
  if constexpr (kCkpt != DType::kFloat32) {
    if (p.rounding_seed != nullptr) {
      return launch_step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, true, false, kTf32Replay>(p, stream);
    }
  }
  return launch_step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, false, false, kTf32Replay>(p, stream);
}

template <int kP, int kN, DType kAct>
cudaError_t dispatch_state(const Mamba2Params& p, cudaStream_t stream) {
  const bool copy = p.read_copy != nullptr;
  const DType ck = p.checkpoint_dtype, rc = p.read_copy_dtype;
#define REPLAYSSM_STEP_CASE(CKPT, COPY, READ)                              \
  if (ck == DType::CKPT && copy == COPY && (!COPY || rc == DType::READ)) \
    return launch_step<kP, kN, DType::CKPT, COPY, DType::READ, kAct>(p, stream);
  REPLAYSSM_STEP_CASE(kFloat32, false, kFloat32)
  REPLAYSSM_STEP_CASE(kFloat32, true, kBFloat16)
  REPLAYSSM_STEP_CASE(kFloat32, true, kFloat16)
  REPLAYSSM_STEP_CASE(kFloat32, true, kFloat8E4M3)
  REPLAYSSM_STEP_CASE(kBFloat16, false, kBFloat16)
  REPLAYSSM_STEP_CASE(kBFloat16, true, kFloat8E4M3)
  REPLAYSSM_STEP_CASE(kFloat16, false, kFloat16)
  REPLAYSSM_STEP_CASE(kFloat16, true, kFloat8E4M3)
#undef REPLAYSSM_STEP_CASE
  return cudaErrorInvalidValue;
}

// All dtype combinations of one (P, N), the ordered step's kernels with them; defined here,
// instantiated once per shape file (mamba2_step_p<P>_n<N>.cu).
template <int kP, int kN>
cudaError_t launch_step_shape(const Mamba2Params& p, cudaStream_t stream) {
  if (p.act_dtype == DType::kBFloat16) return dispatch_state<kP, kN, DType::kBFloat16>(p, stream);
  if (p.act_dtype == DType::kFloat16) return dispatch_state<kP, kN, DType::kFloat16>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace mamba2
}  // namespace replayssm
