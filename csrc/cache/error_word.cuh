// The device-side error word of a cache: the first misuse an op detects, kept on the device until the
// host reads it (cache.check() in replayssm_cuda/cache.py). No op ever waits on it; an op given no word
// (nullptr) records nothing.
//
//   error_word  (4,) int32  [code, row, value, limit]; code 0: nothing recorded
//
// Codes (replayssm_cuda/cache.py ERROR_CODES says the same for the host):
//   kErrorVerifySlot     verify: row's slot id is neither in [0, num_slots) nor the pad id (value)
//   kErrorCommitSlot     commit: the same for a commit row
//   kErrorCommitAccepted commit: num_accepted (value) outside [0, num_verified[slot]] (limit); it was
//                        clamped there (cache/fold_rows.cuh)
// The first violation wins: a thread claims the word with atomicCAS on the code, then writes the rest,
// which the host reads after the launch.
#pragma once

#include <cstdint>

namespace replayssm {

constexpr int32_t kErrorVerifySlot = 1;
constexpr int32_t kErrorCommitSlot = 2;
constexpr int32_t kErrorCommitAccepted = 3;

__device__ __forceinline__ int32_t saturate_int32(int64_t v) {
  return v > INT32_MAX ? INT32_MAX : (v < INT32_MIN ? INT32_MIN : static_cast<int32_t>(v));
}

__device__ __forceinline__ void record_error(int32_t* word, int32_t code, int64_t row, int64_t value, int64_t limit) {
  if (word == nullptr) return;
  if (atomicCAS(word, 0, code) == 0) {
    word[1] = saturate_int32(row);
    word[2] = saturate_int32(value);
    word[3] = saturate_int32(limit);
  }
}

}  // namespace replayssm
