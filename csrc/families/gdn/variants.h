// The Gated DeltaNet kernels compiled: one table per axis. The dispatch of every GDN launcher, the API
// checks (ops_api.cpp) and capabilities() read these tables; nothing restates them. Host-safe (no CUDA).
//
// Adding a variant is a row here (and, for a new (K, V), an instantiation file of the step).
#pragma once

#include <string>
#include <type_traits>

#include "common/dtype.h"

// (K, V): head_k_dim, head_v_dim.
#define REPLAYSSM_GDN_SHAPES(X) X(64, 64) X(64, 128) X(128, 64) X(128, 128)

// Activation dtypes: q, k, v, out and the k / v buffers.
#define REPLAYSSM_GDN_ACTIVATIONS(X) X(kBFloat16) X(kFloat16)

// State dtypes of the conventional update and its snapshot-writing variant.
#define REPLAYSSM_GDN_STATES(X) X(kFloat32) X(kBFloat16) X(kFloat16)

// (checkpoint, has a read copy, read copy) of the replay ops; READ repeats the checkpoint's dtype where
// there is no copy. A 16-bit checkpoint takes only an fp8 copy (a 16-bit copy of it would be itself).
#define REPLAYSSM_GDN_CACHES(X)                                                                        \
  X(kFloat32, false, kFloat32) X(kFloat32, true, kBFloat16) X(kFloat32, true, kFloat16)                \
  X(kFloat32, true, kFloat8E4M3) X(kBFloat16, false, kBFloat16) X(kBFloat16, true, kFloat8E4M3)        \
  X(kFloat16, false, kFloat16) X(kFloat16, true, kFloat8E4M3)

namespace replayssm {

namespace gdn {

template <int N>
using IntC = std::integral_constant<int, N>;
template <DType T>
using DTypeC = std::integral_constant<DType, T>;

// ---- membership ---------------------------------------------------------------------------------

constexpr bool shape_compiled(int K, int V) {
#define REPLAYSSM_GDN_X(k, v) \
  if (K == k && V == v) return true;
  REPLAYSSM_GDN_SHAPES(REPLAYSSM_GDN_X)
#undef REPLAYSSM_GDN_X
  return false;
}

constexpr bool activation_compiled(DType a) {
#define REPLAYSSM_GDN_X(t) \
  if (a == DType::t) return true;
  REPLAYSSM_GDN_ACTIVATIONS(REPLAYSSM_GDN_X)
#undef REPLAYSSM_GDN_X
  return false;
}

constexpr bool state_compiled(DType s) {
#define REPLAYSSM_GDN_X(t) \
  if (s == DType::t) return true;
  REPLAYSSM_GDN_STATES(REPLAYSSM_GDN_X)
#undef REPLAYSSM_GDN_X
  return false;
}

constexpr bool cache_compiled(DType checkpoint, bool copy, DType read_copy) {
#define REPLAYSSM_GDN_X(ck, cp, rc) \
  if (checkpoint == DType::ck && copy == cp && (!cp || read_copy == DType::rc)) return true;
  REPLAYSSM_GDN_CACHES(REPLAYSSM_GDN_X)
#undef REPLAYSSM_GDN_X
  return false;
}

// ---- dispatch: f called with the compile-time value of the matching row, else `missing` ---------

// f(IntC<K>, IntC<V>)
template <class R, class F>
R with_shape(int K, int V, R missing, F&& f) {
#define REPLAYSSM_GDN_X(k, v) \
  if (K == k && V == v) return f(IntC<k>{}, IntC<v>{});
  REPLAYSSM_GDN_SHAPES(REPLAYSSM_GDN_X)
#undef REPLAYSSM_GDN_X
  return missing;
}

// f(DTypeC<activation>)
template <class R, class F>
R with_activation(DType a, R missing, F&& f) {
#define REPLAYSSM_GDN_X(t) \
  if (a == DType::t) return f(DTypeC<DType::t>{});
  REPLAYSSM_GDN_ACTIVATIONS(REPLAYSSM_GDN_X)
#undef REPLAYSSM_GDN_X
  return missing;
}

// f(DTypeC<state>)
template <class R, class F>
R with_state(DType s, R missing, F&& f) {
#define REPLAYSSM_GDN_X(t) \
  if (s == DType::t) return f(DTypeC<DType::t>{});
  REPLAYSSM_GDN_STATES(REPLAYSSM_GDN_X)
#undef REPLAYSSM_GDN_X
  return missing;
}

// f(DTypeC<checkpoint>, std::bool_constant<has copy>, DTypeC<read copy>)
template <class R, class F>
R with_cache(DType checkpoint, bool copy, DType read_copy, R missing, F&& f) {
#define REPLAYSSM_GDN_X(ck, cp, rc)                                          \
  if (checkpoint == DType::ck && copy == cp && (!cp || read_copy == DType::rc)) \
    return f(DTypeC<DType::ck>{}, std::bool_constant<cp>{}, DTypeC<DType::rc>{});
  REPLAYSSM_GDN_CACHES(REPLAYSSM_GDN_X)
#undef REPLAYSSM_GDN_X
  return missing;
}

// ---- the tables in words, for messages ----------------------------------------------------------

// "(64, 64), (64, 128), ..."
inline std::string shape_list() {
  std::string out;
#define REPLAYSSM_GDN_X(k, v) out += (out.empty() ? "" : ", ") + std::string("(") + #k ", " #v ")";
  REPLAYSSM_GDN_SHAPES(REPLAYSSM_GDN_X)
#undef REPLAYSSM_GDN_X
  return out;
}

// The read copies a checkpoint of dtype `checkpoint` takes: "bfloat16, float16 or float8_e4m3fn".
inline std::string read_copy_list(DType checkpoint) {
  std::string out;
  int n = 0;
#define REPLAYSSM_GDN_X(ck, cp, rc) \
  if (cp && checkpoint == DType::ck) out += (n++ ? ", " : "") + std::string(dtype_name(DType::rc));
  REPLAYSSM_GDN_CACHES(REPLAYSSM_GDN_X)
#undef REPLAYSSM_GDN_X
  return out.empty() ? "none" : out;
}

}  // namespace gdn
}  // namespace replayssm
