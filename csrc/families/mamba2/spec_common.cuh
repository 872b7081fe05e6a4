// Device building blocks of the Mamba-2 speculative kernels (verify, fold). The pieces they share
// with the step kernel come from common/, cache/ and families/mamba2/tile.cuh; what is theirs alone is
// below.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/bulk_copy.cuh"
#include "common/convert.cuh"
#include "families/mamba2/spec_params.h"
#include "families/mamba2/tile.cuh"

namespace replayssm {
namespace mamba2_spec {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;

// 8 consecutive 16-bit activations at a 16-byte aligned address (shared or global) as floats.
template <class Act>
__device__ __forceinline__ void act8_to_float(const Act* p, float (&v)[8]) {
  static_assert(sizeof(Act) == 2, "16-bit activations expected");
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const Act* h = reinterpret_cast<const Act*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = to_float(h[i]);
}

}  // namespace mamba2_spec
}  // namespace replayssm
