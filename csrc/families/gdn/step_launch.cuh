// Host side of the GDN step: the launch of one (K, V) shape over the dtype variants of the table
// (variants.h), instantiated once per shape (instantiations/step_k<K>_v<V>.cu).
#pragma once

#include "families/gdn/step_kernel.cuh"
#include "families/gdn/variants.h"

namespace replayssm {
namespace gdn {

// One CTA per (row, v-head): the CTAs of a slot are its v-heads, which the cursor tickets count.
// staggered_flush changes nothing here: every CTA is one head, so a folding CTA is already as short
// as it can be.
template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct>
cudaError_t launch_step(const GdnParams& p, cudaStream_t stream) {
  using Traits = StepTraits<kK, kV, kCkpt, kCopy, kRead, kAct>;
  auto kernel = step_kernel<kK, kV, kCkpt, kCopy, kRead, kAct>;
  const size_t smem = Traits::smem_bytes(p.cache.buffer_len);
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<dim3(static_cast<unsigned>(p.v_heads), static_cast<unsigned>(p.batch)), kStepThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <int kK, int kV>
cudaError_t launch_step_shape(const GdnParams& p, cudaStream_t stream) {
  return with_activation(p.act_dtype, cudaErrorInvalidValue, [&](auto A) {
    const GdnCache& c = p.cache;
    return with_cache(c.checkpoint_dtype, c.read_copy != nullptr, c.read_copy_dtype, cudaErrorInvalidValue,
                      [&](auto Ck, auto Copy, auto Read) {
                        return launch_step<kK, kV, decltype(Ck)::value, decltype(Copy)::value, decltype(Read)::value,
                                           decltype(A)::value>(p, stream);
                      });
  });
}

}  // namespace gdn
}  // namespace replayssm
