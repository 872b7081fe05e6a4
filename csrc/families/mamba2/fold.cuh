// The fold's arithmetic, written once for the step's fused fold (step_kernel.cuh) and the fold of
// commit, flush and materialize (fold_kernel.cuh):
//   S = e^{Lambda} S_c + sum_j (wgt_j x_j) (outer) B_j
// over a head's window entries j, in fp32 FFMA: a state row covered by N/4 consecutive lanes, 4 columns
// each (TileShape), s *= decay, then per entry s += coef_j[row] * B_j[col] in entry order. That order
// is the contract: both kernels produce the same bits for the same inputs, and an fp32 checkpoint stays
// at fp32 rounding however many folds it sees. What a caller does with the folded rows (stores,
// stochastic rounding, the read-copy refresh, the output dots) stays with it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/vec.cuh"
#include "families/mamba2/tile.cuh"

namespace replayssm {
namespace mamba2 {

// ---- The fold's coefficients --------------------------------------------------------------------
// The fold adds coef_j[row] * B_j[col] over the window entries j, coef_j[row] = wgt_j x_j[row]. All
// kLanesPerRow lanes of a state row need the same coefficient, so the CTA computes each one once per
// head into shared memory (fp32), laid out [j][first_row][r] with r padded to a multiple of 4: a thread's
// batch of 4 rows (first_row + r * kRowsPerPass, r = r0 .. r0 + 3) is one 16-byte broadcast load.
// (Loading x_j[row], converting it and multiplying by wgt_j in every lane costs 3 instructions per
// (entry, row) per lane instead of a quarter of one.)
template <int kP, int kN>
struct FoldCoef {
  using Shape = TileShape<kP, kN>;
  static constexpr int kRowsPerThread = Shape::kRowsPerThread;
  static constexpr int kRowsPadded = (kRowsPerThread + 3) / 4 * 4;
  static constexpr int kPerEntry = Shape::kRowsPerPass * kRowsPadded;  // floats per window entry
  __host__ __device__ static constexpr size_t bytes(int L) { return sizeof(float) * static_cast<size_t>(L) * kPerEntry; }
  __device__ static int index(int j, int row) {
    return j * kPerEntry + (row % Shape::kRowsPerPass) * kRowsPadded + row / Shape::kRowsPerPass;
  }

  // Rows a thread folds together. Per window entry a batch costs one B vector (one load, 4 conversions)
  // and kBatch / 4 coefficient loads for 4 kBatch FFMA, so the larger the batch the more of the fold is
  // FFMA (at batches of 4 the P = 80 fp32 fold is issue-bound with 35% FFMA). The 4 accumulators a row
  // needs must fit what the CTAs per SM leave: 80 registers at three CTAs per SM keep batches of 4; 128
  // at two take a whole P = 80 tile's 10 rows, 255 at one P = 128's 16.
  // Batches are even (stochastic rounding draws rows in pairs) and start at multiples of 4 rows: all
  // of a thread's rows when they fit, else the largest multiple of 4 that does.
  static constexpr int batch_rows(int ctas_per_sm) {
    const int cap = ctas_per_sm >= 3 ? 4 : (ctas_per_sm == 2 ? 10 : 16);
    if (kRowsPerThread <= cap && kRowsPerThread % 2 == 0) return kRowsPerThread;
    return kRowsPerThread < 4 ? kRowsPerThread : cap / 4 * 4;
  }

