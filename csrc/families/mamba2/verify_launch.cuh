// Host side of Mamba-2 verify: the launch its plan (launch/mamba2_policy.h) chooses, and the dtype
// dispatch of one (P, N) shape (instantiations/verify_p<P>_n<N>.cu).
#pragma once

#include "common/device_info.h"
#include "families/mamba2/variants.h"
#include "families/mamba2/verify_kernel.cuh"
#include "launch/mamba2_policy.h"

namespace replayssm {
namespace mamba2_spec {

template <int kP, int kN, DType kSrc, DType kAct>
cudaError_t launch_verify(const Mamba2SpecParams& p, cudaStream_t stream) {
  using Layout = VerifyLayout<kP, kN, kSrc, kAct>;
  static_assert(Layout::kStages <= launch::kMaxRingStages, "the plan's ring table holds the compiled depth");
  auto kernel = verify_kernel<kP, kN, kSrc, kAct>;
  launch::DeviceInfo device;
  cudaError_t err = current_device_info(&device);
  if (err != cudaSuccess) return err;
  launch::RingBytes ring;
  ring.compiled_stages = Layout::kStages;
  ring.compiled_ctas_per_sm = Layout::kCtasPerSm;
  for (int s = 1; s <= Layout::kStages; ++s) ring.dynamic_bytes[s] = Layout::bytes(s, p.buffer_len, p.num_tokens);
  const int stages = launch::plan_mamba2_verify_stages(ring, device);
  if (stages < 1) return cudaErrorInvalidValue;
  const size_t smem = ring.dynamic_bytes[stages];
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  int ctas_per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kThreads, smem);
  if (err != cudaSuccess) return err;
  if (ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
  const launch::Mamba2VerifyPlan plan = launch::plan_mamba2_verify(launch::Mamba2VerifyProblem{p.batch, p.heads, p.groups},
                                                                   stages, ctas_per_sm, device, launch::launch_overrides());
  const Mamba2VerifyLaunch args{plan.heads_per_cta, plan.ring_stages};
  kernel<<<dim3(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y)), kThreads, smem, stream>>>(p, args);
  return cudaGetLastError();
}

// Every (checkpoint, read copy) pair and activation dtype of the variants table for one (P, N): the
// kernel reads the copy where there is one, else the checkpoint. Instantiated once per shape file
// (instantiations/verify_p<P>_n<N>.cu, written by tools/generate_instantiations.py).
template <int kP, int kN>
cudaError_t launch_verify_shape(const Mamba2SpecParams& p, cudaStream_t stream) {
  return REPLAYSSM_MAMBA2_ACTIVATION_SWITCH(p.act_dtype, [&](auto act) {
    return REPLAYSSM_MAMBA2_REPLAY_PAIR_SWITCH(p.checkpoint_dtype, p.read_copy != nullptr, p.read_copy_dtype,
                                               [&](auto ckpt, auto copy, auto read) {
      constexpr DType kSrc = decltype(copy)::value ? decltype(read)::value : decltype(ckpt)::value;
      return launch_verify<kP, kN, kSrc, decltype(act)::value>(p, stream);
    });
  });
}

}  // namespace mamba2_spec
}  // namespace replayssm
