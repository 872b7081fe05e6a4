// The Gated DeltaNet variants this build compiles: one table that the launchers dispatch through
// (common/dispatch.h), the API checks and their messages read (cache_args.h), tools/
// generate_instantiations.py writes the instantiation files from (instantiations/<op>_k<K>_v<V>.cu) and
// _C.capabilities() reports (capabilities_api.cpp). Adding a row here is adding a variant; nothing else
// restates the list. Host-safe.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/dispatch.h"
#include "common/dtype.h"
#include "common/variants_table.h"

// ---- the tables (X-macros; one row a variant) ----

// (head_k_dim K, head_v_dim V): X(K, V). The state of a v-head is [V, K] (K contiguous). Every op
// compiles every shape (the step, verify and the fold one instantiation file each).
#define REPLAYSSM_GDN_SHAPES(X) \
  X(64, 64)                     \
  X(64, 128)                    \
  X(128, 64)                    \
  X(128, 128)

// The shapes this build compiles: every row of the table above, or the subset a build names
// (REPLAYSSM_SHAPES: setup.py writes it into replayssm_shape_subset.h and defines REPLAYSSM_SHAPE_SUBSET).
// The dispatch, the API checks and _C.capabilities() read this list.
#if defined(REPLAYSSM_SHAPE_SUBSET)
#include "replayssm_shape_subset.h"
#endif
#ifndef REPLAYSSM_GDN_COMPILED_SHAPES
#define REPLAYSSM_GDN_COMPILED_SHAPES(X) REPLAYSSM_GDN_SHAPES(X)
#endif

// Activations (q, k, v, out, the k / v buffers): X(dtype).
#define REPLAYSSM_GDN_ACTIVATION_DTYPES(X) \
  X(kBFloat16)                             \
  X(kFloat16)

// The conventional update's state (gdn_update, gdn_update_snapshots), with any activation dtype.
#define REPLAYSSM_GDN_STATE_DTYPES(X) \
  X(kFloat32)                         \
  X(kBFloat16)                        \
  X(kFloat16)

// The replay ops' (step, verify, commit, flush, materialize) checkpoint and read copy, with any
// activation dtype: X(checkpoint, has a read copy, read copy). Without a copy the third value repeats
// the checkpoint (the kernels ignore it). A 16-bit checkpoint takes only an fp8 copy: a 16-bit copy of
// it would save no bytes.
#define REPLAYSSM_GDN_REPLAY_PAIRS(X) \
  X(kFloat32, false, kFloat32)        \
  X(kFloat32, true, kBFloat16)        \
  X(kFloat32, true, kFloat16)         \
  X(kFloat32, true, kFloat8E4M3)      \
  X(kBFloat16, false, kBFloat16)      \
  X(kBFloat16, true, kFloat8E4M3)     \
  X(kFloat16, false, kFloat16)        \
  X(kFloat16, true, kFloat8E4M3)

namespace replayssm {
namespace gdn {

// ---- the tables as rows, and the queries over them (common/variants_table.h) ----

inline constexpr ShapeRow kShapes[] = {REPLAYSSM_GDN_COMPILED_SHAPES(REPLAYSSM_SHAPE_ROW)};  // (K, V)
inline constexpr DType kActivationDtypes[] = {REPLAYSSM_GDN_ACTIVATION_DTYPES(REPLAYSSM_DTYPE_ROW)};
inline constexpr DType kStateDtypes[] = {REPLAYSSM_GDN_STATE_DTYPES(REPLAYSSM_DTYPE_ROW)};
inline constexpr ReplayPairRow kReplayPairs[] = {REPLAYSSM_GDN_REPLAY_PAIRS(REPLAYSSM_REPLAY_PAIR_ROW)};

// kVariants.shape_compiled(...), .shapes_text(), .activation_dtypes(), .read_copy_dtypes(checkpoint), ...
inline constexpr VariantsTable kVariants{kShapes, kActivationDtypes, kStateDtypes, kReplayPairs};

// The compiled lists in the dispatch macros' messages (below).
inline std::string shapes_text() { return kVariants.shapes_text(); }
inline std::string replay_pairs_text() { return kVariants.replay_pairs_text(); }

}  // namespace gdn
}  // namespace replayssm

// ---- dispatch through the tables (common/dispatch.h): F gets each value as a std::integral_constant ----

// F(kK, kV).
#define REPLAYSSM_GDN_SHAPE_CASE_(SK, SV) \
  case ::replayssm::shape_key(SK, SV):    \
    return replayssm_dispatch_f(std::integral_constant<int, SK>{}, std::integral_constant<int, SV>{});
#define REPLAYSSM_GDN_SHAPE_SWITCH(K, V, ...)                                                               \
  REPLAYSSM_TABLE_SWITCH(::replayssm::shape_key(K, V), REPLAYSSM_GDN_COMPILED_SHAPES,                       \
                         REPLAYSSM_GDN_SHAPE_CASE_,                                                         \
                         ::replayssm::unsupported("(head_k_dim, head_v_dim) = (" + std::to_string(K) + ", " + \
                                                      std::to_string(V) + ")",                              \
                                                  ::replayssm::gdn::shapes_text()),                         \
                         __VA_ARGS__)

// F(kCheckpoint, kCopy, kReadCopy): DType, bool, DType.
#define REPLAYSSM_GDN_REPLAY_PAIR_CASE_(CK, COPY, RD)                                                     \
  case ::replayssm::replay_pair_key(::replayssm::DType::CK, COPY, ::replayssm::DType::RD):               \
    return replayssm_dispatch_f(std::integral_constant<::replayssm::DType, ::replayssm::DType::CK>{}, \
                                std::integral_constant<bool, COPY>{},                                   \
                                std::integral_constant<::replayssm::DType, ::replayssm::DType::RD>{});
#define REPLAYSSM_GDN_REPLAY_PAIR_SWITCH(CKPT, COPY, READ, ...)                                          \
  REPLAYSSM_TABLE_SWITCH(::replayssm::replay_pair_key(CKPT, COPY, READ), REPLAYSSM_GDN_REPLAY_PAIRS,    \
                         REPLAYSSM_GDN_REPLAY_PAIR_CASE_,                                               \
                         ::replayssm::unsupported("(checkpoint, read copy) = " +                         \
                                                      ::replayssm::replay_pair_text(CKPT, COPY, READ),   \
                                                  ::replayssm::gdn::replay_pairs_text()),               \
                         __VA_ARGS__)

// F(kAct).
#define REPLAYSSM_GDN_ACTIVATION_SWITCH(ACT, ...) \
  REPLAYSSM_DTYPE_SWITCH(ACT, "activation dtype", REPLAYSSM_GDN_ACTIVATION_DTYPES, __VA_ARGS__)

// F(kState).
#define REPLAYSSM_GDN_STATE_SWITCH(STATE, ...) \
  REPLAYSSM_DTYPE_SWITCH(STATE, "state dtype", REPLAYSSM_GDN_STATE_DTYPES, __VA_ARGS__)
