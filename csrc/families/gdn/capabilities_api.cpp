// The "gdn" entry of _C.capabilities() (api/capabilities.h), read from the variants table: the keys of
// the "mamba2" entry, where shapes are the checkpoint's last two dims, [V, K] (head_v_dim, head_k_dim).
#include <pybind11/pybind11.h>

#include "api/capabilities.h"
#include "families/gdn/params.h"
#include "families/gdn/variants.h"

namespace replayssm {

pybind11::dict gdn_capabilities() {
  namespace py = pybind11;
  py::list shapes;
#define REPLAYSSM_GDN_SHAPE_ENTRY_(K, V) shapes.append(py::list(py::make_tuple(V, K)));
  REPLAYSSM_GDN_SHAPES(REPLAYSSM_GDN_SHAPE_ENTRY_)
#undef REPLAYSSM_GDN_SHAPE_ENTRY_
  auto names = [](const std::vector<DType>& dtypes) {
    py::list out;
    for (DType t : dtypes) out.append(dtype_name(t));
    return out;
  };
  py::list pairs;
#define REPLAYSSM_GDN_PAIR_ENTRY_(CK, COPY, RD)                                                          \
  pairs.append(py::list(py::make_tuple(dtype_name(DType::CK),                                            \
                                       COPY ? py::object(py::str(dtype_name(DType::RD))) : py::none())));
  REPLAYSSM_GDN_REPLAY_PAIRS(REPLAYSSM_GDN_PAIR_ENTRY_)
#undef REPLAYSSM_GDN_PAIR_ENTRY_
  py::dict out;
  out["shapes"] = shapes;
  out["activation_dtypes"] = names(gdn::kVariants.activation_dtypes());
  out["update_checkpoint_dtypes"] = names(gdn::kVariants.state_dtypes());
  out["checkpoint_read_copy"] = pairs;
  out["max_buffer_len"] = kGdnMaxBufferLen;
  out["max_draft_tokens"] = kGdnMaxDraftTokens;
  return out;
}

}  // namespace replayssm
