// Run-time values -> compile-time template arguments, through the rows of an X-macro table (a family's
// variants.h). Host code. A value no row has is an error, never a default: the launcher returns
// cudaErrorInvalidValue (kernels cannot throw) after recording which value met no kernel and which are
// compiled, and the API layer turns that into an exception (unsupported_dispatch()).
//
//   return REPLAYSSM_DTYPE_SWITCH(p.act_dtype, "activation dtype", REPLAYSSM_MAMBA2_ACTIVATION_DTYPES,
//                                 [&](auto act) { return launch<decltype(act)::value>(p, stream); });
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include <cuda_runtime_api.h>

#include "common/dtype.h"
#include "common/variants_table.h"  // the rows' keys (shape_key, replay_pair_key) the switches use

namespace replayssm {

// What the last dispatch on this thread found no kernel for ("" when none failed since the last
// take_unsupported_dispatch()).
inline std::string& unsupported_dispatch() {
  thread_local std::string what;
  return what;
}

// Takes (and clears) the record of unsupported_dispatch().
inline std::string take_unsupported_dispatch() {
  std::string what;
  what.swap(unsupported_dispatch());
  return what;
}

// Records that `what` (e.g. "activation dtype float32") has no compiled kernel among `compiled`, and
// returns the launch error.
inline cudaError_t unsupported(const std::string& what, const std::string& compiled) {
  unsupported_dispatch() = what + " (compiled: " + compiled + ")";
  return cudaErrorInvalidValue;
}

}  // namespace replayssm

// The dispatch of one table: a switch over KEY whose cases (one per row, made by the CASE macro) call F
// (the last argument: a lambda, commas and all) with the row's values as std::integral_constant
// arguments; the default returns MISS.
#define REPLAYSSM_TABLE_SWITCH(KEY, TABLE, CASE, MISS, ...) \
  [&](auto&& replayssm_dispatch_f) -> cudaError_t {        \
    switch (KEY) {                                         \
      TABLE(CASE)                                          \
      default:                                             \
        return MISS;                                       \
    }                                                      \
  }(__VA_ARGS__)

// A table of dtypes, X(kName) a row: F(std::integral_constant<DType, DType::kName>).
#define REPLAYSSM_DTYPE_CASE_(NAME) \
  case ::replayssm::DType::NAME:    \
    return replayssm_dispatch_f(std::integral_constant<::replayssm::DType, ::replayssm::DType::NAME>{});
#define REPLAYSSM_DTYPE_NAME_(NAME) +(std::string(", ") + ::replayssm::dtype_name(::replayssm::DType::NAME))
#define REPLAYSSM_DTYPE_SWITCH(VALUE, WHAT, TABLE, ...)                                                   \
  REPLAYSSM_TABLE_SWITCH(VALUE, TABLE, REPLAYSSM_DTYPE_CASE_,                                             \
                         ::replayssm::unsupported(std::string(WHAT " ") + ::replayssm::dtype_name(VALUE), \
                                                  (std::string() TABLE(REPLAYSSM_DTYPE_NAME_)).substr(2)), \
                         __VA_ARGS__)
