// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the constants of
// the Random123 library): a counter-based generator, so any thread can draw the random bits of any
// element directly from the element's coordinates, with no state to carry between launches.
// Host-safe: the same function compiles for the host and the kernels. replayssm_cuda/reference.py
// (philox4x32_10) is a bit-identical torch version; tests/test_stochastic_rounding.py checks it against
// the Random123 known-answer vectors.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define REPLAYSSM_HD __host__ __device__ __forceinline__
#else
#define REPLAYSSM_HD inline
#endif

namespace replayssm {

struct Philox4x32 {
  uint32_t v[4];
};

namespace philox_detail {

constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

REPLAYSSM_HD uint32_t mulhi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

}  // namespace philox_detail

// Ten rounds; the key is bumped by the Weyl constants between rounds (nine bumps).
REPLAYSSM_HD Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  using namespace philox_detail;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const uint32_t hi0 = mulhi(kMul0, c0), lo0 = kMul0 * c0;
    const uint32_t hi1 = mulhi(kMul1, c2), lo1 = kMul1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

}  // namespace replayssm
