// Stochastic rounding of fp32 values to a bf16 / fp16 checkpoint (docs/DESIGN.md section 9), one definition
// for every kernel that writes a 16-bit checkpoint from fp32 (the update, the step's fold, the fold
// of commit / flush). replayssm_cuda/reference.py (stochastic_round, rounding_bits) is the spec and
// is bit-identical: the kernel and the reference agree wherever the fp32 value before rounding does.
//
// Rounding (16 random bits r per element, uniform in [0, 2^16)): a value between two neighbouring
// 16-bit values goes to the one farther from zero with probability equal to its fractional distance
// from the one nearer zero, so E[SR(v)] = v. Representable values stay; NaN goes through as the
// round-to-nearest store takes it; fp16 saturates to +-65504 first, exactly like the RNE stores, so
// inf becomes +-65504. bf16: the fp32 bits plus r, truncated to the top 16 (exact: 16 bits are
// discarded). fp16: the same with the fp32 mantissa bits below the fp16 spacing (13 for normal fp16,
// up to 23 in its subnormal range, where r is scaled up, so the probability there is the fraction
// truncated to 16 bits); below 2^-24, |v| becomes 2^-24 when r + floor(2^16 |v| / 2^-24) >= 2^16,
// else 0. In every case a larger r rounds away from zero, never a smaller one.
//
// Random bits: Philox4x32-10 (philox.cuh). One draw covers 8 consecutive elements of a state row:
//   key     (seed mod 2^32, seed >> 32)                          from rounding_seed[0]
//   counter (p << 16 | n / 8, head, slot mod 2^32, offset mod 2^32)  offset = rounding_seed[1]
// and element n takes the 16-bit half n % 2 (low half first) of word (n % 8) / 2. So the bits of
// checkpoint element (slot, head, p, n) depend on nothing but (seed, offset, slot, head, p, n): not on
// the batch row, the batch size or how a launch splits the work. Each launch that may round advances
// offset by one on the device (the cursor kernel of commit / flush, rounding_offset_kernel after the
// update and the step), so two launches never reuse bits; the streams repeat after 2^32 launches.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "common/philox.cuh"

