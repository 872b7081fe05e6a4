// A fold's refresh of the read copy, shared by every fold that writes a checkpoint (a step's fused
// fold, commit / flush): bf16 / fp16 rounding, or fp8 with per-row scales, bitwise make_read_copy's rule
// (read_copy.cu). Params: any params struct with the read-copy fields (read_copy, rc_*_stride,
// read_scale, rs_*_stride).
#pragma once

#include <cstdint>

#include "common/convert.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace replayssm {

// A fold's read-copy refresh of the 4 values at (slot, head, row pr, columns col0..+3), made from the
// checkpoint as stored (`s` before its storage rounding; exactly make_read_copy's rule): bf16 / fp16
// round, fp8 scales by the row's max over its kLanes lanes (NaN kept), and the row's first lane writes
// the row's scale; one whole-vector store (store4). Params: Mamba2Params or Mamba2SpecParams (the same
// read-copy fields). The step's fold and the commit fold (fold_kernel.cuh) share it.
template <DType kCkpt, DType kRead, int kLanes, class Params>
__device__ __forceinline__ void store_read_copy4(const Params& p, int64_t slot, int head, int pr, int col0,
                                                 const float (&s)[4]) {
  float v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = Vec4<kCkpt>::round_trip(s[k]);
  const int64_t rc = slot * p.rc_slot_stride + head * p.rc_head_stride + pr * p.rc_row_stride + col0;
  if constexpr (kRead == DType::kFloat8E4M3) {
    uint32_t bits = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) bits = max(bits, abs_bits(v[k]));
    const float amax = __uint_as_float(row_max_bits<kLanes>(bits));
    const float inv = fp8_inverse_scale(amax);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = fp8_scaled(v[k], inv);
    if (threadIdx.x % kLanes == 0) p.read_scale[slot * p.rs_slot_stride + head * p.rs_head_stride + pr] = fp8_scale(amax);
  }
  store4<kRead>(p.read_copy, rc, v);
}

// store_read_copy4 for a thread that holds kBlocks 4-element blocks of the row (columns col_of(b) ..
// col_of(b) + 3, values s[b] before the checkpoint's storage rounding), the row over kLanes lanes
// kStride apart (reduce.cuh's row_sum; the writer of the scale is the row's lane 0): the
// fp8 row maximum is taken over all blocks of all the row's lanes, then each block is one whole-vector
// store. Bitwise make_read_copy's rule, as store_read_copy4. The stored values are rounded again per
// block rather than held for the whole row (registers: the callers keep whole tiles). Every lane of
// the warp calls it.
template <DType kCkpt, DType kRead, int kLanes, int kBlocks, int kStride = 1, class Params, class ColOf>
__device__ __forceinline__ void store_read_copy_blocks(const Params& p, int64_t slot, int head, int row, ColOf col_of,
                                                       const float (&s)[kBlocks][4]) {
  const int64_t rc = slot * p.rc_slot_stride + head * p.rc_head_stride + row * p.rc_row_stride;
  float inv = 1.0f;
  if constexpr (kRead == DType::kFloat8E4M3) {
    uint32_t bits = 0;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
      for (int k = 0; k < 4; ++k) bits = max(bits, abs_bits(Vec4<kCkpt>::round_trip(s[b][k])));
    }
    const float amax = __uint_as_float(row_max_bits<kLanes, kStride>(bits));
    inv = fp8_inverse_scale(amax);
    if (threadIdx.x / kStride % kLanes == 0) p.read_scale[slot * p.rs_slot_stride + head * p.rs_head_stride + row] = fp8_scale(amax);
  }
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) {
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = Vec4<kCkpt>::round_trip(s[b][k]);
      if constexpr (kRead == DType::kFloat8E4M3) v[k] = fp8_scaled(v[k], inv);
    }
    store4<kRead>(p.read_copy, rc + col_of(b), v);
  }
}

// The fp8 read copy of kRows rows of a thread (its 4 columns col0.. of rows row_of(q), values s[q]),
// bitwise what store_read_copy4 writes row by row, with the rows' maxima reduced together: a
// reduce-scatter over a row's kLanes lanes (reduce_scatter_rows) leaves row q's maximum in lanes
// q * kLanes / kRows onwards (kRows - 1 + log2(kLanes / kRows) shuffles instead of kRows log2(kLanes)),
// so one pair of correctly rounded divisions per lane serves all the rows, and the factors come back by
// shuffles. The order of a max changes no bit: it is exact, and a NaN maximum meets only the `> 0` test
// and the divisions.
template <DType kCkpt, int kLanes, int kRows, class Params, class RowOf>
__device__ __forceinline__ void store_fp8_copy_rows(const Params& p, int64_t slot, int head, RowOf row_of, int col0,
                                                    const float (&s)[kRows][4]) {
  static_assert(kRows == 2 || kRows == 4, "rows reduced together: 2 or 4");
  static_assert(kLanes >= 2 * kRows && kLanes <= 32, "a row's lanes split between the rows");
  constexpr int kSpan = kLanes / kRows;  // lanes holding one row's maximum after the scatter
  float v[kRows][4];
  uint32_t m[kRows];  // max|v| as bits (abs_bits)
#pragma unroll
  for (int q = 0; q < kRows; ++q) {
    m[q] = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[q][k] = Vec4<kCkpt>::round_trip(s[q][k]);
      m[q] = max(m[q], abs_bits(v[q][k]));
    }
  }
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const float amax = __uint_as_float(reduce_scatter_rows<kLanes, kRows>(m, MaxBitsOp{}));  // of row lane / kSpan
  const float inv = fp8_inverse_scale(amax);
  const int own = lane / kSpan;
  if (lane % kSpan == 0 && own < kRows) {
    p.read_scale[slot * p.rs_slot_stride + head * p.rs_head_stride + row_of(own)] = fp8_scale(amax);
  }
#pragma unroll
  for (int q = 0; q < kRows; ++q) {
    const float inv_q = __shfl_sync(0xffffffffu, inv, q * kSpan, kLanes);
    float w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = fp8_scaled(v[q][k], inv_q);
    store4<DType::kFloat8E4M3>(p.read_copy, slot * p.rc_slot_stride + head * p.rc_head_stride + row_of(q) * p.rc_row_stride + col0, w);
  }
}

}  // namespace replayssm
