// Vectors of state and activations in registers: 4-element state vectors of every storage type (raw
// storage, so that a thread's loads can all be in flight before any is converted), 16-byte chunks of
// any type, single activations, and stores that stay one whole vector store.
#pragma once

#include <cstdint>

#include "common/convert.cuh"

namespace replayssm {

// ---- 4-element state vectors: raw storage (so loads can all be in flight) and conversions ---------

template <DType T> struct Vec4;

template <> struct Vec4<DType::kFloat32> {
  using Raw = float4;
  __device__ static Raw load(const void* base, int64_t offset) {
    return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(base) + offset));
  }
  __device__ static void to_float(const Raw& r, float (&v)[4]) { v[0] = r.x; v[1] = r.y; v[2] = r.z; v[3] = r.w; }
  // The stored bits of 4 values (what store writes).
  __device__ static Raw pack(const float (&v)[4]) { return make_float4(v[0], v[1], v[2], v[3]); }
  __device__ static void store(void* base, int64_t offset, const float (&v)[4]) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + offset) = make_float4(v[0], v[1], v[2], v[3]);
  }
  // The value a store followed by a load gives back.
  __device__ static float round_trip(float v) { return v; }
};

template <> struct Vec4<DType::kBFloat16> {
  using Raw = uint2;
  __device__ static Raw load(const void* base, int64_t offset) {
    return __ldg(reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + offset));
  }
  __device__ static void to_float(const Raw& r, float (&v)[4]) {
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __bfloat162float(h[i]);
  }
  // The same on the two whole words: read through a bf16 pointer as above, nvcc splits a shared-memory
  // uint2 load into four 16-bit loads (in the fold's B window LDS.U16 was the opcode after FFMA). Not
  // everywhere: at the 80-register budget it made the step kernels with a bf16 read copy spill 3x more
  // (the fold's callers choose: families/mamba2/fold.cuh).
  __device__ static void to_float_by_words(const Raw& r, float (&v)[4]) {
    v[0] = __uint_as_float(r.x << 16);  // bf16 -> fp32 is a shift
    v[1] = __uint_as_float(r.x & 0xffff0000u);
    v[2] = __uint_as_float(r.y << 16);
    v[3] = __uint_as_float(r.y & 0xffff0000u);
  }
  __device__ static Raw pack(const float (&v)[4]) {
    uint2 raw;
    __nv_bfloat162* h2 = reinterpret_cast<__nv_bfloat162*>(&raw);
    h2[0] = __floats2bfloat162_rn(v[0], v[1]);
    h2[1] = __floats2bfloat162_rn(v[2], v[3]);
    return raw;
  }
  __device__ static void store(void* base, int64_t offset, const float (&v)[4]) {
    uint2 raw;
    __nv_bfloat162* h2 = reinterpret_cast<__nv_bfloat162*>(&raw);
    h2[0] = __floats2bfloat162_rn(v[0], v[1]);
    h2[1] = __floats2bfloat162_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(base) + offset) = raw;
  }
  __device__ static float round_trip(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
};

template <> struct Vec4<DType::kFloat16> {
  using Raw = uint2;
  __device__ static Raw load(const void* base, int64_t offset) {
    return __ldg(reinterpret_cast<const uint2*>(static_cast<const __half*>(base) + offset));
  }
  __device__ static void to_float(const Raw& r, float (&v)[4]) {
    const __half* h = reinterpret_cast<const __half*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __half2float(h[i]);
  }
  __device__ static Raw pack(const float (&v)[4]) {
    uint2 raw;
    __half* h = reinterpret_cast<__half*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = from_float_fp16(v[i]);
    return raw;
  }
  __device__ static void store(void* base, int64_t offset, const float (&v)[4]) {
    uint2 raw;
    __half* h = reinterpret_cast<__half*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = from_float_fp16(v[i]);
    *reinterpret_cast<uint2*>(static_cast<__half*>(base) + offset) = raw;
  }
  __device__ static float round_trip(float v) { return __half2float(from_float_fp16(v)); }
};

