// Tensor-core building blocks: mma.sync tiles (m16n8k16 f16/bf16, m16n8k8 tf32) with fp32
// accumulators, ldmatrix (cute's SM75_U16x8_LDSM_T), exact splits of an fp32 value into tf32 or bf16
// pieces (so that a product with a 16-bit factor stays exact or within 2^-21 of fp32), and fragment
// conversions.
//
// The mma.sync wrappers stay inline PTX with the accumulators in place ("+f"): cute's MMA atoms
// (SM80_16x8x16_F32BF16BF16F32_TN, ..._F32F16F16F32_TN, SM80_16x8x8_F32TF32TF32F32_TN) take C and D as
// separate operands, the same instruction, but ptxas then allocates registers differently in 20 of the
// step kernels.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cute/arch/copy_sm75.hpp>

#include "common/dtype.h"

namespace replayssm {

// d += a b for one m16n8k16 tile, f16 or bf16 inputs, fp32 accumulators.
template <bool kBf16>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// d += a b for one m16n8k8 tile of tf32 inputs, fp32 accumulators (verify's fp32-source read). An
// operand is an fp32 bit pattern whose low 13 mantissa bits are zero (split_tf32 makes them so).
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32): lane = 4 g + c holds A (g, c),
// (g + 8, c), (g, c + 4), (g + 8, c + 4), B (k = c, n = g), (k = c + 4, n = g), and D (g, 2c), (g, 2c + 1),
// (g + 8, 2c), (g + 8, 2c + 1).
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// An fp32 value as two tf32 values, x = hi + lo + e with |e| < 2^-21 |x| (normal x): hi is x truncated
// to tf32 (11 significant bits), x - hi is exact in fp32 and below hi's last bit, lo truncates it. So a
// product with a tf32-exact factor (a bf16 or fp16 activation) costs two mma and stays within 2^-21 of
// the fp32 product; an infinite x gives NaN.
struct Tf32Pair {
  uint32_t hi, lo;
};
__device__ __forceinline__ Tf32Pair split_tf32(float x) {
  constexpr uint32_t kTf32Mask = 0xffffe000u;
  const uint32_t hi = __float_as_uint(x) & kTf32Mask;
  const float rest = x - __uint_as_float(hi);
  return {hi, __float_as_uint(rest) & kTf32Mask};
}

// Two e4m3 values (low byte first) as an f16x2 register (exact).
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

__device__ __forceinline__ uint32_t floats_to_f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Whether the mma takes a tile of `src` times raw activations of `act` with every product exact: an fp8
// tile (e4m3 -> f16 exactly, the activations f16 or bf16 scaled into f16 by F16RangeScale), or a 16-bit
// tile of the activations' own type. A 16-bit tile of the other 16-bit type has no exact mma form.
__host__ __device__ constexpr bool tile_on_tensor_cores(DType src, DType act) {
  return src == DType::kFloat8E4M3 || (src == act && (src == DType::kBFloat16 || src == DType::kFloat16));
}

// A bf16 vector as f16 mma operands: the power of two 2^k that puts amax = max|x| in [2^14, 2^15) once
// scaled, so that every x_i within 2^-24 of amax is exact in f16 (bf16 has 8 significant bits, f16 11
// and subnormals down to 2^-24), and its inverse to scale the products back exactly. amax zero, inf or
// NaN: no scaling (inf and NaN carry through).
struct F16RangeScale {
  float scale = 1.0f, unscale = 1.0f;
  __device__ __forceinline__ explicit F16RangeScale(float amax) {
    const int e = static_cast<int>((__float_as_uint(amax) >> 23) & 0xffu);
    if (amax > 0.0f && e < 255) {
      const int k = min(max(141 - e, -100), 100);  // amax * 2^k in [2^14, 2^15)
      scale = __uint_as_float(static_cast<uint32_t>(127 + k) << 23);
      unscale = __uint_as_float(static_cast<uint32_t>(127 - k) << 23);
    }
  }
};

// Four transposed 8x8 b16 matrices from shared memory (ldmatrix .x4 .trans); `row` is this lane's row
// address.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&a)[4], const void* row) {
  cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(row), a[0], a[1], a[2], a[3]);
}

struct Bf16x3 {
  uint32_t hi, mid, lo;  // bf16 bit patterns (low 16 bits)
};
// x = hi + mid + lo exactly: hi is x truncated to bf16 (8 significant bits), x - hi is exact in fp32
// with at most 16 significant bits, mid truncates that to 8 and leaves at most 8 for lo.
__device__ __forceinline__ Bf16x3 split_bf16x3(float x) {
  const uint32_t hi = __float_as_uint(x) & 0xffff0000u;
  const float rest = x - __uint_as_float(hi);
  const uint32_t mid = __float_as_uint(rest) & 0xffff0000u;
  const float lo = rest - __uint_as_float(mid);
  return {hi >> 16, mid >> 16, __float_as_uint(lo) >> 16};
}

}  // namespace replayssm
