// Host side of the Mamba-2 fold (commit, flush, materialize): the persistent grid's size, the ring's
// stages, and the dtype dispatch of one (P, N) shape (instantiations/fold_p<P>_n<N>.cu).
#pragma once

#include "families/mamba2/fold_kernel.cuh"

namespace replayssm {
namespace mamba2_spec {

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kRound>
cudaError_t launch_fold_kernel(const Mamba2SpecParams& p, cudaStream_t stream) {
  auto kernel = fold_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound>;
  using Layout = FoldLayout<kP, kN, kCkpt, kAct>;
  int device = 0, sms = 0, max_smem = 0, ctas_per_sm = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  Mamba2SpecParams params = p;
  params.ring_stages = Layout::kStages;
  auto fits = [&](int stages) {
    return Layout::bytes_with(stages, p.buffer_len) + sizeof(FoldRows) <= static_cast<size_t>(max_smem);
  };
  if (!fits(params.ring_stages)) params.ring_stages = 2;
  if (!fits(params.ring_stages)) return cudaErrorInvalidValue;
  const size_t smem = Layout::bytes_with(params.ring_stages, p.buffer_len);
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kThreads, smem);
  if (err != cudaSuccess) return err;
  // One wave of persistent CTAs, never more than there are (row, head) items.
  const int64_t items = static_cast<int64_t>(p.batch) * p.heads;
  const int64_t wave = static_cast<int64_t>(sms) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  kernel<<<static_cast<unsigned>(items < wave ? items : wave), kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct>
cudaError_t launch_fold(const Mamba2SpecParams& p, cudaStream_t stream) {
  if constexpr (kCkpt != DType::kFloat32) {
    if (p.rounding_seed != nullptr) return launch_fold_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, true>(p, stream);
  }
  return launch_fold_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, false>(p, stream);
}

template <int kP, int kN, DType kAct>
cudaError_t dispatch_fold_state(const Mamba2SpecParams& p, cudaStream_t stream) {
  const bool copy = p.read_copy != nullptr;
  const DType ck = p.checkpoint_dtype, rc = p.read_copy_dtype;
#define REPLAYSSM_FOLD_CASE(CKPT, COPY, READ)                              \
  if (ck == DType::CKPT && copy == COPY && (!COPY || rc == DType::READ)) \
    return launch_fold<kP, kN, DType::CKPT, COPY, DType::READ, kAct>(p, stream);
  REPLAYSSM_FOLD_CASE(kFloat32, false, kFloat32)
  REPLAYSSM_FOLD_CASE(kFloat32, true, kBFloat16)
  REPLAYSSM_FOLD_CASE(kFloat32, true, kFloat16)
  REPLAYSSM_FOLD_CASE(kFloat32, true, kFloat8E4M3)
  REPLAYSSM_FOLD_CASE(kBFloat16, false, kBFloat16)
  REPLAYSSM_FOLD_CASE(kBFloat16, true, kFloat8E4M3)
  REPLAYSSM_FOLD_CASE(kFloat16, false, kFloat16)
  REPLAYSSM_FOLD_CASE(kFloat16, true, kFloat8E4M3)
#undef REPLAYSSM_FOLD_CASE
  return cudaErrorInvalidValue;
}

// All dtype combinations of one (P, N); instantiated once per shape file.
template <int kP, int kN>
cudaError_t launch_fold_shape(const Mamba2SpecParams& p, cudaStream_t stream) {
  if (p.act_dtype == DType::kBFloat16) return dispatch_fold_state<kP, kN, DType::kBFloat16>(p, stream);
  if (p.act_dtype == DType::kFloat16) return dispatch_fold_state<kP, kN, DType::kFloat16>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace mamba2_spec
}  // namespace replayssm