template <> struct Vec4<DType::kFloat8E4M3> {
  using Raw = uint32_t;
  __device__ static Raw load(const void* base, int64_t offset) {
    return __ldg(reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(base) + offset));
  }
  __device__ static void to_float(const Raw& r, float (&v)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>((r >> (8 * i)) & 0xffu), __NV_E4M3);
      v[i] = __half2float(__half(h));
    }
  }
  // `v` must already be scaled (fp8_scaled); the conversion saturates.
  __device__ static Raw pack(const float (&v)[4]) { return pack_fp8x4_e4m3(v[0], v[1], v[2], v[3]); }
  __device__ static void store(void* base, int64_t offset, const float (&v)[4]) {
    *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(base) + offset) = pack(v);
  }
};

// One whole-vector global store per thread and row. Through plain C++ (Vec4::store) nvcc split the
// folds' float4 stores into four 4-byte stores and its 8-byte stores into 4- or 2-byte ones: four
// times the L2 store sectors for the checkpoint writes (72% of the fold's global store sectors were
// excess). Inline PTX keeps each store whole.
__device__ __forceinline__ void store_whole(void* p, const float4& v) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
__device__ __forceinline__ void store_whole(void* p, const uint2& v) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void store_whole(void* p, uint32_t v) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// store_whole with the streaming cache operator (st.global.cs: L2 lines allocated evict-first), for
// state written once that the next kernels do not read: its lines leave L2 before those that may still
// be used (the commit fold's checkpoint).
__device__ __forceinline__ void store_streaming(void* p, const float4& v) {
  asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ void store_streaming(void* p, const uint2& v) {
  asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void store_streaming(void* p, uint32_t v) {
  asm volatile("st.global.cs.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Vec4<T>::store, the same bits, as one store (kStreaming: store_streaming).
template <DType T, bool kStreaming = false>
__device__ __forceinline__ void store4(void* base, int64_t offset, const float (&v)[4]) {
  void* p = static_cast<unsigned char*>(base) + offset * dtype_size(T);
  if constexpr (kStreaming) {
    store_streaming(p, Vec4<T>::pack(v));
  } else {
    store_whole(p, Vec4<T>::pack(v));
  }
}

// ---- The replay source in 16-byte chunks ----------------------------------------------------------
// The replay read moves every storage type in 16-byte vectors: 4 fp32, 8 bf16/fp16 or 16 fp8
// elements per load (4 elements of any type per load would make an fp8 copy cost as many load
// instructions as an fp32 checkpoint).
template <DType T>
struct Chunk16 {
  static constexpr int kElems = 16 / dtype_size(T);
  __device__ static uint4 load(const void* base, int64_t offset) {
    return __ldg(reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(base) + offset * dtype_size(T)));
  }
  __device__ static void to_float(const uint4& raw, float (&v)[kElems]) {
    const uint32_t word[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (T == DType::kFloat32) {
        v[i] = __uint_as_float(word[i]);
      } else if constexpr (T == DType::kBFloat16) {
        v[2 * i] = __uint_as_float(word[i] << 16);  // bf16 -> fp32 is a shift
        v[2 * i + 1] = __uint_as_float(word[i] & 0xffff0000u);
      } else if constexpr (T == DType::kFloat16) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&word[i]));
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
      } else {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
              static_cast<__nv_fp8x2_storage_t>((word[i] >> (16 * k)) & 0xffffu), __NV_E4M3);
          const float2 f = __half22float2(__half2(h));
          v[4 * i + 2 * k] = f.x;
          v[4 * i + 2 * k + 1] = f.y;
        }
      }
    }
  }
};

// ---- activations: one element or 4 consecutive ones, any of bf16 / fp16 ----------------------------

template <DType T>
__device__ __forceinline__ float load_act(const void* base, int64_t offset) {
  using S = typename Storage<T>::type;
  return to_float(__ldg(static_cast<const S*>(base) + offset));
}

template <DType T>
__device__ __forceinline__ void store_act(void* base, int64_t offset, float v) {
  using S = typename Storage<T>::type;
  if constexpr (T == DType::kBFloat16) {
    static_cast<S*>(base)[offset] = __float2bfloat16_rn(v);
  } else {
    static_cast<S*>(base)[offset] = __float2half_rn(v);
  }
}

template <DType T>
__device__ __forceinline__ void load_act4(const void* base, int64_t offset, float (&v)[4]) {
  Vec4<T>::to_float(Vec4<T>::load(base, offset), v);
}

}  // namespace replayssm
