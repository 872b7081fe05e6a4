// Host side of the Mamba-2 fold (commit, flush, materialize): the launch its plan
// (launch/mamba2_policy.h) chooses, and the dtype dispatch of one (P, N) shape
// (instantiations/fold_p<P>_n<N>.cu). `layers` null: one layer, p's tensors (fold_kernel); else every
// layer of a layer table in one launch (fold_layers_kernel, one grid row per layer).
#pragma once

#include "common/device_info.h"
#include "families/mamba2/fold_kernel.cuh"
#include "families/mamba2/variants.h"
#include "launch/mamba2_policy.h"

namespace replayssm {
namespace mamba2_spec {

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kRound>
cudaError_t launch_fold_kernel(const Mamba2SpecParams& p, const LayerTableArgs* layers, cudaStream_t stream) {
  auto kernel = layers == nullptr ? reinterpret_cast<const void*>(fold_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound>)
                                  : reinterpret_cast<const void*>(fold_layers_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound>);
  using Layout = FoldLayout<kP, kN, kCkpt, kAct>;
  static_assert(Layout::kStages >= 2 && Layout::kStages <= launch::kMaxRingStages, "the plan takes 2 or the compiled depth");
  launch::DeviceInfo device;
  cudaError_t err = current_device_info(&device);
  if (err != cudaSuccess) return err;
  launch::RingBytes ring;
  ring.compiled_stages = Layout::kStages;
  ring.compiled_ctas_per_sm = Layout::kCtasPerSm;
  for (int s = 1; s <= Layout::kStages; ++s) ring.dynamic_bytes[s] = Layout::bytes_with(s, p.buffer_len);
  ring.static_bytes = sizeof(FoldRows);
  const int stages = launch::plan_mamba2_fold_stages(ring, device);
  if (stages < 1) return cudaErrorInvalidValue;
  const size_t smem = ring.dynamic_bytes[stages];
  int ctas_per_sm = 0;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kThreads, smem);
  if (err != cudaSuccess) return err;
  const int num_layers = layers == nullptr ? 1 : layers->num_layers;
  const launch::Mamba2FoldPlan plan = launch::plan_mamba2_fold(
      launch::Mamba2FoldProblem{p.batch, p.heads, num_layers}, stages, ctas_per_sm, device);
  const Mamba2FoldLaunch fold_launch{plan.ring_stages};
  if (layers == nullptr) {
    fold_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound>
        <<<static_cast<unsigned>(plan.grid), kThreads, smem, stream>>>(p, fold_launch);
  } else {
    const dim3 grid(static_cast<unsigned>(plan.grid), static_cast<unsigned>(num_layers));
    fold_layers_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound><<<grid, kThreads, smem, stream>>>(p, fold_launch, *layers);
  }
  return cudaGetLastError();
}

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct>
cudaError_t launch_fold(const Mamba2SpecParams& p, const LayerTableArgs* layers, cudaStream_t stream) {
  if constexpr (kCkpt != DType::kFloat32) {
    if (p.rounding_seed != nullptr) return launch_fold_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, true>(p, layers, stream);
  }
  return launch_fold_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, false>(p, layers, stream);
}

// Every (checkpoint, read copy) pair and activation dtype of the variants table for one (P, N);
// instantiated once per shape file (instantiations/fold_p<P>_n<N>.cu, written by
// tools/generate_instantiations.py).
template <int kP, int kN>
cudaError_t launch_fold_shape(const Mamba2SpecParams& p, const LayerTableArgs* layers, cudaStream_t stream) {
  return REPLAYSSM_MAMBA2_ACTIVATION_SWITCH(p.act_dtype, [&](auto act) {
    return REPLAYSSM_MAMBA2_REPLAY_PAIR_SWITCH(p.checkpoint_dtype, p.read_copy != nullptr, p.read_copy_dtype,
                                               [&](auto ckpt, auto copy, auto read) {
      return launch_fold<kP, kN, decltype(ckpt)::value, decltype(copy)::value, decltype(read)::value,
                         decltype(act)::value>(p, layers, stream);
    });
  });
}

}  // namespace mamba2_spec
}  // namespace replayssm
