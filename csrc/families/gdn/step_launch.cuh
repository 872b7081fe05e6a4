// Host side of the GDN step: the launch its plan (launch/gdn_policy.h) chooses, and the dtype dispatch
// of one (K, V) shape (instantiations/step_k<K>_v<V>.cu).
#pragma once

#include "common/device_info.h"
#include "families/gdn/step_kernel.cuh"
#include "families/gdn/variants.h"
#include "launch/gdn_policy.h"

namespace replayssm {
namespace gdn {

template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct>
cudaError_t launch_step(const GdnParams& p, cudaStream_t stream) {
  using Traits = StepTraits<kK, kV, kCkpt, kCopy, kRead, kAct>;
  static_assert(Traits::kMaxStages <= launch::kMaxRingStages, "the plan's ring table holds the compiled depth");
  auto kernel = step_kernel<kK, kV, kCkpt, kCopy, kRead, kAct>;
  launch::DeviceInfo device;
  cudaError_t err = current_device_info(&device);
  if (err != cudaSuccess) return err;
  const launch::GdnStepPlan plan =
      launch::plan_gdn_step(launch::GdnStepProblem{p.batch, p.v_heads, p.staggered_flush}, Traits::kMinCtasPerSm, device,
                            launch::launch_overrides());
  const int L = p.cache.buffer_len;
  const int k_heads = step_k_heads(plan.heads_per_cta, p.v_heads / p.heads);
  launch::RingBytes ring;
  ring.compiled_stages = Traits::kMaxStages;
  ring.compiled_ctas_per_sm = Traits::kMinCtasPerSm;
  for (int s = 1; s <= Traits::kMaxStages; ++s) {
    ring.dynamic_bytes[s] = StepLayout<kK>::bytes(s, Traits::kStageBytes, Traits::FoldHead::workspace_bytes(L),
                                                  plan.heads_per_cta, k_heads, L);
  }
  ring.static_bytes = sizeof(StepShared<kV, Traits::kSlices>);
  const int stages = launch::plan_gdn_step_stages(ring, device);
  if (stages < 1) return cudaErrorInvalidValue;
  const size_t smem = ring.dynamic_bytes[stages];
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y));
  kernel<<<grid, kStepThreads, smem, stream>>>(p, plan.heads_per_cta, stages);
  return cudaGetLastError();
}

// Every (checkpoint, read copy) pair and activation dtype of the variants table for one (K, V);
// instantiated once per shape file (instantiations/step_k<K>_v<V>.cu, written by
// tools/generate_instantiations.py).
template <int kK, int kV>
cudaError_t launch_step_shape(const GdnParams& p, cudaStream_t stream) {
  return REPLAYSSM_GDN_ACTIVATION_SWITCH(p.act_dtype, [&](auto act) {
    return REPLAYSSM_GDN_REPLAY_PAIR_SWITCH(p.cache.checkpoint_dtype, p.cache.read_copy != nullptr,
                                            p.cache.read_copy_dtype, [&](auto ckpt, auto copy, auto read) {
      return launch_step<kK, kV, decltype(ckpt)::value, decltype(copy)::value, decltype(read)::value,
                         decltype(act)::value>(p, stream);
    });
  });
}

}  // namespace gdn
}  // namespace replayssm
