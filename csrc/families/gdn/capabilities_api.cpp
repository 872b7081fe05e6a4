// The "gdn" and "kda" entries of _C.capabilities() (api/capabilities.h), read from the variants table:
// the keys of the "mamba2" entry, where shapes are the checkpoint's last two dims, [V, K] (head_v_dim,
// head_k_dim). KDA runs the same kernels (GdnGate::kVector), so it has the same facts.
#include <pybind11/pybind11.h>

#include "api/capabilities.h"
#include "families/gdn/params.h"
#include "families/gdn/variants.h"

namespace replayssm {

pybind11::dict gdn_capabilities() {
  pybind11::dict out = variants_capabilities(gdn::kVariants, /*checkpoint_dims_reversed=*/true);
  out["max_buffer_len"] = kGdnMaxBufferLen;
  out["max_draft_tokens"] = kGdnMaxDraftTokens;
  return out;
}

pybind11::dict kda_capabilities() { return gdn_capabilities(); }

}  // namespace replayssm
