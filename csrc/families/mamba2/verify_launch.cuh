// Host side of Mamba-2 verify: CTA sizes, the ring's stages, and the dtype dispatch of one (P, N) shape
// (instantiations/verify_p<P>_n<N>.cu).
#pragma once

#include "families/mamba2/launch_rules.h"
#include "families/mamba2/verify_kernel.cuh"

namespace replayssm {
namespace mamba2_spec {

template <int kP, int kN, DType kSrc, DType kAct>
cudaError_t launch_verify(const Mamba2SpecParams& params, cudaStream_t stream) {
  using Layout = VerifyLayout<kP, kN, kSrc, kAct>;
  auto kernel = verify_kernel<kP, kN, kSrc, kAct>;
  int device = 0, max_smem = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  // The compiled ring depth, fewer stages where a long buffer and many drafts need the room: first down
  // to 2 to keep the CTAs per SM the launch bounds assume, then as far as the opt-in limit demands.
  int stages = Layout::kStages;
  const size_t per_cta = 228 * 1024 / Layout::kCtasPerSm - 1024;
  while (stages > 2 && Layout::bytes(stages, params.buffer_len, params.num_tokens) > per_cta) --stages;
  while (stages > 1 && Layout::bytes(stages, params.buffer_len, params.num_tokens) > static_cast<size_t>(max_smem)) --stages;
  const size_t smem = Layout::bytes(stages, params.buffer_len, params.num_tokens);
  if (smem > static_cast<size_t>(max_smem)) return cudaErrorInvalidValue;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  int ctas_per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kThreads, smem);
  if (err != cudaSuccess) return err;
  if (ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
  Mamba2SpecParams p = params;
  p.heads_per_cta = mamba2::choose_heads_per_cta(p.batch, p.heads, p.groups, ctas_per_sm, kHeadsPerCtaKnob);
  p.ring_stages = stages;
  const dim3 grid(p.heads / p.heads_per_cta, p.batch);
  kernel<<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <int kP, int kN, DType kAct>
cudaError_t dispatch_verify_state(const Mamba2SpecParams& p, cudaStream_t stream) {
  const DType src = p.read_copy != nullptr ? p.read_copy_dtype : p.checkpoint_dtype;
  switch (src) {
    case DType::kFloat32: return launch_verify<kP, kN, DType::kFloat32, kAct>(p, stream);
    case DType::kBFloat16: return launch_verify<kP, kN, DType::kBFloat16, kAct>(p, stream);
    case DType::kFloat16: return launch_verify<kP, kN, DType::kFloat16, kAct>(p, stream);
    case DType::kFloat8E4M3: return launch_verify<kP, kN, DType::kFloat8E4M3, kAct>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

// All dtype combinations of one (P, N); instantiated once per shape file.
template <int kP, int kN>
cudaError_t launch_verify_shape(const Mamba2SpecParams& p, cudaStream_t stream) {
  if (p.act_dtype == DType::kBFloat16) return dispatch_verify_state<kP, kN, DType::kBFloat16>(p, stream);
  if (p.act_dtype == DType::kFloat16) return dispatch_verify_state<kP, kN, DType::kFloat16>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace mamba2_spec
}  // namespace replayssm
