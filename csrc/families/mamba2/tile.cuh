// Device building blocks of the Mamba-2 kernels: how a CTA of 256 threads covers one head's (P, N)
// state tile, the fold's coefficient layout, the per-row epilogue, and dt.
//
// Thread mapping: a state row (N elements) is covered by N/4 consecutive lanes holding 4 elements
// each (32 lanes for N=128, 16 for N=64); the CTA covers 256/(N/4) rows per pass and each thread
// keeps kRowsPerThread rows in registers. All of a thread's state loads are issued before any is
// used, so a CTA has P*N*sizeof(state) bytes in flight.
#pragma once

#include <cstdint>

#include "cache/cursor.cuh"
#include "cache/read_copy_store.cuh"
#include "cache/slot_map.cuh"
#include "common/convert.cuh"
#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "families/mamba2/params.h"

namespace replayssm {
namespace mamba2 {

constexpr int kThreads = 256;
constexpr int kVec = 4;

template <int kP, int kN>
struct TileShape {
  static constexpr int P = kP;
  static constexpr int N = kN;
  static constexpr int kLanesPerRow = kN / kVec;
  static constexpr int kRowsPerPass = kThreads / kLanesPerRow;
  static constexpr int kRowsPerThread = kP / kRowsPerPass;
  static_assert(kN == 64 || kN == 128, "state_dim must be 64 or 128");
  static_assert(kLanesPerRow <= 32 && 32 % kLanesPerRow == 0, "a state row must sit inside one warp");
  static_assert(kP % kRowsPerPass == 0, "head_dim must be a multiple of the rows one pass covers");

  __device__ static int lane_in_row() { return threadIdx.x % kLanesPerRow; }
  __device__ static int first_row() { return threadIdx.x / kLanesPerRow; }
  __device__ static int row(int r) { return first_row() + r * kRowsPerPass; }
  __device__ static int col0() { return lane_in_row() * kVec; }
};

// ---- The fold's coefficients --------------------------------------------------------------------
// The fold adds coef_j[row] * B_j[col] over the window entries j, coef_j[row] = wgt_j x_j[row]. All
// kLanesPerRow lanes of a state row need the same coefficient, so the CTA computes each one once per
// head into shared memory (fp32), laid out [j][first_row][r] with r padded to a multiple of 4: a thread's
// batch of 4 rows (first_row + r * kRowsPerPass, r = r0 .. r0 + 3) is one 16-byte broadcast load.
// (Each lane used to load x_j[row], convert it and multiply by wgt_j itself: 3 instructions per
// (entry, row) per lane instead of a quarter of one.) The step's fold and the commit fold
// (mamba2_fold.cuh) both use it, so they stay FFMA for FFMA the same.
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
  // FFMA: ncu of the P = 80 fp32 fold (batches of 4) counted 35% FFMA and found it issue-bound. The 4
  // accumulators a row needs must fit what the CTAs per SM leave: 80 registers at three CTAs per SM
  // keep batches of 4; 128 at two take a whole P = 80 tile's 10 rows, 255 at one P = 128's 16.
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


__device__ __forceinline__ float load_dt(const Mamba2Params& p, int row, int head) {
  const int64_t off = row * p.dt_row_stride + head * p.dt_head_stride;
  float dt;
  switch (p.dt_dtype) {
    case DType::kFloat32: dt = __ldg(static_cast<const float*>(p.dt) + off); break;
    case DType::kBFloat16: dt = load_act<DType::kBFloat16>(p.dt, off); break;
    default: dt = load_act<DType::kFloat16>(p.dt, off); break;
  }
  if (p.dt_bias != nullptr) dt += __ldg(p.dt_bias + head);
  return p.dt_softplus ? softplus(dt) : dt;
}

// Whether a step with cursor w (w < L buffered entries) folds (cache/cursor.cuh): the step and its order
// pass decide it alike.
__device__ __forceinline__ bool step_folds(const Mamba2Params& p, int w, int L) {
  return folds_after_append(w, p.max_draft_tokens, L);
}

// The epilogue operands of a thread's rows, loaded up front with the state so that no global load
// sits between a row's reduction and its output store.
template <int R>
struct RowEpilogue {
  float gate[R];  // silu(z), or 1 without a gate
  float skip;     // D, or 0
  template <DType kAct, class Shape>
  __device__ void load(const Mamba2Params& p, int row, int head) {
    const int64_t z_base = row * p.z_row_stride + head * p.z_head_stride;
#pragma unroll
    for (int r = 0; r < R; ++r) gate[r] = p.z != nullptr ? load_act<kAct>(p.z, z_base + Shape::row(r)) : 0.0f;
    skip = p.D != nullptr ? __ldg(p.D + head) : 0.0f;
  }
  // y + D x, times silu(z): stored as row pr of the output.
  template <DType kAct>
  __device__ void store(const Mamba2Params& p, int row, int head, int r, int pr, float y, float x) const {
    y += skip * x;
    if (p.z != nullptr) y *= silu(gate[r]);
    store_act<kAct>(p.out, row * p.out_row_stride + head * p.out_head_stride + pr, y);
  }
};

// Zero output for a row that touches nothing.
template <DType kAct>
__device__ __forceinline__ void write_zero_output(const Mamba2Params& p, int row, int head) {
  for (int pr = threadIdx.x; pr < p.head_dim; pr += blockDim.x) {
    store_act<kAct>(p.out, row * p.out_row_stride + head * p.out_head_stride + pr, 0.0f);
  }
}

}  // namespace mamba2
}  // namespace replayssm
