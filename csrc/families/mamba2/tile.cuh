// Device building blocks of the Mamba-2 kernels: how a CTA of 256 threads covers one head's (P, N)
// state tile, dt, the fold decision and the zero output of a row that touches nothing.
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

// Zero output for a row that touches nothing.
template <DType kAct>
__device__ __forceinline__ void write_zero_output(const Mamba2Params& p, int row, int head) {
  for (int pr = threadIdx.x; pr < p.head_dim; pr += blockDim.x) {
    store_act<kAct>(p.out, row * p.out_row_stride + head * p.out_head_stride + pr, 0.0f);
  }
}

}  // namespace mamba2
}  // namespace replayssm
