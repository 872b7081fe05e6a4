// Device helpers shared by the kernels: dtype <-> float conversions with the exact rounding rules of
// the PyTorch reference, vector loads/stores of 8-element chunks, group reductions.
//
// Rounding rules (bitwise equal to the reference, which is the spec):
//   bf16  round-to-nearest-even, no clamp (overflow rounds to inf as in torch).
//   fp16  clamp to +-65504 first (saturate), then round-to-nearest-even.
//   fp8   e4m3fn round-to-nearest-even of an already clamped value (SATFINITE is then a no-op for
//         finite inputs).
// Clamps are written with comparisons, not fminf/fmaxf, so a NaN stays NaN as torch.clamp keeps it.
// No fast math anywhere: division and multiplication are the IEEE round-to-nearest operations.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "common/dtype.h"

namespace replayssm {

constexpr float kFp16Max = 65504.0f;
constexpr float kFp8E4M3Max = 448.0f;

// Elements per thread in the vectorised row kernels: 16 bytes of a 16-bit type, 32 of fp32.
constexpr int kChunk = 8;

template <DType T> struct Storage;
template <> struct Storage<DType::kFloat32> { using type = float; };
template <> struct Storage<DType::kBFloat16> { using type = __nv_bfloat16; };
template <> struct Storage<DType::kFloat16> { using type = __half; };
template <> struct Storage<DType::kFloat8E4M3> { using type = __nv_fp8_storage_t; };

template <int kBytes>
__device__ __forceinline__ bool is_aligned(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & (kBytes - 1)) == 0;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// NaN-propagating clamp (torch.clamp semantics).
__device__ __forceinline__ float clamp_keep_nan(float x, float lo, float hi) {
  return x > hi ? hi : (x < lo ? lo : x);
}

// NaN-propagating max (torch.amax semantics): once either side is NaN the result is NaN.
__device__ __forceinline__ float max_keep_nan(float a, float b) {
  return (b > a || b != b) ? b : a;
}

// A value of an fp8 (e4m3) read copy before its conversion (reference.make_read_copy's rule): times
// the row's inverse scale inv = 448 / max|row| (1 for a zero or NaN maximum). The rule's clamp to +-448
// with NaN kept is the conversion's own: every fp8 conversion here is cvt.rn.satfinite, which maps
// |x| > 448 (Inf included) to +-448 and NaN to NaN, so clamping first changes no bit. (The clamp costs 3
// instructions per element, ~5% of the fp8-copy fold step's instructions.)
// make_read_copy and both folds' read-copy refreshes use it; its result must only be converted.
__device__ __forceinline__ float fp8_scaled(float v, float inv) { return __fmul_rn(v, inv); }

// An fp8 row's scales from its max |v| (amax), correctly rounded: the inverse scale that fp8_scaled
// multiplies by (448 / amax) and the dequantisation scale stored beside the copy (amax / 448). Both are
// 1 for a zero or NaN maximum (`amax > 0` is false for NaN), like the reference's torch.where. The one
// rule of make_read_copy and of every fold's copy refresh, which the GPU tests hold bitwise equal.
__device__ __forceinline__ float fp8_inverse_scale(float amax) {
  return amax > 0.0f ? __fdiv_rn(kFp8E4M3Max, amax) : 1.0f;
}
__device__ __forceinline__ float fp8_scale(float amax) { return amax > 0.0f ? __fdiv_rn(amax, kFp8E4M3Max) : 1.0f; }

// Max over aligned groups of `width` lanes (a power of two <= 32). Every lane of the warp must call
// it, with the same width.
__device__ __forceinline__ float group_max_keep_nan(float v, int width) {
  for (int offset = width >> 1; offset > 0; offset >>= 1) {
    v = max_keep_nan(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// ---- loads: kChunk consecutive elements (col0 .. col0 + 7) of a row into floats -------------------
// The vector path needs the chunk entirely inside the row and a 16-byte aligned address; anything
// else (odd cols, odd strides, offset views) takes the scalar path of the same thread. Elements past
// `cols` read as 0.

__device__ __forceinline__ void load_chunk(const float* row, int col0, int cols, float (&v)[kChunk]) {
  const float* p = row + col0;
  if (col0 + kChunk <= cols && is_aligned<16>(p)) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = col0 + i < cols ? __ldg(p + i) : 0.0f;
  }
}

template <typename Half16>  // __nv_bfloat16 or __half
__device__ __forceinline__ void load_chunk(const Half16* row, int col0, int cols, float (&v)[kChunk]) {
  static_assert(sizeof(Half16) == 2, "load_chunk: 16-bit element type expected");
  const Half16* p = row + col0;
  if (col0 + kChunk <= cols && is_aligned<16>(p)) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const Half16* h = reinterpret_cast<const Half16*>(&raw);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = to_float(h[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = col0 + i < cols ? to_float(p[i]) : 0.0f;
  }
}

// ---- stores: kChunk floats to (col0 .. col0 + 7) of a row, elements past `cols` not written -------

__device__ __forceinline__ __nv_bfloat16 from_float_bf16(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ __half from_float_fp16(float x) {
  return __float2half_rn(clamp_keep_nan(x, -kFp16Max, kFp16Max));
}
// Saturating (SATFINITE): |x| > 448 and +-Inf to +-448, NaN to NaN; the clamp of the read-copy rule
// (fp8_scaled).
__device__ __forceinline__ __nv_fp8_storage_t from_float_fp8_e4m3(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
// Four values as four fp8 bytes, v[0] in the low byte (the lowest address): two paired conversions
// (one instruction each, the same rounding and saturation as from_float_fp8_e4m3) and one byte
// permute, instead of four conversions with their shifts and ors.
__device__ __forceinline__ uint32_t pack_fp8x4_e4m3(float v0, float v1, float v2, float v3) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v0, v1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v2, v3), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

__device__ __forceinline__ void store_chunk(__nv_bfloat16* row, int col0, int cols, const float (&v)[kChunk]) {
  __nv_bfloat16* p = row + col0;
  if (col0 + kChunk <= cols && is_aligned<16>(p)) {
    uint4 raw;
    __nv_bfloat162* h2 = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) h2[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) if (col0 + i < cols) p[i] = from_float_bf16(v[i]);
  }
}

__device__ __forceinline__ void store_chunk(__half* row, int col0, int cols, const float (&v)[kChunk]) {
  __half* p = row + col0;
  if (col0 + kChunk <= cols && is_aligned<16>(p)) {
    uint4 raw;
    __half* h = reinterpret_cast<__half*>(&raw);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) h[i] = from_float_fp16(v[i]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) if (col0 + i < cols) p[i] = from_float_fp16(v[i]);
  }
}

__device__ __forceinline__ void store_chunk(__nv_fp8_storage_t* row, int col0, int cols, const float (&v)[kChunk]) {
  __nv_fp8_storage_t* p = row + col0;
  if (col0 + kChunk <= cols && is_aligned<8>(p)) {
    uint2 raw;
    __nv_fp8x2_storage_t* q2 = reinterpret_cast<__nv_fp8x2_storage_t*>(&raw);
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) {
      // .x lands in the low byte, i.e. at the lower address.
      q2[i] = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * i], v[2 * i + 1]), __NV_SATFINITE, __NV_E4M3);
    }
    *reinterpret_cast<uint2*>(p) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) if (col0 + i < cols) p[i] = from_float_fp8_e4m3(v[i]);
  }
}

}  // namespace replayssm
