// The replay read S C (a P x N source tile times the group's C vector) on tensor cores, one warp per
// 16 rows: mma.sync m16n8k16 with fp32 accumulation, C as the B operand (the same in all 8 columns).
// An fp32 source (the checkpoint of a step without a read copy, StepLayout's kTf32Replay; verify's
// fp32-source read) goes through the tf32 helpers further down (mma_m16n8k8_tf32, split_tf32).
//
// Why: with a bf16 or fp8 read copy the replay step moves so few bytes per head that the CUDA-core
// reduction (convert every element to fp32, one FFMA each, a shuffle tree per row) made it issue-bound:
// ncu of the fp8 step showed 3800 warp instructions per head and 2.6 issued per cycle per SM, at 44% of
// DRAM bandwidth. One mma covers 16 x 16 elements; an fp8 element costs half a conversion
// (fp8x2 -> f16x2) and nothing else.
//
// Exactness: every product is exact in fp32 (f16 x f16 or bf16 x bf16), sums are fp32 inside the
// tensor core. fp8 sources go through f16, which holds e4m3 exactly. With bf16 activations C is
// converted to f16 after scaling by a power of two that puts max|C| in [2^14, 2^15): exact for every
// element within 2^-24 of max|C| (bf16 has 8 significant bits, f16 11), and the result is scaled back
// exactly. bf16 and fp16 sources need C in their own type (the activations'), so a bf16 copy with fp16
// activations, or the reverse, keeps the CUDA-core reduction (tile_on_tensor_cores, common/mma.cuh).
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"): lane = 4 g + c holds A rows g and g + 8 at
// k = 2c, 2c + 1, 2c + 8, 2c + 9, and B rows k of the same set. Which physical column a logical k
// stands for is free, as long as A and B agree and every row uses the same map; here a lane's four
// k of a k-step are four consecutive columns of its own 16-byte load, so one 16-byte shared-memory
// load per row feeds 2 (16-bit) or 4 (fp8) k-steps, and C's fragment is the same columns of C.
#pragma once

#include "common/mma.cuh"
#include "families/mamba2/tile.cuh"

namespace replayssm {
namespace mamba2 {

// kSrc = fp32 (an fp32 checkpoint read without a copy): m16n8k8 tf32 mma, each element split into two
// tf32 parts (split_tf32) against C, which is tf32-exact (a bf16 or fp16 activation), so S C stays
// within 2^-21 of each fp32 product, summed in fp32: two mma per 8 columns.
template <int kN, DType kSrc, DType kAct>
struct TensorDot {
  static constexpr bool kTf32 = kSrc == DType::kFloat32;
  static_assert(tile_on_tensor_cores(kSrc, kAct) || kTf32, "no tensor-core form for this source / activation pair");
  using Act = typename Storage<kAct>::type;
  static constexpr bool kFp8 = kSrc == DType::kFloat8E4M3;
  static constexpr bool kBf16 = kSrc == DType::kBFloat16;  // the mma's input type; fp8 goes through f16
  static constexpr int kCRegs = kN / 8;                    // C as B fragments: 2 registers per k-step

  // C's B fragments live in shared memory (a register copy spilled the P = 80 kernels): lane c of a
  // quad reads words [c * kCStride, + kCRegs), two per k-step; the stride keeps the 4 lanes' 8-byte
  // reads of one k-step on different banks. Word 4 * kCStride: the factor that undoes C's scaling.
  // tf32: C itself as N floats (a lane's fragments are 4 consecutive columns, see dot), no scaling.
  static constexpr int kCStride = kCRegs + 2;
  static constexpr int kCWords = kTf32 ? kN : 4 * kCStride + 1;

