// _C.capabilities(): what this build compiled, one entry per family (and one for the cache ops they
// share), each read from the family's variants table. A family adds its entry to kFamilies in
// capabilities.cpp and names its ops "<family>_*".
#pragma once

#include <pybind11/pybind11.h>

namespace replayssm {

// One family's facts beside its ops: shapes, dtypes, limits (families/<family>/capabilities_api.cpp).
using FamilyCapabilities = pybind11::dict (*)();

pybind11::dict mamba2_capabilities();
pybind11::dict gdn_capabilities();

}  // namespace replayssm
