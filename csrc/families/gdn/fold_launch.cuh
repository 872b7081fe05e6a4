// Host side of the Gated DeltaNet fold (commit, flush, materialize): the ring's stages, the persistent
// grid's size, and the dtype dispatch of one (K, V) shape (instantiations/fold_k<K>_v<V>.cu).
#pragma once

#include "families/gdn/fold_kernel.cuh"
#include "families/gdn/variants.h"

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
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kFoldThreads, smem);
  if (err != cudaSuccess) return err;
  // One wave of persistent CTAs, never more than there are (row, v-head) items.
  const int64_t items = static_cast<int64_t>(p.batch) * p.v_heads;
  const int64_t wave = static_cast<int64_t>(sms) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  kernel<<<static_cast<unsigned>(items < wave ? items : wave), kFoldThreads, smem, stream>>>(p, stages);
  return cudaGetLastError();
}

// Every (checkpoint, read copy) pair and activation dtype of the variants table (variants.h) for one
// (K, V); instantiated once per shape file.
template <int kK, int kV>
cudaError_t launch_fold_shape(const GdnParams& p, cudaStream_t stream) {
  const GdnCache& c = p.cache;
  return with_cache(c.checkpoint_dtype, c.read_copy != nullptr, c.read_copy_dtype, cudaErrorInvalidValue,
                    [&](auto ck, auto copy, auto rc) {
                      return with_activation(p.act_dtype, cudaErrorInvalidValue, [&](auto act) {
                        return launch_fold_kernel<kK, kV, decltype(ck)::value, decltype(copy)::value,
                                                  decltype(rc)::value, decltype(act)::value>(p, stream);
                      });
                    });
}

}  // namespace gdn
}  // namespace replayssm
