// How the GDN kernels cover a state tile [V, K] (K contiguous, a row = one value channel) with threads,
// and the 16-byte moves of its rows and of the activation fragments that meet them.
//
// Thread mapping: a row of K elements is kChunksPerRow 16-byte chunks; kLanes consecutive lanes (8 by
// default, 16 where a kernel wants fewer elements a lane; fewer when a row has fewer chunks) share a
// row, lane l holding chunks l, l + kLanes, ... So each group of 8 lanes moves 128 contiguous bytes per
// load or store (whole L2 lines from global memory, no bank conflict from shared memory), and a row's
// dot products reduce over kLanes lanes (log2(kLanes) shuffles).
// Rows do not interact in the delta rule (u[v] needs only row v of S), so a CTA may own any rows.
#pragma once

#include <cstdint>

#include "common/convert.cuh"
#include "common/vec.cuh"

namespace replayssm {
namespace gdn {

template <int kK, DType kState, int kThreads, int kMaxLanes = 8>
struct RowLanes {
  static constexpr int kElemsPerChunk = 16 / dtype_size(kState);  // 4 fp32, 8 bf16 / fp16, 16 fp8
  static constexpr int kChunksPerRow = kK / kElemsPerChunk;
  static constexpr int kLanes = kChunksPerRow < kMaxLanes ? kChunksPerRow : kMaxLanes;
  static constexpr int kChunksPerLane = kChunksPerRow / kLanes;
  static constexpr int kElemsPerLane = kChunksPerLane * kElemsPerChunk;
  static constexpr int kRowsPerPass = kThreads / kLanes;
  static_assert(kK % kElemsPerChunk == 0 && kChunksPerRow % kLanes == 0, "a row is whole chunks, evenly shared");
  static_assert(32 % kLanes == 0 && kThreads % 32 == 0, "a row's lanes sit inside one warp");

  __device__ static int lane() { return static_cast<int>(threadIdx.x) % kLanes; }
  __device__ static int first_row() { return static_cast<int>(threadIdx.x) / kLanes; }
  // First column of this lane's chunk i.
  __device__ static int col(int i) { return (lane() + kLanes * i) * kElemsPerChunk; }
};

// kN activation elements (4, 8 or 16) kept as loaded (two 16-bit values a word) and converted where
// used: a thread holding q and k for its columns keeps half the registers of their fp32 values, which
// is the update's occupancy (CTAs per SM, so state bytes in flight).
template <DType kAct, int kN>
struct ActFrag {
  static_assert(kN == 4 || kN == 8 || kN == 16, "4, 8 or 16 activation elements");
  static_assert(kAct == DType::kBFloat16 || kAct == DType::kFloat16, "activations are bf16 or fp16");
  uint32_t word[kN / 2];

  __device__ __forceinline__ void load(const void* base, int64_t offset) {
    const unsigned char* p = static_cast<const unsigned char*>(base) + offset * 2;
    if constexpr (kN == 4) {
      const uint2 r = __ldg(reinterpret_cast<const uint2*>(p));
      word[0] = r.x;
      word[1] = r.y;
    } else {
#pragma unroll
      for (int h = 0; h < kN / 8; ++h) {
        const uint4 r = __ldg(reinterpret_cast<const uint4*>(p) + h);
        word[4 * h] = r.x;
        word[4 * h + 1] = r.y;
        word[4 * h + 2] = r.z;
        word[4 * h + 3] = r.w;
      }
    }
  }
  // Element e (a compile-time index after unrolling).
  __device__ __forceinline__ float operator[](int e) const {
    const uint32_t w = word[e / 2];
    if constexpr (kAct == DType::kBFloat16) {
      return __uint_as_float(e % 2 == 0 ? w << 16 : w & 0xffff0000u);  // bf16 -> fp32 is a shift
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(e % 2 == 0 ? w & 0xffffu : w >> 16)));
    }
  }
};

// 16 bytes of state values (4 fp32 or 8 bf16 / fp16) from floats, with the update's rounding:
// round to nearest even, fp16 saturating (convert.cuh).
template <DType kState>
__device__ __forceinline__ uint4 pack_chunk(const float (&v)[16 / dtype_size(kState)]) {
  if constexpr (kState == DType::kFloat32) {
    return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
  } else {
    static_assert(kState == DType::kBFloat16 || kState == DType::kFloat16, "a state is fp32, bf16 or fp16");
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kState == DType::kBFloat16) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __half lo = from_float_fp16(v[2 * i]), hi = from_float_fp16(v[2 * i + 1]);
        w[i] = static_cast<uint32_t>(__half_as_ushort(lo)) | (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
      }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// One 16-byte global store, kept whole (see store_whole in common/vec.cuh for why inline PTX).
__device__ __forceinline__ void store16(void* p, const uint4& v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

template <DType kState>
__device__ __forceinline__ void store_chunk16(void* base, int64_t offset, const float (&v)[16 / dtype_size(kState)]) {
  store16(static_cast<unsigned char*>(base) + offset * dtype_size(kState), pack_chunk<kState>(v));
}

// The value a state element has after a store and a load in its dtype.
template <DType kState>
__device__ __forceinline__ float state_round_trip(float v) {
  return Vec4<kState>::round_trip(v);
}

}  // namespace gdn
}  // namespace replayssm