namespace replayssm {

REPLAYSSM_HD uint32_t float_to_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

REPLAYSSM_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

// SR of v to bf16, returned as the fp32 value (exactly representable in bf16, so the round-to-nearest
// store that follows writes it unchanged). r: 16 random bits.
REPLAYSSM_HD float stochastic_round_bf16(float v, uint32_t r) {
  const uint32_t a = float_to_bits(v);
  if ((a & 0x7fffffffu) > 0x7f800000u) return v;  // NaN: the store rounds it as RNE does
  // Sign-magnitude: adding to the low bits grows |v|; a carry out of them is the round away from zero.
  return bits_to_float((a + r) & 0xffff0000u);
}

// SR of v to fp16 (after saturating to +-65504), returned as the fp32 value (exactly representable in
// fp16). r: 16 random bits.
REPLAYSSM_HD float stochastic_round_fp16(float v, uint32_t r) {
  if (v != v) return v;
  v = v > 65504.0f ? 65504.0f : (v < -65504.0f ? -65504.0f : v);
  const uint32_t a = float_to_bits(v);
  const uint32_t sign = a & 0x80000000u;
  const uint32_t m = a ^ sign;  // |v|
  const uint32_t e = m >> 23;   // biased fp32 exponent
  uint32_t q;
  if (e >= 103) {  // |v| >= 2^-24: the fp16 grid is a mask of the fp32 mantissa
    // fp32 mantissa bits below the fp16 spacing: 13 in fp16's normal range (e >= 113), more below.
    const uint32_t s = e >= 113 ? 13u : 126u - e;
    const uint32_t add = s <= 16 ? r >> (16 - s) : r << (s - 16);
    q = (m + add) & ~((1u << s) - 1u);
  } else {  // |v| < 2^-24: 0 or 2^-24, the latter with probability |v| / 2^-24 (to 16 bits)
    const uint32_t sig = e == 0 ? m : ((m & 0x7fffffu) | 0x800000u);
    const uint32_t d = 126u - (e == 0 ? 1u : e);  // |v| / 2^-24 = sig / 2^d, d >= 24
    const uint32_t shift = d - 16 < 31 ? d - 16 : 31u;
    q = r + (sig >> shift) >= 0x10000u ? 0x33800000u : 0u;  // 2^-24; a carry, as in the branch above
  }
  return bits_to_float(sign | q);
}

#if defined(__CUDACC__)

// Advances rounding_seed[1] (the offset) by one: launched after a kernel that rounds, in stream order.
cudaError_t launch_rounding_offset_advance(int64_t* rounding_seed, cudaStream_t stream);

// The key and offset of one launch, read once per CTA from rounding_seed = [seed, offset] (int64).
struct RoundingKey {
  uint32_t k0, k1, offset;
  __device__ static RoundingKey load(const int64_t* rounding_seed) {
    const uint64_t seed = static_cast<uint64_t>(__ldg(rounding_seed));
    const uint64_t offset = static_cast<uint64_t>(__ldg(rounding_seed + 1));
    return RoundingKey{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(offset)};
  }
  // The draw covering columns (n0 & ~7) .. (n0 | 7) of row p of (slot, head).
  __device__ Philox4x32 draw(int64_t slot, int head, int p, int n0) const {
    return philox4x32_10((static_cast<uint32_t>(p) << 16) | static_cast<uint32_t>(n0 >> 3), static_cast<uint32_t>(head),
                         static_cast<uint32_t>(slot), offset, k0, k1);
  }
};

// The random words of a thread's 4 consecutive columns col0 .. col0 + 3 (col0 % 4 == 0): element
// col0 + i takes half i % 2 of word i / 2. Threads hold whole rows' worth of columns in lane pairs:
// the partner lane (lane ^ 1) must hold columns col0 ^ 4 of the same rows, and all 32 lanes call.
// A pair of rows costs each lane one Philox draw: the lane holding the lower 4 columns of the 8
// draws row pa, its partner row pb, and they trade the halves the other one needs.
__device__ __forceinline__ void rounding_words2(const RoundingKey& key, int64_t slot, int head, int pa, int pb, int col0,
                                                uint32_t (&wa)[2], uint32_t (&wb)[2]) {
  const bool upper = (col0 & 4) != 0;
  const Philox4x32 d = key.draw(slot, head, upper ? pb : pa, col0);
  const uint32_t got0 = __shfl_xor_sync(0xffffffffu, upper ? d.v[0] : d.v[2], 1);
  const uint32_t got1 = __shfl_xor_sync(0xffffffffu, upper ? d.v[1] : d.v[3], 1);
  wa[0] = upper ? got0 : d.v[0];
  wa[1] = upper ? got1 : d.v[1];
  wb[0] = upper ? d.v[2] : got0;
  wb[1] = upper ? d.v[3] : got1;
}

// One row alone (the odd row out of a thread's rows): each lane draws it.
__device__ __forceinline__ void rounding_words1(const RoundingKey& key, int64_t slot, int head, int p, int col0,
                                                uint32_t (&w)[2]) {
  const Philox4x32 d = key.draw(slot, head, p, col0);
  const bool upper = (col0 & 4) != 0;
  w[0] = upper ? d.v[2] : d.v[0];
  w[1] = upper ? d.v[3] : d.v[1];
}

// The words of a thread's rows r = 0, 1, ... of a run, asked for in order: an even r draws rows r and
// r + 1 together (r alone when it is the run's last), an odd r takes what was drawn with r - 1.
struct RoundingWords {
  uint32_t next[2];
  template <int kRows, class RowOf>
  __device__ __forceinline__ void get(const RoundingKey& key, int64_t slot, int head, int r, RowOf row_of, int col0,
                                      uint32_t (&w)[2]) {
    if (r % 2 == 1) {
      w[0] = next[0];
      w[1] = next[1];
    } else if (r + 1 < kRows) {
      rounding_words2(key, slot, head, row_of(r), row_of(r + 1), col0, w, next);
    } else {
      rounding_words1(key, slot, head, row_of(r), col0, w);
    }
  }
};

// SR of a thread's 4 state values in place, for a checkpoint of type T (bf16 or fp16): afterwards
// the checkpoint's round-to-nearest store writes them unchanged.
template <DType T>
__device__ __forceinline__ void stochastic_round4(float (&v)[4], const uint32_t (&w)[2]) {
  static_assert(T == DType::kBFloat16 || T == DType::kFloat16, "stochastic rounding is for 16-bit checkpoints");
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) r[i] = (w[i >> 1] >> (16 * (i & 1))) & 0xffffu;
  if constexpr (T == DType::kBFloat16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = stochastic_round_bf16(v[i], r[i]);
  } else {
    // The common case on its own: all four in fp16's normal range and within +-65504, where the rule
    // is bf16's with 13 discarded bits (stochastic_round_fp16 with e >= 113, no clamp), a third of its
    // instructions. Subnormal, tiny, saturating, inf and NaN values take the general rule.
    bool normal = true;
#pragma unroll
    for (int i = 0; i < 4; ++i) normal &= (float_to_bits(v[i]) & 0x7fffffffu) - 0x38800000u <= 0x477fe000u - 0x38800000u;
    if (normal) {
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = bits_to_float((float_to_bits(v[i]) + (r[i] >> 3)) & 0xffffe000u);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = stochastic_round_fp16(v[i], r[i]);
    }
  }
}

#endif  // __CUDACC__

}  // namespace replayssm
