// The per-token arithmetic every Gated DeltaNet kernel shares (update, snapshots, step, verify, fold),
// so that a token's gates and normalised keys are the same numbers in every op:
//   g = -exp(A_log) * softplus(a + dt_bias)   (log decay; alpha = exp(g); KDA: per key channel too)
//   beta = sigmoid(b)
//   q, k L2-normalised when use_qk_l2norm: x * rsqrt(sum x^2 + 1e-6) (reference.L2NORM_EPS); q scaled.
// fp32, no fast math (softplus is torch's, threshold 20; the reciprocal square root is correctly rounded).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/dtype.h"
#include "common/math.cuh"
#include "families/gdn/params.h"

namespace replayssm {
namespace gdn {

constexpr float kL2NormEps = 1e-6f;

__device__ __forceinline__ float log_decay(float a, float A_log, float dt_bias) {
  return -expf(A_log) * softplus(a + dt_bias);
}

__device__ __forceinline__ float beta_gate(float b) { return 1.0f / (1.0f + expf(-b)); }

// The conventional delta rule's last steps for one value row (gdn_update and the snapshots share them,
// so that a snapshot is the update's state bit for bit). Each is rounded in one fixed order: written as
// a * b + c, a sum with two products lets the compiler fuse either one (NVVM, and ptxas again on PTX's
// unrounded mul and add), and it chose differently in two instances of one kernel (the update's 16 KB
// and 4 KB CTAs). KDA (kVectorGate): the state row and S k, S q are already decayed, alpha is 1.
//   dk, dq: the row's S k and S q sums, scaled by the keys' normalisers (rounded as products)
//   u = beta (v - alpha dk); new state x' = alpha x + u k_hat; output alpha dq + u (k_hat . q_hat)
__device__ __forceinline__ float scaled_sum(float sum, float scale) { return __fmul_rn(sum, scale); }

template <bool kVectorGate>
__device__ __forceinline__ float corrected_value(float v, float dk, float alpha, float beta) {
  return beta * (v - (kVectorGate ? dk : __fmul_rn(alpha, dk)));
}

// alpha x + u y: the decayed term fused (GDN), or, where x is already decayed (KDA), the correction.
template <bool kVectorGate>
__device__ __forceinline__ float decayed_plus(float alpha, float x, float u, float y) {
  return kVectorGate ? fmaf(u, y, x) : fmaf(alpha, x, __fmul_rn(u, y));
}

// The factor that normalises a vector whose squares sum to `sum_sq` (1 without normalisation).
__device__ __forceinline__ float key_scale(float sum_sq, bool use_qk_l2norm) {
  return use_qk_l2norm ? __frsqrt_rn(sum_sq + kL2NormEps) : 1.0f;
}

// One element of a gate input (a or b): the activation dtype or fp32.
__device__ __forceinline__ float load_gate_input(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kFloat32: return __ldg(static_cast<const float*>(base) + offset);
    case DType::kBFloat16: return __bfloat162float(__ldg(static_cast<const __nv_bfloat16*>(base) + offset));
    default: return __half2float(__ldg(static_cast<const __half*>(base) + offset));
  }
}

// KDA (GdnGate::kVector): one token's decay factors exp(g) at a lane's key channels, col(i) + e for
// its C chunks of E channels; a_at: the token's a at (row, [t,] hv) (its channel 0).
template <int C, int E, typename Col>
__device__ __forceinline__ void channel_decays(float (&alpha)[C][E], const GdnParams& p, int64_t a_at, int hv,
                                               float A_log, Col col) {
  const GdnTokens& tk = p.tokens;
  const float* dt_bias = tk.dt_bias + hv * p.kda.dt_bias_head_stride;
#pragma unroll
  for (int i = 0; i < C; ++i) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int ch = col(i) + e;
      const float a = load_gate_input(tk.a, tk.a_dtype, a_at + ch * p.kda.a_channel_stride);
      alpha[i][e] = expf(log_decay(a, A_log, __ldg(dt_bias + ch)));
    }
  }
}

}  // namespace gdn
}  // namespace replayssm
