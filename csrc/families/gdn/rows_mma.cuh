// The GDN replay's two row dots, S k and S q for every value row of a read-copy tile, on tensor cores
// (gdn_step's replay; gdn_verify's 2T dots of the drafts through dot_words, B then the drafts' keys and
// queries, an n-tile per 4 drafts):
// mma.sync m16n8k16 with fp32 accumulators, one warp per 16 rows, the tile as A and the token's raw key
// and query as B, the key in the even columns and the query in the odd ones, so that each lane ends
// with both dots of its rows g and g + 8 (D[g][2c] = S k, D[g][2c + 1] = S q).
//
// Why: with a bf16 or fp8 read copy the replay step moves so few bytes per head that the CUDA-core rows
// (convert every element to fp32, two FFMA each, a shuffle tree per row and dot) were a third of its
// instructions, and it is bound by issue and latency rather than by DRAM (ncu: the fp8 step issued in
// half its cycles at a third of the DRAM bandwidth, ~1,260 instructions a thread). One mma covers 16 x 16
// elements of both dots; an fp8 element costs half a conversion (fp8x2 -> f16x2) and nothing else.
//
// Exactness: B is the raw activation (bf16 or fp16), not k_hat or q_hat, so every product is exact in
// fp32 (f16 x f16 or bf16 x bf16) and sums are fp32 inside the tensor core; the key's l2 scale (and the
// query's with its scale) multiplies the dot once, after it: S k_hat = r_k (S k). An fp8 tile goes
// through f16, which holds e4m3 exactly; with bf16 activations B is converted to f16 after scaling by a
// power of two (F16RangeScale, exact for every element within 2^-24 of the vector's max), undone in the
// same multiplier. A 16-bit copy needs the activations' own type; a copy of the other 16-bit type keeps
// the CUDA-core rows (tile_on_tensor_cores, common/mma.cuh). The replay with a copy only makes outputs (the fold
// recomputes every u from the checkpoint), so the different rounding never reaches the checkpoint.
//
// The A fragments and the load order are those of Mamba-2's TensorDot::dot (families/mamba2/
// tensor_dot.cuh, which says why): a lane's four k of a k-step are four consecutive columns of its own
// 16-byte load of the row. The loop is written again here rather than shared: one source for both
// compiles the two families' kernels to different instruction orders, so sharing it waits for a GPU run.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/mma.cuh"

namespace replayssm {
namespace gdn {

template <int kK, DType kSrc, DType kAct>
struct RowsMma {
  static_assert(tile_on_tensor_cores(kSrc, kAct), "no tensor-core form for this source / activation pair");
  static constexpr bool kFp8 = kSrc == DType::kFloat8E4M3;
  static constexpr bool kBf16 = kSrc == DType::kBFloat16;  // the mma's input type; fp8 goes through f16
  // B scaled into f16's range: an fp8 tile with bf16 activations (fp16 activations are f16 already).
  static constexpr bool kScaleB = kFp8 && kAct == DType::kBFloat16;
  static constexpr int kRowBytes = kK * dtype_size(kSrc);
  static constexpr int kLoads = kRowBytes / 64;  // 16-byte loads per lane and row
  static constexpr int kKStepsPerLoad = kFp8 ? 4 : 2;
  static_assert(kRowBytes % 64 == 0, "a row is whole 64-byte parts (4 lanes x 16 bytes)");

  // B fragments in shared memory, two 32-bit words (b0, b1) a k-step: lane c of a quad reads words
  // [c kStride, + kK / 8) of the key (even g) or of the query (odd g, from kQueryBase). The strides
  // put the eight 8-byte reads of a k-step (4 lanes x 2 vectors) on different banks.
  static constexpr int kStride = kK / 8 + 2;
  static constexpr int kQueryBase = 4 * kStride + 8;
  static constexpr int kWords = kQueryBase + 4 * kStride;

