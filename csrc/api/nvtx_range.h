// An NVTX range around every compiled op, named after it ("replayssm::mamba2_step"), in the NVTX domain
// "replayssm": nsys and ncu (--nvtx --nvtx-include "replayssm@*") then show which op a kernel belongs to,
// from C++ alone, whoever calls the op. NVTX 3 is header-only and costs a branch per call while no
// profiler is attached.
#pragma once

#include <utility>

#include <nvtx3/nvtx3.hpp>

namespace replayssm {

struct NvtxDomain {
  static constexpr char const* name{"replayssm"};
};

// Ranged<decltype(&f), &f, kName>::call has f's signature: it opens the range, calls f, and closes the
// range when f returns or throws.
template <class F, F f, const char* kName>
struct Ranged;

template <class... Args, void (*f)(Args...), const char* kName>
struct Ranged<void (*)(Args...), f, kName> {
  static void call(Args... args) {
    static const nvtx3::registered_string_in<NvtxDomain> message{kName};
    const nvtx3::scoped_range_in<NvtxDomain> range{message};
    f(std::forward<Args>(args)...);
  }
};

}  // namespace replayssm
