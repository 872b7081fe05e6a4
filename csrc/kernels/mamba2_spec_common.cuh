// Device building blocks of the Mamba-2 speculative kernels (verify, fold). The pieces they share
// with the step kernel (Vec4, row reductions, softplus/silu, cp.async) come from mamba2_tile.cuh and
// bulk_copy.cuh; what is theirs alone is below. The fold must stay FFMA-for-FFMA the step's fold
// (mamba2_fold.cuh says how).
#pragma once

#include <cstdint>
#include <type_traits>

#include "bulk_copy.cuh"
#include "common.cuh"
#include "mamba2_spec.cuh"
#include "mamba2_tile.cuh"

namespace replayssm {
namespace mamba2_spec {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;
// Overrides the heads per CTA of verify: see mamba2::choose_heads_per_cta. Tests and benchmarks use it
// to run the pipelined multi-head path at any batch.
constexpr const char* kHeadsPerCtaKnob = "REPLAYSSM_SPEC_HEADS_PER_CTA";

// ---- shared with the step kernel (one definition: mamba2_tile.cuh, bulk_copy.cuh) -----------------

using mamba2::Vec4;       // 4-element state vectors: the fold's tile is a row over N/4 lanes
using mamba2::store4;     // ... stored as one whole vector (store_whole)
using mamba2::store_whole;
using mamba2::store_read_copy4;  // the fold's read-copy refresh, shared with the step's fold
using mamba2::row_sum;    // sum over the lanes of a state row
using mamba2::warp_inclusive_sum;  // the window's dt prefix sums
using mamba2::softplus;   // torch.nn.functional.softplus (beta 1, threshold 20), fp32, no fast math
using mamba2::silu;
using mamba2::gate;      // the output gate, silu with a fast division
using mamba2::store_act;
using mamba2::load_act;

// 8 consecutive 16-bit activations at a 16-byte aligned address (shared or global) as floats.
template <class Act>
__device__ __forceinline__ void act8_to_float(const Act* p, float (&v)[8]) {
  static_assert(sizeof(Act) == 2, "16-bit activations expected");
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const Act* h = reinterpret_cast<const Act*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = to_float(h[i]);
}

// Slot of batch row `row`, or -1 when the row touches nothing (pad id or out of range).
__device__ __forceinline__ int64_t resolve_slot(const Mamba2SpecParams& p, int64_t row) {
  const int64_t slot = p.slots == nullptr ? row : load_index(p.slots, p.slots_dtype, row, p.slots_stride);
  return (slot == p.pad_slot_id || slot < 0 || slot >= p.num_slots) ? -1 : slot;
}

}  // namespace mamba2_spec
}  // namespace replayssm