  // The word holding columns col, col + 1 (col even) of a vector: its load part h, the quad lane c
  // whose load covers it and the pair's place in that load.
  __host__ __device__ static constexpr int word_of(int col) {
    return kFp8 ? ((col % 64) / 16) * kStride + 8 * (col / 64) + (col % 16) / 2
                : ((col % 32) / 8) * kStride + 4 * (col / 32) + (col % 8) / 2;
  }
  // Two activation values (exact in the mma's type, after any F16RangeScale) as one B word.
  __device__ static uint32_t pack(float lo, float hi) {
    if constexpr (kBf16) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<const uint32_t*>(&h);
    } else {
      return floats_to_f16x2(lo, hi);
    }
  }

  // acc = (S k, S q, S k, S q) of rows g, g, g + 8, g + 8 of the 16 rows at `rows` (the tile's rows,
  // kRowBytes apart), before the multipliers.
  __device__ static void dot(const unsigned char* rows, const uint32_t* frags, float (&acc)[4]) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    dot_words(rows, frags + ((g & 1) ? kQueryBase : 0) + c * kStride, acc);
  }
  // The same loop for any B: b_words = this lane's words (its column g's vector, quad lane c's part).
  __device__ static void dot_words(const unsigned char* rows, const uint32_t* b_words, float (&acc)[4]) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const unsigned char* row_g = rows + g * kRowBytes + 16 * c;
    const unsigned char* row_g8 = row_g + 8 * kRowBytes;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    // Rows g and g + 1 are a multiple of 128 bytes apart where a row is two or more parts, so the same
    // part of both lies on the same banks and a 16-byte load would be a 2-way conflict: the lanes of odd
    // g load the parts of a pair (h, h + 1) in the other order, and a select gives each k-step its own
    // part back (the mma order, so every bit, stays). One part a row (K = 64 fp8) has no conflict.
    constexpr bool kPairs = kLoads % 2 == 0;
    const bool flip = kPairs && (g & 1);
    uint4 a1, a2, b1, b2;
#pragma unroll
    for (int h = 0; h < kLoads; ++h) {
      uint4 ra, rb;
      if constexpr (kPairs) {
        if (h % 2 == 0) {
          a1 = *reinterpret_cast<const uint4*>(row_g + 64 * (h + (flip ? 1 : 0)));
          a2 = *reinterpret_cast<const uint4*>(row_g + 64 * (h + (flip ? 0 : 1)));
          b1 = *reinterpret_cast<const uint4*>(row_g8 + 64 * (h + (flip ? 1 : 0)));
          b2 = *reinterpret_cast<const uint4*>(row_g8 + 64 * (h + (flip ? 0 : 1)));
        }
        const bool first = (h % 2 == 0) != flip;
        ra = first ? a1 : a2;
        rb = first ? b1 : b2;
      } else {
        ra = *reinterpret_cast<const uint4*>(row_g + 64 * h);
        rb = *reinterpret_cast<const uint4*>(row_g8 + 64 * h);
      }
      const uint32_t wa[4] = {ra.x, ra.y, ra.z, ra.w};
      const uint32_t wb[4] = {rb.x, rb.y, rb.z, rb.w};
#pragma unroll
      for (int q = 0; q < kKStepsPerLoad; ++q) {
        const uint2 b = *reinterpret_cast<const uint2*>(b_words + kKStepsPerLoad * 2 * h + 2 * q);
        if constexpr (kFp8) {
          mma_m16n8k16<false>(acc, fp8x2_to_f16x2(wa[q]), fp8x2_to_f16x2(wb[q]), fp8x2_to_f16x2(wa[q] >> 16),
                              fp8x2_to_f16x2(wb[q] >> 16), b.x, b.y);
        } else {
          mma_m16n8k16<kBf16>(acc, wa[2 * q], wb[2 * q], wa[2 * q + 1], wb[2 * q + 1], b.x, b.y);
        }
      }
    }
  }
};

}  // namespace gdn
}  // namespace replayssm
