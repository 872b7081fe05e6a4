// The "mamba2" entry of _C.capabilities() (api/capabilities.h), read from the variants table.
#include <pybind11/pybind11.h>

#include "api/capabilities.h"
#include "families/mamba2/params.h"
#include "families/mamba2/spec_params.h"
#include "families/mamba2/variants.h"

namespace replayssm {

pybind11::dict mamba2_capabilities() {
  namespace py = pybind11;
  py::list shapes;
#define REPLAYSSM_MAMBA2_SHAPE_ENTRY_(P, N) shapes.append(py::list(py::make_tuple(P, N)));
  REPLAYSSM_MAMBA2_SHAPES(REPLAYSSM_MAMBA2_SHAPE_ENTRY_)
#undef REPLAYSSM_MAMBA2_SHAPE_ENTRY_
  auto names = [](const std::vector<DType>& dtypes) {
    py::list out;
    for (DType t : dtypes) out.append(dtype_name(t));
    return out;
  };
  py::list pairs;
#define REPLAYSSM_MAMBA2_PAIR_ENTRY_(CK, COPY, RD)                                                       \
  pairs.append(py::list(py::make_tuple(dtype_name(DType::CK),                                            \
                                       COPY ? py::object(py::str(dtype_name(DType::RD))) : py::none())));
  REPLAYSSM_MAMBA2_REPLAY_PAIRS(REPLAYSSM_MAMBA2_PAIR_ENTRY_)
#undef REPLAYSSM_MAMBA2_PAIR_ENTRY_
  py::dict out;
  out["shapes"] = shapes;
  out["activation_dtypes"] = names(mamba2::kVariants.activation_dtypes());
  out["update_checkpoint_dtypes"] = names(mamba2::kVariants.state_dtypes());
  out["checkpoint_read_copy"] = pairs;
  out["max_buffer_len"] = kMamba2MaxBufferLen;
  out["max_draft_tokens"] = kMamba2SpecMaxDraftTokens;
  return out;
}

}  // namespace replayssm
