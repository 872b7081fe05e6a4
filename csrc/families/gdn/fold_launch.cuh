// Host side of the Gated DeltaNet fold (commit, flush, materialize): the launch its plan
// (launch/gdn_policy.h) chooses, and the dtype dispatch of one (K, V) shape
// (instantiations/fold_k<K>_v<V>.cu). `layers` null: one layer, p's tensors (fold_kernel); else every
// layer of a layer table in one launch (fold_layers_kernel, one grid row per layer).
#pragma once

#include <type_traits>

#include "common/device_info.h"
#include "families/gdn/fold_kernel.cuh"
#include "families/gdn/variants.h"
#include "launch/gdn_policy.h"

namespace replayssm {
namespace gdn {

template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kVectorGate>
cudaError_t launch_fold_kernel(const GdnParams& p, const LayerTableArgs* layers, cudaStream_t stream) {
  auto kernel = layers == nullptr
                    ? reinterpret_cast<const void*>(fold_kernel<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate>)
                    : reinterpret_cast<const void*>(fold_layers_kernel<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate>);
  using Layout = FoldLayout<kK, kV, kCkpt, kVectorGate>;
  static_assert(Layout::kMaxStages <= launch::kMaxRingStages, "the plan's ring table holds the compiled depth");
  // The API refuses a buffer longer than gdn_fold_max_buffer_len (params.h): one ring stage must fit
  // the 227 KB a CTA may opt in to on sm_90 and sm_100 at that length and, where it is below
  // kGdnMaxBufferLen, not at one entry more (else the limit would refuse buffers the kernel takes).
  constexpr int kMaxL = gdn_fold_max_buffer_len(kVectorGate ? GdnGate::kVector : GdnGate::kScalar, kK, kV, kCkpt);
  constexpr size_t kOptinBytes = 227 * 1024;
  static_assert(Layout::bytes(1, kMaxL) + Layout::kStaticBytes <= kOptinBytes &&
                    (kMaxL == kGdnMaxBufferLen || Layout::bytes(1, kMaxL + 1) + Layout::kStaticBytes > kOptinBytes),
                "gdn_fold_max_buffer_len is the longest buffer one ring stage of the fold fits");
  launch::DeviceInfo device;
  cudaError_t err = current_device_info(&device);
  if (err != cudaSuccess) return err;
  launch::RingBytes ring;
  ring.compiled_stages = Layout::kMaxStages;
  ring.compiled_ctas_per_sm = kFoldCtasPerSm;
  for (int s = 1; s <= Layout::kMaxStages; ++s) ring.dynamic_bytes[s] = Layout::bytes(s, p.cache.buffer_len);
  ring.static_bytes = Layout::kStaticBytes;
  const int stages = launch::plan_gdn_fold_stages(ring, device);
  if (stages < 1) return cudaErrorInvalidValue;
  const size_t smem = ring.dynamic_bytes[stages];
  int ctas_per_sm = 0;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kFoldThreads, smem);
  if (err != cudaSuccess) return err;
  const int num_layers = layers == nullptr ? 1 : layers->num_layers;
  const launch::GdnFoldPlan plan = launch::plan_gdn_fold(
      launch::GdnFoldProblem{p.batch, p.v_heads, num_layers}, stages, ctas_per_sm, device);
  if (layers == nullptr) {
    fold_kernel<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate>
        <<<static_cast<unsigned>(plan.grid), kFoldThreads, smem, stream>>>(p, plan.ring_stages);
  } else {
    const dim3 grid(static_cast<unsigned>(plan.grid), static_cast<unsigned>(num_layers));
    fold_layers_kernel<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate>
        <<<grid, kFoldThreads, smem, stream>>>(p, plan.ring_stages, *layers);
  }
  return cudaGetLastError();
}

// Every (checkpoint, read copy) pair and activation dtype of the variants table (variants.h) for one
// (K, V), GDN's scalar gate and KDA's vector gate (params.gate); instantiated once per shape file (instantiations/fold_k<K>_v<V>.cu, written by
// tools/generate_instantiations.py).
template <int kK, int kV>
cudaError_t launch_fold_shape(const GdnParams& p, const LayerTableArgs* layers, cudaStream_t stream) {
  auto run = [&](auto vector_gate) {
    return REPLAYSSM_GDN_ACTIVATION_SWITCH(p.act_dtype, [&](auto act) {
      return REPLAYSSM_GDN_REPLAY_PAIR_SWITCH(p.cache.checkpoint_dtype, p.cache.read_copy != nullptr,
                                              p.cache.read_copy_dtype, [&](auto ckpt, auto copy, auto read) {
        return launch_fold_kernel<kK, kV, decltype(ckpt)::value, decltype(copy)::value, decltype(read)::value,
                                  decltype(act)::value, decltype(vector_gate)::value>(p, layers, stream);
      });
    });
  };
  return p.gate == GdnGate::kVector ? run(std::true_type{}) : run(std::false_type{});
}

}  // namespace gdn
}  // namespace replayssm
