// Host side of the Mamba-2 step: the launch its plan (launch/mamba2_policy.h) chooses, and the dtype
// dispatch of one (P, N) shape, instantiated once per shape (instantiations/step_p<P>_n<N>.cu).
#pragma once

#include "common/device_info.h"
#include "common/programmatic_launch.cuh"
#include "families/mamba2/step_kernel.cuh"
#include "families/mamba2/variants.h"
#include "launch/mamba2_policy.h"
#include "launch/pdl.h"

namespace replayssm {
namespace mamba2 {

// Plans the launch with the occupancy of the plain kernel and launches the kernel the plan names: the
// plain step, its two-group form (a read copy on tensor cores) or the order pass and the ordered step
// (a read copy, or kTf32Replay: the tensor-core replay of an fp32 checkpoint without a copy, the only
// kernel of that pair: a CUDA-core form lost at every batch, docs/EXPERIMENTS.md).
template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kRound, bool kTf32Replay>
cudaError_t launch_step_kernel(const Mamba2Params& p, cudaStream_t stream) {
  constexpr DType kSrc = kCopy ? kRead : kCkpt;
  using Layout = StepLayout<kP, kN, kSrc, kAct, kTf32Replay>;
  auto kernel = step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound, false, kTf32Replay>;
  const size_t smem = Layout::bytes(p.buffer_len);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  int ctas_per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kThreads, smem);
  if (err != cudaSuccess) return err;
  if (ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
  launch::DeviceInfo device;
  err = current_device_info(&device);
  if (err != cudaSuccess) return err;

  launch::Mamba2StepProblem problem;
  problem.batch = p.batch;
  problem.heads = p.heads;
  problem.groups = p.groups;
  problem.buffer_len = p.buffer_len;
  problem.staggered_flush = p.staggered_flush;
  problem.order_workspace = p.row_order != nullptr;
  problem.fp32_checkpoint = kCkpt == DType::kFloat32;
  problem.read_copy = !kCopy ? launch::ReadCopyKind::kNone
                             : (kRead == DType::kFloat8E4M3 ? launch::ReadCopyKind::kFp8 : launch::ReadCopyKind::k16Bit);
  problem.tensor_replay = Layout::kTensorReplay;
  const launch::LaunchOverrides& overrides = launch::launch_overrides();
  const launch::Mamba2StepPlan plan = launch::plan_mamba2_step(problem, ctas_per_sm, device, overrides);
  // With PDL (pdl.wait) the order pass and the step both take the attribute: the pass waits for the kernel
  // ahead of it, the step for the pass (and through it for that kernel), and where pdl.trigger each lets
  // the next start early. Without it the step still takes the attribute behind its order pass
  // (step_starts_during_order_pass), an edge between our two kernels that lets nothing after the step
  // start early.
  const launch::ProgrammaticLaunch pdl = launch::programmatic_step_launch(overrides, p.batch * p.heads, device.sm_count);
  // L2 warmed before the wait where a CTA's row is its grid row (an ordered launch's rows come from the
  // order pass, the kernel ahead): not in the ordered kernel.
  Mamba2StepLaunch args{plan.heads_per_cta, plan.fold_split, plan.fold_split_rows, pdl.wait, pdl.trigger, false,
                        pdl.warm_l2 && plan.kernel != launch::StepKernel::kOrdered};
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y));

  switch (plan.kernel) {
    case launch::StepKernel::kPlain:
      return launch_grid(kernel, grid, dim3(kThreads), smem, stream, pdl.wait, p, args);
    case launch::StepKernel::kTwoGroups:
      if constexpr (kCopy && Layout::kTensorReplay) {
        auto two_group_kernel = step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound, false, kTf32Replay, true>;
        err = cudaFuncSetAttribute(two_group_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        if (err != cudaSuccess) return err;
        return launch_grid(two_group_kernel, grid, dim3(kThreads), smem, stream, pdl.wait, p, args);
      }
      break;
    case launch::StepKernel::kOrdered: {
      auto ordered_kernel = step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound, true, kTf32Replay>;
      err = cudaFuncSetAttribute(ordered_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess) return err;
      args.after_order_pass = launch::step_starts_during_order_pass(overrides);
      err = launch_step_row_order(p, args, stream);
      if (err != cudaSuccess) return err;
      return launch_grid(ordered_kernel, grid, dim3(kThreads), smem, stream, pdl.wait || args.after_order_pass, p, args);
    }
  }
  return cudaErrorInvalidConfiguration;  // a plan for a kernel form these dtypes do not compile
}

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct>
cudaError_t launch_step(const Mamba2Params& p, cudaStream_t stream) {
  constexpr bool kTf32Replay = kCkpt == DType::kFloat32 && !kCopy;
  if constexpr (kCkpt != DType::kFloat32) {
    if (p.rounding_seed != nullptr) {
      return launch_step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, true, kTf32Replay>(p, stream);
    }
  }
  return launch_step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, false, kTf32Replay>(p, stream);
}

// Every (checkpoint, read copy) pair and activation dtype of the variants table for one (P, N), the
// ordered and two-group kernels with them; defined here, instantiated once per shape file
// (instantiations/step_p<P>_n<N>.cu, written by tools/generate_instantiations.py).
template <int kP, int kN>
cudaError_t launch_step_shape(const Mamba2Params& p, cudaStream_t stream) {
  return REPLAYSSM_MAMBA2_ACTIVATION_SWITCH(p.act_dtype, [&](auto act) {
    return REPLAYSSM_MAMBA2_REPLAY_PAIR_SWITCH(p.checkpoint_dtype, p.read_copy != nullptr, p.read_copy_dtype,
                                               [&](auto ckpt, auto copy, auto read) {
      return launch_step<kP, kN, decltype(ckpt)::value, decltype(copy)::value, decltype(read)::value,
                         decltype(act)::value>(p, stream);
    });
  });
}

}  // namespace mamba2
}  // namespace replayssm
