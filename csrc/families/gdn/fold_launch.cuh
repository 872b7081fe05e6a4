// Host side of the Gated DeltaNet fold (commit, flush, materialize): the ring's stages, the persistent
// grid's size, and the dtype dispatch of one (K, V) shape (instantiations/fold_k<K>_v<V>.cu).
#pragma once

#include "families/gdn/fold_kernel.cuh"
#include "families/gdn/spec_variants.h"

namespace replayssm {
namespace gdn {

// The ring's stages: as many tiles (at most FoldLayout::kMaxStages) as leave two CTAs per SM (228 KB
// per SM, 1 KB reserved per CTA); one stage where even that does not fit (a long buffer at K = V = 128
// with an fp32 checkpoint: then one CTA per SM, up to the opt-in limit). 0: nothing fits.
template <int kK, int kV, DType kCkpt>
int fold_stages(int L, int max_smem) {
  using Layout = FoldLayout<kK, kV, kCkpt>;
  const size_t per_cta = 228 * 1024 / kFoldCtasPerSm - 1024 - Layout::kStaticBytes;
  int stages = Layout::kMaxStages;
  while (stages > 1 && Layout::bytes(stages, L) > per_cta) --stages;
  return Layout::bytes(stages, L) + Layout::kStaticBytes <= static_cast<size_t>(max_smem) ? stages : 0;
}

template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct>
cudaError_t launch_fold_kernel(const GdnParams& p, cudaStream_t stream) {
  auto kernel = fold_kernel<kK, kV, kCkpt, kCopy, kRead, kAct>;
  using Layout = FoldLayout<kK, kV, kCkpt>;
  int device = 0, sms = 0, max_smem = 0, ctas_per_sm = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  const int stages = fold_stages<kK, kV, kCkpt>(p.cache.buffer_len, max_smem);
  if (stages < 1) return cudaErrorInvalidValue;
  const size_t smem = Layout::bytes(stages, p.cache.buffer_len);
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kThreads, smem);
  if (err != cudaSuccess) return err;
  // One wave of persistent CTAs, never more than there are (row, v-head) items.
  const int64_t items = static_cast<int64_t>(p.batch) * p.v_heads;
  const int64_t wave = static_cast<int64_t>(sms) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  kernel<<<static_cast<unsigned>(items < wave ? items : wave), kThreads, smem, stream>>>(p, stages);
  return cudaGetLastError();
}

// Every (checkpoint, read copy) pair of the variants table for one (K, V) and activation dtype (a 16-bit
// checkpoint with activations of its own type only).
template <int kK, int kV, DType kAct>
cudaError_t dispatch_fold_state(const GdnParams& p, cudaStream_t stream) {
  const bool copy = p.cache.read_copy != nullptr;
  const DType ck = p.cache.checkpoint_dtype, rc = p.cache.read_copy_dtype;
#define REPLAYSSM_GDN_FOLD_CASE(CKPT, COPY, READ)                                            \
  if constexpr (DType::CKPT == DType::kFloat32 || DType::CKPT == kAct) {                     \
    if (ck == DType::CKPT && copy == COPY && (!COPY || rc == DType::READ))                   \
      return launch_fold_kernel<kK, kV, DType::CKPT, COPY, DType::READ, kAct>(p, stream);    \
  }
  REPLAYSSM_GDN_CHECKPOINT_READ_COPY(REPLAYSSM_GDN_FOLD_CASE)
#undef REPLAYSSM_GDN_FOLD_CASE
  return cudaErrorInvalidValue;
}

// All dtype combinations of one (K, V); instantiated once per shape file.
template <int kK, int kV>
cudaError_t launch_fold_shape(const GdnParams& p, cudaStream_t stream) {
  if (p.act_dtype == DType::kBFloat16) return dispatch_fold_state<kK, kV, DType::kBFloat16>(p, stream);
  if (p.act_dtype == DType::kFloat16) return dispatch_fold_state<kK, kV, DType::kFloat16>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace gdn
}  // namespace replayssm
