// Warp-level reductions over aligned groups of lanes: the sums, maxima and prefix sums the kernels of
// every family take over the lanes that share a state row. Every lane of the warp must call them.
#pragma once

#include <cstdint>

namespace replayssm {

// The sum over a row's kLanes lanes: lanes kStride apart within an aligned group of kLanes kStride
// lanes (kStride 1: consecutive lanes; the butterfly's pairs and order are the same for any stride).
template <int kLanes, int kStride = 1>
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset * kStride);
  return v;
}

// Inclusive prefix sum over the 32 lanes of a warp (all lanes call).
__device__ __forceinline__ float warp_inclusive_sum(float v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const float other = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) v += other;
  }
  return v;
}

// Inclusive suffix sum over the 32 lanes of a warp: lane l gets v_l + ... + v_31 (all lanes call). A
// sum of the later entries of a sequence without the cancellation of a difference of prefix sums.
__device__ __forceinline__ float warp_inclusive_suffix_sum(float v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const float other = __shfl_down_sync(0xffffffffu, v, offset);
    if (lane + offset < 32) v += other;
  }
  return v;
}

// max|v| as bits, for the fp8 read copy's row maxima: for non-negative floats the unsigned order of
// the bit patterns is the float order, +Inf above every finite value and every NaN above +Inf, so an
// unsigned max of abs_bits(v) is max|v|, and a NaN whenever one is (torch.amax's rule, max_keep_nan's
// result). Which NaN comes out may differ, and does not matter: a NaN maximum meets only the `> 0` test
// (scale 1). One integer max per element instead of max_keep_nan's two compares and a select (the
// fp8-copy fold step is issue-bound, and those compares and selects were 11% of its instructions).
__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

template <int kLanes, int kStride = 1>  // the row's lanes as row_sum's
__device__ __forceinline__ uint32_t row_max_bits(uint32_t v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset * kStride));
  return v;
}

// Reduce-scatter of kRows rows' partial values over the kLanes lanes of each row (an aligned group in
// the warp): v[q] is this lane's part of row q; returns, in lane l of the group, row l / (kLanes /
// kRows)'s total. At each step the lanes differing in bit `offset` swap half of their rows, then the
// last kLanes / kRows lanes finish as a butterfly: kRows - 1 + log2(kLanes / kRows) shuffles instead of
// kRows log2(kLanes). The offsets run from kLanes / 2 down, as row_sum's and row_max_bits', and each
// step combines the same two partial values (in the other order), so a commutative op gives the
// butterfly's bits: a sum here is bitwise row_sum's. kStride: the row's lanes as row_sum's (l the
// lane's index in the row).
template <int kLanes, int kRows, int kStride = 1, class T, class Op>
__device__ __forceinline__ T reduce_scatter_rows(T (&v)[kRows], Op op) {
  static_assert(kRows == 2 || kRows == 4, "rows reduced together: 2 or 4");
  static_assert(kLanes >= 2 * kRows && kLanes * kStride <= 32, "a row's lanes split between the rows");
  const int lane = static_cast<int>(threadIdx.x) / kStride % kLanes;
#pragma unroll
  for (int count = kRows, offset = kLanes / 2; count > 1; count /= 2, offset /= 2) {
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int i = 0; i < count / 2; ++i) {
      const T send = upper ? v[i] : v[i + count / 2];
      const T keep = upper ? v[i + count / 2] : v[i];
      v[i] = op(keep, __shfl_xor_sync(0xffffffffu, send, offset * kStride));
    }
  }
#pragma unroll
  for (int offset = kLanes / kRows / 2; offset > 0; offset /= 2) {
    v[0] = op(v[0], __shfl_xor_sync(0xffffffffu, v[0], offset * kStride));
  }
  return v[0];
}
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxBitsOp {  // of abs_bits values
  __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return max(a, b); }
};

}  // namespace replayssm
