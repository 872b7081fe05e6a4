// The Mamba-2 variants this build compiles: one table that the launchers dispatch through
// (common/dispatch.h), the API checks and their messages read, tools/generate_instantiations.py writes
// the instantiation files from (instantiations/<op>_p<P>_n<N>.cu) and _C.capabilities() reports.
// Adding a row here is adding a variant; nothing else restates the list. Host-safe.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/dispatch.h"
#include "common/dtype.h"
#include "common/variants_table.h"

// ---- the tables (X-macros; one row a variant) ----

// (head_dim P, state_dim N): X(P, N). Every op compiles every shape (the step, verify and the fold one
// instantiation file each).
#define REPLAYSSM_MAMBA2_SHAPES(X) \
  X(64, 64)                        \
  X(64, 128)                       \
  X(80, 64)                        \
  X(80, 128)                       \
  X(128, 64)                       \
  X(128, 128)

// The shapes this build compiles: every row of the table above, or the subset a build names
// (REPLAYSSM_SHAPES: setup.py writes it into replayssm_shape_subset.h and defines REPLAYSSM_SHAPE_SUBSET).
// The dispatch, the API checks and _C.capabilities() read this list.
#if defined(REPLAYSSM_SHAPE_SUBSET)
#include "replayssm_shape_subset.h"
#endif
#ifndef REPLAYSSM_MAMBA2_COMPILED_SHAPES
#define REPLAYSSM_MAMBA2_COMPILED_SHAPES(X) REPLAYSSM_MAMBA2_SHAPES(X)
#endif

// Activations (x, B, C, z, out, the buffers): X(dtype).
#define REPLAYSSM_MAMBA2_ACTIVATION_DTYPES(X) \
  X(kBFloat16)                                \
  X(kFloat16)

// The conventional update's state (mamba2_update, mamba2_update_snapshots), with any activation dtype.
#define REPLAYSSM_MAMBA2_STATE_DTYPES(X) \
  X(kFloat32)                            \
  X(kBFloat16)                           \
  X(kFloat16)

// The replay ops' (step, verify, commit, flush, materialize) checkpoint and read copy, with any
// activation dtype: X(checkpoint, has a read copy, read copy). Without a copy the third value repeats
// the checkpoint (the kernels ignore it). A 16-bit checkpoint takes only an fp8 copy: a 16-bit copy of
// it would save no bytes.
#define REPLAYSSM_MAMBA2_REPLAY_PAIRS(X) \
  X(kFloat32, false, kFloat32)           \
  X(kFloat32, true, kBFloat16)           \
  X(kFloat32, true, kFloat16)            \
  X(kFloat32, true, kFloat8E4M3)         \
  X(kBFloat16, false, kBFloat16)         \
  X(kBFloat16, true, kFloat8E4M3)        \
  X(kFloat16, false, kFloat16)           \
  X(kFloat16, true, kFloat8E4M3)

namespace replayssm {
namespace mamba2 {

// ---- the tables as rows, and the queries over them (common/variants_table.h) ----

// The dispatch macros below name the keys and texts through this namespace.
using ::replayssm::replay_pair_key;
using ::replayssm::replay_pair_text;
using ::replayssm::shape_key;

inline constexpr ShapeRow kShapes[] = {REPLAYSSM_MAMBA2_COMPILED_SHAPES(REPLAYSSM_SHAPE_ROW)};  // (P, N)
inline constexpr DType kActivationDtypes[] = {REPLAYSSM_MAMBA2_ACTIVATION_DTYPES(REPLAYSSM_DTYPE_ROW)};
inline constexpr DType kStateDtypes[] = {REPLAYSSM_MAMBA2_STATE_DTYPES(REPLAYSSM_DTYPE_ROW)};
inline constexpr ReplayPairRow kReplayPairs[] = {REPLAYSSM_MAMBA2_REPLAY_PAIRS(REPLAYSSM_REPLAY_PAIR_ROW)};

// kVariants.shape_compiled(...), .shapes_text(), .activation_dtypes(), .read_copy_dtypes(checkpoint), ...
inline constexpr VariantsTable kVariants{kShapes, kActivationDtypes, kStateDtypes, kReplayPairs};

// The compiled lists in the dispatch macros' messages (below).
inline std::string shapes_text() { return kVariants.shapes_text(); }
inline std::string replay_pairs_text() { return kVariants.replay_pairs_text(); }

}  // namespace mamba2
}  // namespace replayssm

// ---- dispatch through the tables (common/dispatch.h): F gets each value as a std::integral_constant ----

// F(kP, kN).
#define REPLAYSSM_MAMBA2_SHAPE_CASE_(SP, SN)   \
  case ::replayssm::mamba2::shape_key(SP, SN): \
    return replayssm_dispatch_f(std::integral_constant<int, SP>{}, std::integral_constant<int, SN>{});
#define REPLAYSSM_MAMBA2_SHAPE_SWITCH(P, N, ...)                                                           \
  REPLAYSSM_TABLE_SWITCH(::replayssm::mamba2::shape_key(P, N), REPLAYSSM_MAMBA2_COMPILED_SHAPES,          \
                         REPLAYSSM_MAMBA2_SHAPE_CASE_,                                                    \
                         ::replayssm::unsupported("(head_dim, state_dim) = (" + std::to_string(P) + ", " + \
                                                      std::to_string(N) + ")",                            \
                                                  ::replayssm::mamba2::shapes_text()),                    \
                         __VA_ARGS__)

// F(kCheckpoint, kCopy, kReadCopy): DType, bool, DType.
#define REPLAYSSM_MAMBA2_REPLAY_PAIR_CASE_(CK, COPY, RD)                                                 \
  case ::replayssm::mamba2::replay_pair_key(::replayssm::DType::CK, COPY, ::replayssm::DType::RD):     \
    return replayssm_dispatch_f(std::integral_constant<::replayssm::DType, ::replayssm::DType::CK>{}, \
                                std::integral_constant<bool, COPY>{},                                   \
                                std::integral_constant<::replayssm::DType, ::replayssm::DType::RD>{});
#define REPLAYSSM_MAMBA2_REPLAY_PAIR_SWITCH(CKPT, COPY, READ, ...)                                           \
  REPLAYSSM_TABLE_SWITCH(::replayssm::mamba2::replay_pair_key(CKPT, COPY, READ),                            \
                         REPLAYSSM_MAMBA2_REPLAY_PAIRS, REPLAYSSM_MAMBA2_REPLAY_PAIR_CASE_,                 \
                         ::replayssm::unsupported("(checkpoint, read copy) = " +                             \
                                                      ::replayssm::mamba2::replay_pair_text(CKPT, COPY, READ), \
                                                  ::replayssm::mamba2::replay_pairs_text()),                \
                         __VA_ARGS__)

// F(kAct).
#define REPLAYSSM_MAMBA2_ACTIVATION_SWITCH(ACT, ...) \
  REPLAYSSM_DTYPE_SWITCH(ACT, "activation dtype", REPLAYSSM_MAMBA2_ACTIVATION_DTYPES, __VA_ARGS__)

// F(kState).
#define REPLAYSSM_MAMBA2_STATE_SWITCH(STATE, ...) \
  REPLAYSSM_DTYPE_SWITCH(STATE, "state dtype", REPLAYSSM_MAMBA2_STATE_DTYPES, __VA_ARGS__)
