// Device building blocks of the Mamba-2 speculative kernels (verify, fold). Copied from
// mamba2_tile.cuh / mamba2_step_kernel.cuh at 559725d (Vec4, the N/4-lanes tile, softplus, cp.async)
// into their own namespace, so the step kernel can be rewritten without changing these kernels'
// arithmetic; the fold must stay FFMA-for-FFMA the step's fold (mamba2_fold.cuh says how).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "mamba2_spec.cuh"

namespace replayssm {
namespace mamba2_spec {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;

// ---- 4-element state vectors (the fold's tile: a row over N/4 lanes, 4 elements each) ------------

template <DType T> struct Vec4;

template <> struct Vec4<DType::kFloat32> {
  using Raw = float4;
  __device__ static Raw load(const void* base, int64_t offset) {
    return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(base) + offset));
  }
  __device__ static void to_float(const Raw& r, float (&v)[4]) { v[0] = r.x; v[1] = r.y; v[2] = r.z; v[3] = r.w; }
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
  // `v` must already be scaled and clamped to +-448.
  __device__ static void store(void* base, int64_t offset, const float (&v)[4]) {
    uint32_t raw = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) raw |= static_cast<uint32_t>(from_float_fp8_e4m3(v[i])) << (8 * i);
    *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(base) + offset) = raw;
  }
};

// One element of any storage type as float (fp8-e4m3 through the exact half conversion).
template <DType T>
__device__ __forceinline__ float elem_to_float(typename Storage<T>::type e) {
  if constexpr (T == DType::kFloat8E4M3) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(e, __NV_E4M3)));
  } else {
    return to_float(e);
  }
}

// kE consecutive elements of a state row, loaded with the widest aligned vectors (16, 8 or 4 bytes)
// and kept raw, so every load of a thread can be in flight before the first is used.
template <DType T, int kE>
struct StateChunk {
  using S = typename Storage<T>::type;
  static constexpr int kBytes = kE * dtype_size(T);
  using Word = std::conditional_t<kBytes % 16 == 0, uint4, std::conditional_t<kBytes % 8 == 0, uint2, uint32_t>>;
  static constexpr int kWords = kBytes / static_cast<int>(sizeof(Word));
  static_assert(kBytes % 4 == 0, "a state chunk must be whole 4-byte words");
  Word word[kWords];

  __device__ void load(const void* base, int64_t offset) {
    const Word* src = reinterpret_cast<const Word*>(static_cast<const S*>(base) + offset);
#pragma unroll
    for (int k = 0; k < kWords; ++k) word[k] = __ldg(src + k);
  }
  __device__ void to_float(float (&v)[kE]) const {
    const S* e = reinterpret_cast<const S*>(word);
#pragma unroll
    for (int i = 0; i < kE; ++i) v[i] = elem_to_float<T>(e[i]);
  }
};

// 8 consecutive 16-bit activations at a 16-byte aligned address (shared or global) as floats.
template <class Act>
__device__ __forceinline__ void act8_to_float(const Act* p, float (&v)[8]) {
  static_assert(sizeof(Act) == 2, "16-bit activations expected");
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const Act* h = reinterpret_cast<const Act*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = to_float(h[i]);
}

template <class Act>
__device__ __forceinline__ void act4_to_float(const Act* p, float (&v)[4]) {
  static_assert(sizeof(Act) == 2, "16-bit activations expected");
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const Act* h = reinterpret_cast<const Act*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = to_float(h[i]);
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

// Sum / NaN-keeping max over the kLanes lanes that share a state row (an aligned group in the warp).
template <int kLanes>
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

template <int kLanes>
__device__ __forceinline__ float row_max_keep_nan(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) v = max_keep_nan(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// torch.nn.functional.softplus (beta 1, threshold 20) and silu, in fp32 without fast math.
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// One 16-byte global -> shared copy that completes asynchronously (cp.async, sm_80+): a thread can
// have all of its window copies in flight at once instead of one load latency per entry.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* global_src) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Slot of batch row `row`, or -1 when the row touches nothing (pad id or out of range).
__device__ __forceinline__ int64_t resolve_slot(const Mamba2SpecParams& p, int64_t row) {
  const int64_t slot = p.slots == nullptr ? row : load_index(p.slots, p.slots_dtype, row, p.slots_stride);
  return (slot == p.pad_slot_id || slot < 0 || slot >= p.num_slots) ? -1 : slot;
}

}  // namespace mamba2_spec
}  // namespace replayssm
