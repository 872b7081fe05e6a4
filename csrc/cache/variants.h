// The dtypes of the cache ops every family shares: the checkpoints make_read_copy and load convert from
// and the read copies they write. read_copy.cu and slot_ops.cu dispatch through these tables
// (common/dispatch.h), the API checks (api/read_copy_api.cpp, api/slot_ops_api.cpp) read them and
// _C.capabilities()["cache"] reports them. The families' replay ops pair checkpoints and read copies in
// their own tables (families/<family>/variants.h), each a subset of these. Host-safe.
#pragma once

#include <vector>

#include "common/dispatch.h"
#include "common/dtype.h"
#include "common/variants_table.h"

// Checkpoints: X(dtype). load also takes float32 states for any of them.
#define REPLAYSSM_CACHE_CHECKPOINT_DTYPES(X) \
  X(kFloat32)                                \
  X(kBFloat16)                               \
  X(kFloat16)

// Read copies: X(dtype); an fp8 copy has an fp32 scale per row.
#define REPLAYSSM_CACHE_READ_COPY_DTYPES(X) \
  X(kBFloat16)                              \
  X(kFloat16)                               \
  X(kFloat8E4M3)

namespace replayssm {
namespace cache {

inline constexpr DType kCheckpointDtypes[] = {REPLAYSSM_CACHE_CHECKPOINT_DTYPES(REPLAYSSM_DTYPE_ROW)};
inline constexpr DType kReadCopyDtypes[] = {REPLAYSSM_CACHE_READ_COPY_DTYPES(REPLAYSSM_DTYPE_ROW)};

inline std::vector<DType> checkpoint_dtypes() { return table_dtypes(kCheckpointDtypes); }
inline std::vector<DType> read_copy_dtypes() { return table_dtypes(kReadCopyDtypes); }

}  // namespace cache
}  // namespace replayssm