  // The coefficients of rows r0 .. r0 + kBatch - 1 (r0 a multiple of 4; padded rows read as well) of one
  // window entry, from coef + index(j, row(r0)): 16-byte broadcast loads.
  template <int kBatch>
  __device__ static void load_batch(const float* entry_rows, float (&c)[(kBatch + 3) / 4 * 4]) {
#pragma unroll
    for (int q = 0; q < (kBatch + 3) / 4; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(entry_rows + 4 * q);
      c[4 * q] = v.x;
      c[4 * q + 1] = v.y;
      c[4 * q + 2] = v.z;
      c[4 * q + 3] = v.w;
    }
  }
};

// The operands of one window entry for a batch of rows: B_j's 4 columns and the batch's coefficients.
// The caller declares them beside the batch's accumulators: where they are declared moves ptxas's
// register allocation, and beside them is where both kernels had them when they were measured.
template <int kBatch>
struct FoldOperands {
  float b[4];                        // B_j[col0 .. col0 + 3]
  float coef[(kBatch + 3) / 4 * 4];  // coef_j of the batch's rows (FoldCoef::load_batch)
};

// B_j[col0 .. col0 + 3] of the fold's B window: fp32 (a window converted as it was staged), or the
// activations (kByWords: bf16 by whole words, Vec4<kBFloat16>::to_float_by_words, for kernels that have
// the registers for it; ptxas's spill report decides, see the callers).
template <DType kAct, bool kByWords, class BElem>
__device__ __forceinline__ void fold_B4(const BElem* B_row, float (&v)[4]) {
  if constexpr (std::is_same_v<BElem, float>) {
    const float4 b = *reinterpret_cast<const float4*>(B_row);
    v[0] = b.x, v[1] = b.y, v[2] = b.z, v[3] = b.w;
  } else {
    // A reference into shared memory, not a copy: a copy is one vector load, while the 16-bit
    // conversions through it load the halves one by one; kByWords chooses.
    const typename Vec4<kAct>::Raw& r = *reinterpret_cast<const typename Vec4<kAct>::Raw*>(B_row);
    if constexpr (kByWords && kAct == DType::kBFloat16) {
      Vec4<kAct>::to_float_by_words(r, v);
    } else {
      Vec4<kAct>::to_float(r, v);
    }
  }
}

// Rows r0 .. r0 + kBatch - 1 of this thread (those below kRowsPerThread; TileShape::row) folded into s:
//   s[rb] = decay * S_c[row] + sum_{j < entries} coef_j[row] B_j[col0 .. col0 + 3]
// S_c: the head's checkpoint tile in shared memory (kCkpt, row-major, N elements a row); coef: the
// head's coefficients (FoldCoef); B_window: its B rows, N elements apart (fp32 or the activations:
// fold_B4); o: the caller's FoldOperands.
template <int kP, int kN, DType kCkpt, DType kAct, int kBatch, bool kBByWords, class BElem>
__device__ __forceinline__ void fold_rows(float (&s)[kBatch][4], FoldOperands<kBatch>& o, const unsigned char* ck_tile,
                                          int r0, float decay, const float* coef, const BElem* B_window, int entries) {
  using Shape = TileShape<kP, kN>;
  using Coef = FoldCoef<kP, kN>;
  using V = Vec4<kCkpt>;
  constexpr int R = Shape::kRowsPerThread;
  constexpr int kCkBytes = dtype_size(kCkpt);
  const int col0 = Shape::col0();
#pragma unroll
  for (int rb = 0; rb < kBatch; ++rb) {
    const int r = r0 + rb;
    if (r >= R) break;
    V::to_float(*reinterpret_cast<const typename V::Raw*>(ck_tile + (Shape::row(r) * kN + col0) * kCkBytes), s[rb]);
#pragma unroll
    for (int k = 0; k < 4; ++k) s[rb][k] *= decay;
  }
  const float* coef_rows = coef + Coef::index(0, Shape::row(r0));  // this batch's rows of entry 0
  for (int j = 0; j < entries; ++j) {
    fold_B4<kAct, kBByWords>(B_window + j * kN + col0, o.b);
    Coef::template load_batch<kBatch>(coef_rows + j * Coef::kPerEntry, o.coef);
#pragma unroll
    for (int rb = 0; rb < kBatch; ++rb) {
      if (r0 + rb >= R) break;
#pragma unroll
      for (int k = 0; k < 4; ++k) s[rb][k] += o.coef[rb] * o.b[k];
    }
  }
}

}  // namespace mamba2
}  // namespace replayssm
