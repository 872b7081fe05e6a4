// Host side of Gated DeltaNet verify: the launch its plan (launch/gdn_policy.h) chooses, and the dtype
// dispatch of one (K, V) shape (instantiations/verify_k<K>_v<V>.cu).
#pragma once

#include <type_traits>

#include "common/device_info.h"
#include "families/gdn/variants.h"
#include "families/gdn/verify_kernel.cuh"
#include "launch/gdn_policy.h"

namespace replayssm {
namespace gdn {

// Two CTAs an SM are the target of the ring's depth (the launch bounds').
constexpr int kVerifyCtasPerSm = 2;

template <int kK, int kV, DType kSrc, DType kAct, bool kVectorGate>
cudaError_t launch_verify(const GdnParams& p, cudaStream_t stream) {
  using Layout = VerifyLayout<kK, kV, kSrc, kVectorGate>;
  static_assert(Layout::kMaxStages <= launch::kMaxRingStages, "the plan's ring table holds the compiled depth");
  auto kernel = verify_kernel<kK, kV, kSrc, kAct, kVectorGate>;
  launch::DeviceInfo device;
  cudaError_t err = current_device_info(&device);
  if (err != cudaSuccess) return err;
  const int L = p.cache.buffer_len, T = p.tokens.num_tokens;
  launch::RingBytes ring;
  ring.compiled_stages = Layout::kMaxStages;
  ring.compiled_ctas_per_sm = kVerifyCtasPerSm;
  for (int s = 1; s <= Layout::kMaxStages; ++s) ring.dynamic_bytes[s] = Layout::bytes(s, L, T);
  const int stages = launch::plan_gdn_verify_stages(ring, device);
  if (stages < 1) return cudaErrorInvalidValue;
  const size_t smem = ring.dynamic_bytes[stages];
  int ctas_per_sm = 0;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kFoldThreads, smem);
  if (err != cudaSuccess) return err;
  if (ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
  const launch::GdnVerifyPlan plan = launch::plan_gdn_verify(launch::GdnVerifyProblem{p.batch, p.v_heads}, stages,
                                                             ctas_per_sm, device, launch::launch_overrides());
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y));
  kernel<<<grid, kFoldThreads, smem, stream>>>(p, plan.ring_stages, plan.heads_per_cta);
  return cudaGetLastError();
}

// Every source verify reads (the read copy's dtype, or the checkpoint's without one) that the variants
// table's (checkpoint, read copy) pairs give, and every activation dtype, for one (K, V), GDN's scalar
// gate and KDA's vector gate (params.gate); instantiated
// once per shape file (instantiations/verify_k<K>_v<V>.cu, written by tools/generate_instantiations.py).
template <int kK, int kV>
cudaError_t launch_verify_shape(const GdnParams& p, cudaStream_t stream) {
  auto run = [&](auto vector_gate) {
    return REPLAYSSM_GDN_ACTIVATION_SWITCH(p.act_dtype, [&](auto act) {
      return REPLAYSSM_GDN_REPLAY_PAIR_SWITCH(p.cache.checkpoint_dtype, p.cache.read_copy != nullptr,
                                              p.cache.read_copy_dtype, [&](auto ckpt, auto copy, auto read) {
        constexpr DType kSrc = decltype(copy)::value ? decltype(read)::value : decltype(ckpt)::value;
        return launch_verify<kK, kV, kSrc, decltype(act)::value, decltype(vector_gate)::value>(p, stream);
      });
    });
  };
  return p.gate == GdnGate::kVector ? run(std::true_type{}) : run(std::false_type{});
}

}  // namespace gdn
}  // namespace replayssm
