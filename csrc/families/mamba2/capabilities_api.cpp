// The "mamba2" entry of _C.capabilities() (api/capabilities.h), read from the variants table.
#include <pybind11/pybind11.h>

#include "api/capabilities.h"
#include "families/mamba2/params.h"
#include "families/mamba2/spec_params.h"
#include "families/mamba2/variants.h"

namespace replayssm {

pybind11::dict mamba2_capabilities() {
  pybind11::dict out = variants_capabilities(mamba2::kVariants, /*checkpoint_dims_reversed=*/false);
  out["max_buffer_len"] = kMamba2MaxBufferLen;
  out["max_draft_tokens"] = kMamba2SpecMaxDraftTokens;
  return out;
}

}  // namespace replayssm