  // Written by one whole warp (lanes 0..3 store; tf32: every lane, N / 32 columns each).
  __device__ static void write_c(const Act* C, uint32_t* cf) {
    const int lane = threadIdx.x & 31;
    if constexpr (kTf32) {
#pragma unroll
      for (int k = lane; k < kN; k += 32) cf[k] = __float_as_uint(to_float(C[k]));
    } else {
      const int c = lane & 3;
      uint32_t frag[kCRegs];
      float unscale = 1.0f;
      if constexpr (kFp8) {
        // Columns 64 h + 16 c .. + 15 feed k-steps 4 h .. 4 h + 3; frag[8 h + k] = columns 2k, 2k + 1 of those.
        constexpr int kH = kN / 64;
        float v[kH][16];
#pragma unroll
        for (int h = 0; h < kH; ++h) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float part[8];
            Chunk16<kAct>::to_float(Chunk16<kAct>::load(C, 64 * h + 16 * c + 8 * half), part);
#pragma unroll
            for (int e = 0; e < 8; ++e) v[h][8 * half + e] = part[e];
          }
        }
        float scale = 1.0f;
        if constexpr (kAct == DType::kBFloat16) {
          float amax = 0.0f;
#pragma unroll
          for (int h = 0; h < kH; ++h) {
#pragma unroll
            for (int e = 0; e < 16; ++e) amax = fmaxf(amax, fabsf(v[h][e]));
          }
          // The four lanes of a quad (c = 0..3) hold all N columns.
          amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
          amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
          const F16RangeScale range(amax);
          scale = range.scale;
          unscale = range.unscale;
        }
#pragma unroll
        for (int h = 0; h < kH; ++h) {
#pragma unroll
          for (int k = 0; k < 8; ++k) frag[8 * h + k] = floats_to_f16x2(v[h][2 * k] * scale, v[h][2 * k + 1] * scale);
        }
      } else {
        // Columns 32 h + 8 c .. + 7 feed k-steps 2 h, 2 h + 1: the raw 16-bit pairs, in order.
#pragma unroll
        for (int h = 0; h < kN / 32; ++h) {
          const uint4 raw = Chunk16<kAct>::load(C, 32 * h + 8 * c);
          frag[4 * h + 0] = raw.x;
          frag[4 * h + 1] = raw.y;
          frag[4 * h + 2] = raw.z;
          frag[4 * h + 3] = raw.w;
        }
      }
      if (lane < 4) {
#pragma unroll
        for (int k = 0; k < kCRegs; ++k) cf[c * kCStride + k] = frag[k];
        if (lane == 0) cf[4 * kCStride] = __float_as_uint(unscale);
      }
    }
  }

  __device__ static float c_unscale(const uint32_t* cf) {
    if constexpr (kTf32) {
      return 1.0f;
    } else {
      return __uint_as_float(cf[4 * kCStride]);
    }
  }

