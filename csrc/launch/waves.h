// Family-free arithmetic of waves of CTAs, for every family's plan functions. Host-only C++.
#pragma once

#include <cstdint>

namespace replayssm {
namespace launch {

// CTAs the GPU holds at once (an occupancy of 0 counts as 1: the launch still runs, one CTA an SM).
inline int64_t resident_ctas(int sm_count, int ctas_per_sm) {
  return static_cast<int64_t>(sm_count) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
}

// The share of the CTA slots of their waves (rounded up to whole waves) that `ctas` CTAs use, in percent.
inline int64_t slots_used(int64_t ctas, int64_t resident) {
  return 100 * ctas / (((ctas + resident - 1) / resident) * resident);
}

// The largest divisor of n that is <= k (1 if k < 1).
inline int largest_divisor_at_most(int n, int k) {
  for (int d = k < n ? k : n; d > 1; --d) {
    if (n % d == 0) return d;
  }
  return 1;
}

}  // namespace launch
}  // namespace replayssm
