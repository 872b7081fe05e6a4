// The pieces of replayssm_cuda._C beside the torch ops, each registered by its own file into the
// module that registration.cpp creates.
#pragma once

#include <pybind11/pybind11.h>

namespace replayssm {

// _C.get_launch_overrides / set_launch_overrides / describe_launch_overrides (launch_api.cpp).
void register_launch_api(pybind11::module_& m);

// _C.capabilities (capabilities.cpp).
void register_capabilities(pybind11::module_& m);

}  // namespace replayssm
