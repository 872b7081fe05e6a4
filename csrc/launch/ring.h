// The shared memory of a kernel's ring of state tiles at each depth a plan may choose: what the ring
// rules of every family's plans (mamba2_policy.h, gdn_policy.h) take. Host-only C++.
#pragma once

#include <cstddef>

namespace replayssm {
namespace launch {

constexpr int kMaxRingStages = 8;

// Filled by a launcher from its kernel's layout.
struct RingBytes {
  int compiled_stages = 0;      // the depth the layout was sized for (the most a plan takes)
  int compiled_ctas_per_sm = 0;  // the CTAs per SM its launch bounds assume
  size_t dynamic_bytes[kMaxRingStages + 1] = {};  // dynamic shared memory at 1 .. compiled_stages stages
  size_t static_bytes = 0;      // static shared memory beside it
};

}  // namespace launch
}  // namespace replayssm
