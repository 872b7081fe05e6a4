// The "gdn" and "kda" entries of _C.capabilities() (api/capabilities.h), read from the variants table:
// the keys of the "mamba2" entry, where shapes are the checkpoint's last two dims, [V, K] (head_v_dim,
// head_k_dim), and "fold_max_buffer_len". KDA runs the same kernels (GdnGate::kVector), so it has the
// same facts but the fold's buffer limit.
#include <pybind11/pybind11.h>

#include "api/capabilities.h"
#include "families/gdn/params.h"
#include "families/gdn/variants.h"

namespace replayssm {
namespace {

namespace py = pybind11;

// "fold_max_buffer_len": [V, K, checkpoint dtype, L] for each compiled shape and checkpoint dtype where
// the fold (commit, flush, materialize) takes buffers of at most L < max_buffer_len entries
// (gdn_fold_max_buffer_len, params.h).
py::dict family_capabilities(GdnGate gate) {
  py::dict out = variants_capabilities(gdn::kVariants, /*checkpoint_dims_reversed=*/true);
  out["max_buffer_len"] = kGdnMaxBufferLen;
  out["max_draft_tokens"] = kGdnMaxDraftTokens;
  py::list fold_limits;
  for (const ShapeRow& s : gdn::kVariants.shapes) {  // (K, V)
    for (DType checkpoint : gdn::kVariants.checkpoint_dtypes()) {
      const int L = gdn_fold_max_buffer_len(gate, s.a, s.b, checkpoint);
      if (L < kGdnMaxBufferLen) fold_limits.append(py::list(py::make_tuple(s.b, s.a, dtype_name(checkpoint), L)));
    }
  }
  out["fold_max_buffer_len"] = fold_limits;
  return out;
}

}  // namespace

pybind11::dict gdn_capabilities() { return family_capabilities(GdnGate::kScalar); }

pybind11::dict kda_capabilities() { return family_capabilities(GdnGate::kVector); }

}  // namespace replayssm