  // (S C) for rows row0 + g and row0 + g + 8 of the shared-memory tile (row-major, N elements a row),
  // before C's unscale. kFlip: the bank-conflict-free load order below (false: every lane loads the
  // parts in order; the step's two-group kernels take that, see step_kernel).
  template <bool kFlip = true>
  __device__ static void dot(const unsigned char* tile, int row0, const uint32_t* cf, float& y_g, float& y_g8) {
    const int g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3;
    const uint32_t* cfrag = cf + c * kCStride;
    constexpr int kRowBytes = kN * dtype_size(kSrc);
    const unsigned char* row_g = tile + (row0 + g) * kRowBytes + 16 * c;
    const unsigned char* row_g8 = row_g + 8 * kRowBytes;
    float acc[4] = {};
    constexpr int kLoads = kRowBytes / 64;  // 16-byte loads per lane and row
    // Rows g and g + 1 are a multiple of 128 bytes apart, so the same 64-byte part of both lies on the
    // same banks, and a 16-byte load is served 8 lanes (rows g, g + 1 of a quad pair) at a time: every
    // load of the tile would be a 2-way bank conflict (31.5% of the fp8 step's shared load wavefronts).
    // So the lanes of odd g load the two parts of a pair (h, h + 1) in the other
    // order, and a select gives each k-step its own part back: the mma order, and so every result bit,
    // stay as they were. (A row of one part, N = 64 fp8, has no conflict: rows g, g + 1 are 64 bytes apart.)
    constexpr bool kPairs = kFlip && kLoads % 2 == 0;
    const bool flip = kPairs && (g & 1);
    // Parts h0 and h0 + 1 of a row as loaded (first, second), and part h0 + dh of them.
    auto load_pair = [&](const unsigned char* row, int h0, uint4& first, uint4& second) {
      first = *reinterpret_cast<const uint4*>(row + 64 * (h0 + (flip ? 1 : 0)));
      second = *reinterpret_cast<const uint4*>(row + 64 * (h0 + (flip ? 0 : 1)));
    };
    auto part_of = [&](const uint4& first, const uint4& second, int dh) { return (dh == 0) != flip ? first : second; };
    if constexpr (kTf32) {
      // Lane c's load h of a row is columns 16 h + 4 c .. + 3: k = c and c + 4 of k-step 2 h (the first
      // two columns) and of k-step 2 h + 1 (the last two), as verify's fp32 read (PTX m16n8k8 .tf32
      // fragments: A (g, c), (g + 8, c), (g, c + 4), (g + 8, c + 4); B (k = c), (k = c + 4)). C's are the
      // same columns, one 16-byte load (the 4 lanes of a quad on different banks, the 8 quads broadcast).
      // hi and lo parts in accumulators of their own: two independent mma chains.
      float lo_acc[4] = {};
      const float* cvals = reinterpret_cast<const float*>(cf) + 4 * c;
      static_assert(kLoads % 2 == 0, "whole pairs of parts");
      uint4 v1, v2, u1, u2;  // the pair's parts as loaded (rows g, g + 8)
#pragma unroll
      for (int h = 0; h < kLoads; ++h) {
        if (h % 2 == 0) load_pair(row_g, h, v1, v2), load_pair(row_g8, h, u1, u2);
        const uint4 vr = part_of(v1, v2, h % 2), ur = part_of(u1, u2, h % 2);
        const float4 v = make_float4(__uint_as_float(vr.x), __uint_as_float(vr.y), __uint_as_float(vr.z), __uint_as_float(vr.w));
        const float4 u = make_float4(__uint_as_float(ur.x), __uint_as_float(ur.y), __uint_as_float(ur.z), __uint_as_float(ur.w));
        const uint4 cc = *reinterpret_cast<const uint4*>(cvals + 16 * h);
        const Tf32Pair a[2][4] = {{split_tf32(v.x), split_tf32(u.x), split_tf32(v.y), split_tf32(u.y)},
                                  {split_tf32(v.z), split_tf32(u.z), split_tf32(v.w), split_tf32(u.w)}};
        const uint32_t b[2][2] = {{cc.x, cc.y}, {cc.z, cc.w}};
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          mma_m16n8k8_tf32(acc, a[k][0].hi, a[k][1].hi, a[k][2].hi, a[k][3].hi, b[k][0], b[k][1]);
          mma_m16n8k8_tf32(lo_acc, a[k][0].lo, a[k][1].lo, a[k][2].lo, a[k][3].lo, b[k][0], b[k][1]);
        }
      }
      y_g = acc[0] + lo_acc[0];
      y_g8 = acc[2] + lo_acc[2];
    } else {
      uint4 a1, a2, b1, b2;  // the pair's parts as loaded (rows g, g + 8)
#pragma unroll
      for (int h = 0; h < kLoads; ++h) {
        uint4 ra, rb;
        if constexpr (kPairs) {
          if (h % 2 == 0) load_pair(row_g, h, a1, a2), load_pair(row_g8, h, b1, b2);
          ra = part_of(a1, a2, h % 2), rb = part_of(b1, b2, h % 2);
        } else {
          ra = *reinterpret_cast<const uint4*>(row_g + 64 * h);
          rb = *reinterpret_cast<const uint4*>(row_g8 + 64 * h);
        }
        const uint32_t wa[4] = {ra.x, ra.y, ra.z, ra.w};
        const uint32_t wb[4] = {rb.x, rb.y, rb.z, rb.w};
        if constexpr (kFp8) {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const uint2 b = *reinterpret_cast<const uint2*>(cfrag + 8 * h + 2 * q);
            mma_m16n8k16<false>(acc, fp8x2_to_f16x2(wa[q]), fp8x2_to_f16x2(wb[q]), fp8x2_to_f16x2(wa[q] >> 16),
                                fp8x2_to_f16x2(wb[q] >> 16), b.x, b.y);
          }
        } else {
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const uint2 b = *reinterpret_cast<const uint2*>(cfrag + 4 * h + 2 * q);
            mma_m16n8k16<kBf16>(acc, wa[2 * q], wb[2 * q], wa[2 * q + 1], wb[2 * q + 1], b.x, b.y);
          }
        }
      }
      y_g = acc[0];
      y_g8 = acc[2];
    }
  }
};


