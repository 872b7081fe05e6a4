// Host side of Gated DeltaNet verify: the ring's stages, v-heads per CTA, and the dtype dispatch of one
// (K, V) shape (instantiations/verify_k<K>_v<V>.cu).
#pragma once

#include "families/gdn/variants.h"
#include "families/gdn/verify_kernel.cuh"

namespace replayssm {
namespace gdn {

constexpr int kVerifyCtasPerSm = 2;

// V-heads per verify CTA: the most that still leave at least four waves of CTAs (each CTA pays a
// set-up of two DRAM round trips, the slot and then the cursor, which its later v-heads do not; fewer,
// larger CTAs trade that against the last wave's tail), among the divisors of HV. forced >= 1 (the
// launch overrides' verify_heads_per_cta, where the build wires it) takes that many (at most HV; the
// last CTA of a row takes what is left).
inline int verify_heads_per_cta(int64_t batch, int v_heads, int resident_ctas, int forced) {
  if (forced >= 1) return forced < v_heads ? forced : v_heads;
  for (int d = v_heads; d > 1; --d) {
    if (v_heads % d == 0 && batch * (v_heads / d) >= 4 * static_cast<int64_t>(resident_ctas)) return d;
  }
  return 1;
}

// The ring's stages: as many tiles (at most VerifyLayout::kMaxStages) as leave two CTAs per SM; one
// where even that does not fit (long buffers and many drafts at K = V = 128 with an fp32 checkpoint:
// then one CTA per SM, up to the opt-in limit). 0: nothing fits.
template <int kK, int kV, DType kSrc>
int verify_stages(int L, int T, int max_smem) {
  using Layout = VerifyLayout<kK, kV, kSrc>;
  const size_t per_cta = 228 * 1024 / kVerifyCtasPerSm - 1024;
  int stages = Layout::kMaxStages;
  while (stages > 1 && Layout::bytes(stages, L, T) > per_cta) --stages;
  return Layout::bytes(stages, L, T) <= static_cast<size_t>(max_smem) ? stages : 0;
}

template <int kK, int kV, DType kSrc, DType kAct>
cudaError_t launch_verify(const GdnParams& p, cudaStream_t stream, int forced_heads_per_cta) {
  using Layout = VerifyLayout<kK, kV, kSrc>;
  auto kernel = verify_kernel<kK, kV, kSrc, kAct>;
  int device = 0, sms = 0, max_smem = 0, ctas_per_sm = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  const int L = p.cache.buffer_len, T = p.tokens.num_tokens;
  const int stages = verify_stages<kK, kV, kSrc>(L, T, max_smem);
  if (stages < 1) return cudaErrorInvalidValue;
  const size_t smem = Layout::bytes(stages, L, T);
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kFoldThreads, smem);
  if (err != cudaSuccess) return err;
  if (ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
  const int hpc = verify_heads_per_cta(p.batch, p.v_heads, sms * ctas_per_sm, forced_heads_per_cta);
  const dim3 grid(static_cast<unsigned>((p.v_heads + hpc - 1) / hpc), static_cast<unsigned>(p.batch));
  kernel<<<grid, kFoldThreads, smem, stream>>>(p, stages, hpc);
  return cudaGetLastError();
}

// Every source verify reads (the read copy's dtype, or the checkpoint's without one) that the variants
// table's caches give, and every activation dtype, for one (K, V); instantiated once per shape file.
// forced_heads_per_cta: 0 for the rule (verify_heads_per_cta).
template <int kK, int kV>
cudaError_t launch_verify_shape(const GdnParams& p, cudaStream_t stream, int forced_heads_per_cta) {
  const GdnCache& c = p.cache;
  return with_cache(c.checkpoint_dtype, c.read_copy != nullptr, c.read_copy_dtype, cudaErrorInvalidValue,
                    [&](auto ck, auto copy, auto rc) {
                      constexpr DType kSrc = decltype(copy)::value ? decltype(rc)::value : decltype(ck)::value;
                      return with_activation(p.act_dtype, cudaErrorInvalidValue, [&](auto act) {
                        return launch_verify<kK, kV, kSrc, decltype(act)::value>(p, stream, forced_heads_per_cta);
                      });
                    });
}

}  // namespace gdn
}  // namespace replayssm
