// _C.capabilities(): what this build compiled, one entry per family (and one for the cache ops they
// share), each read from the family's variants table. A family adds its entry to kFamilies in
// capabilities.cpp and names its ops "<family>_*".
#pragma once

#include <vector>

#include <pybind11/pybind11.h>

#include "common/dtype.h"
#include "common/variants_table.h"

namespace replayssm {

// One family's facts beside its ops: shapes, dtypes, limits (families/<family>/capabilities_api.cpp).
using FamilyCapabilities = pybind11::dict (*)();

// The keys of a family's entry that its variants table (families/<family>/variants.h) answers: "shapes"
// (each row's two dims in the order of the checkpoint's last two dims: the table's order, or the reverse
// with `checkpoint_dims_reversed`), "activation_dtypes", "update_checkpoint_dtypes" (the conventional
// update's states) and "checkpoint_read_copy" ([checkpoint, read copy or None], a pair a row).
inline pybind11::dict variants_capabilities(const VariantsTable& variants, bool checkpoint_dims_reversed) {
  namespace py = pybind11;
  py::list shapes;
  for (const ShapeRow& s : variants.shapes) {
    shapes.append(checkpoint_dims_reversed ? py::list(py::make_tuple(s.b, s.a)) : py::list(py::make_tuple(s.a, s.b)));
  }
  auto names = [](const std::vector<DType>& dtypes) {
    py::list out;
    for (DType t : dtypes) out.append(dtype_name(t));
    return out;
  };
  py::list pairs;
  for (const ReplayPairRow& r : variants.replay_pairs) {
    pairs.append(py::list(py::make_tuple(dtype_name(r.checkpoint),
                                         r.copy ? py::object(py::str(dtype_name(r.read_copy))) : py::none())));
  }
  py::dict out;
  out["shapes"] = shapes;
  out["activation_dtypes"] = names(variants.activation_dtypes());
  out["update_checkpoint_dtypes"] = names(variants.state_dtypes());
  out["checkpoint_read_copy"] = pairs;
  return out;
}

pybind11::dict mamba2_capabilities();
pybind11::dict gdn_capabilities();
pybind11::dict kda_capabilities();  // GDN's kernels with the decay per key channel: gdn's facts, its own fold limits

}  // namespace replayssm