// ---- The replay's window term on tensor cores (bf16 activations) --------------------------------
// sum_{j<=w} wgt_j x_j[p] for 16 output rows p: one mma.m16n8k16 per 16 window entries, A = the x
// window (row p, k = entry j; the stage holds x_j as rows of P, so ldmatrix.trans reads A straight from
// it), B = the weights, each split exactly into three bf16 pieces (split_bf16x3) in B's columns 0, 1, 2;
// columns 3..7 are zero. Row p's term is then the sum of its first three accumulator columns.
//
// Why: the per-thread FFMA form (a 2-byte load, a select, an address and a conversion per entry and
// row) was ~25% of the consumer warps' instructions per head in the fp8 step, and those warps'
// instruction stream is what a head waits for there.
//
// Exactness: x is bf16 and every piece is bf16, so each product is exact in fp32; wgt_j = hi + mid + lo
// exactly (a finite fp32 weight of magnitude above ~2^-110; below that the lowest piece loses bits), so
// the term is the fp32 sum of the exact products wgt_j x_j, summed in fp32 inside the tensor core
// instead of by an FFMA chain. fp16 activations keep the FFMA form: three fp16 pieces would not hold
// every fp32 weight's range.
struct WindowMma {
  // A head's weights as B fragments, per k-step of 16 entries: columns n = 0..2, then for each lane c
  // of a quad its four k (entries 2c, 2c + 1, 2c + 8, 2c + 9: b0 then b1), 16 bits each.
  static constexpr int kKSteps = kMamba2MaxBufferLen / 16;
  static constexpr int kHalvesPerKStep = 3 * 16;
  static constexpr int kBytes = 2 * kKSteps * kHalvesPerKStep;  // one head's (one buffer)

  // Entry j's weight into the fragments f (the scalar warp: a lane per entry).
  __device__ static void write(uint16_t* f, int j, float wgt) {
    const int jj = j & 15;
    uint16_t* at = f + (j >> 4) * kHalvesPerKStep + 4 * ((jj & 7) >> 1) + (jj & 1) + 2 * (jj >> 3);
    const Bf16x3 v = split_bf16x3(wgt);
    at[0] = static_cast<uint16_t>(v.hi);
    at[16] = static_cast<uint16_t>(v.mid);
    at[32] = static_cast<uint16_t>(v.lo);
  }

  // This lane's B fragment of the k-step from entry k0 (zero in columns 3..7).
  __device__ static uint2 b_frag(const uint16_t* f, int k0) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    uint2 b = make_uint2(0u, 0u);
    if (g < 3) b = *reinterpret_cast<const uint2*>(f + (k0 >> 4) * kHalvesPerKStep + 16 * g + 4 * c);
    return b;
  }

  // The row address this lane gives ldmatrix for the A fragment of rows row0 .. row0 + 15 and entries
  // k0 .. k0 + 15 of the x window xw: matrix m = lane / 8 covers rows row0 + 8 (m & 1), entries
  // k0 + 8 (m >> 1) + lane % 8. Entry w (the current token) sits in slot L - 1, and so do the entries
  // past w (weight zero: a slot never written might hold a NaN).
  template <int kP, class Act>
  __device__ static const Act* a_row(const Act* xw, int k0, int w, int L, int row0) {
    const int lane = threadIdx.x & 31;
    const int m = lane >> 3;
    const int j = k0 + 8 * (m >> 1) + (lane & 7);
    return xw + (j < w ? j : L - 1) * kP + row0 + 8 * (m & 1);
  }

  // From the accumulators of one 16-row tile, row g + 8 c's window term in lanes c = 0, 1 of each quad
  // (lanes c = 2, 3 get zero): lane 0 holds columns 0, 1 of rows g, g + 8, lane 1 column 2 of them.
  __device__ static float row_term(const float (&acc)[4]) {
    const int c = threadIdx.x & 1;
    const float row_g = acc[0] + acc[1], row_g8 = acc[2] + acc[3];
    const float other = __shfl_xor_sync(0xffffffffu, c == 0 ? row_g8 : row_g, 1);
    return (c == 0 ? row_g : row_g8) + other;
  }
};

}  // namespace mamba2
}  // namespace replayssm
