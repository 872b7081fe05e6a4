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
#include <vector>

#include <cuda_runtime_api.h>

#include "common/dtype.h"

namespace replayssm {

// ---- keys of the variants tables' rows (families/<family>/variants.h), for the switches below ----

// A shape row (two dims, each < 2^31).
constexpr int64_t shape_key(int64_t a, int64_t b) { return (a << 32) | static_cast<uint32_t>(b); }

// A (checkpoint, read copy) row; without a copy the read copy's dtype is ignored.
constexpr int64_t replay_pair_key(DType checkpoint, bool copy, DType read_copy) {
  return (static_cast<int64_t>(checkpoint) << 33) | (static_cast<int64_t>(copy) << 32) |
         static_cast<uint32_t>(copy ? read_copy : checkpoint);
}

// "(checkpoint, read copy) = (float32, none)"'s value part: "(float32, none)".
inline std::string replay_pair_text(DType checkpoint, bool copy, DType read_copy) {
  return std::string("(") + dtype_name(checkpoint) + ", " + (copy ? dtype_name(read_copy) : "none") + ")";
}

// Appends t to a table's dtype list unless it is there (the lists keep table order, each dtype once).
inline void add_dtype_once(std::vector<DType>& list, DType t) {
  for (DType u : list) {
    if (u == t) return;
  }
  list.push_back(t);
}

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
