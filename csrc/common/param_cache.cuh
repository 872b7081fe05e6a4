// Kernel parameters live in a constant bank, and a CTA's first read of each of its lines misses the SM's
// constant cache; along a kernel's set-up those misses come one after another. warm_param_cache asks for
// every 32-byte line of the parameter block at once (a lane a line, results unused), so the misses
// overlap. Parameters are not global memory: the reads may come before the PDL wait.
#pragma once

#include <cstdint>

namespace replayssm {

// p: a __grid_constant__ kernel parameter (its address is then the parameter space's, not a local copy).
// Called by the lanes of one warp.
template <class Params>
__device__ __forceinline__ void warm_param_cache(const Params& p) {
  constexpr int kLine = 32;
  constexpr int kLines = static_cast<int>((sizeof(Params) + kLine - 1) / kLine);
  static_assert(kLines <= 32, "a lane a line");
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (lane < kLines) {
    uint32_t word;
    asm volatile("{\n\t.reg .u64 a;\n\tcvta.to.param.u64 a, %1;\n\tld.param.u32 %0, [a];\n\t}"
                 : "=r"(word)
                 : "l"(reinterpret_cast<const unsigned char*>(&p) + lane * kLine));
  }
}

}  // namespace replayssm
