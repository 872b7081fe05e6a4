// Registers the ops of api/ops.h with torch.library and exposes build facts, the launch overrides and
// the capabilities to Python.
//
// Importing replayssm_cuda._C runs the TORCH_LIBRARY blocks below, which define torch.ops.replayssm.*
// and attach the CUDA kernels.
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include "api/ops.h"
#include "api/python_api.h"

#define REPLAYSSM_STR_(x) #x
#define REPLAYSSM_STR(x) REPLAYSSM_STR_(x)

TORCH_LIBRARY(replayssm, m) {
#define REPLAYSSM_DEFINE(name, schema) m.def(schema);
  REPLAYSSM_CUDA_OPS(REPLAYSSM_DEFINE)
#undef REPLAYSSM_DEFINE
}

TORCH_LIBRARY_IMPL(replayssm, CUDA, m) {
#define REPLAYSSM_IMPL(name, schema) m.impl(#name, &replayssm::name);
  REPLAYSSM_CUDA_OPS(REPLAYSSM_IMPL)
#undef REPLAYSSM_IMPL
}

// CPU tensors reach the same entry points, whose first check fails with "<op>: <argument> must be a
// CUDA tensor, got a tensor on cpu" instead of the dispatcher's "could not run ... 'CPU' backend".
TORCH_LIBRARY_IMPL(replayssm, CPU, m) {
#define REPLAYSSM_IMPL(name, schema) m.impl(#name, &replayssm::name);
  REPLAYSSM_CUDA_OPS(REPLAYSSM_IMPL)
#undef REPLAYSSM_IMPL
}

namespace {

std::vector<std::string> compiled_ops() {
#define REPLAYSSM_NAME(name, schema) #name,
  return {REPLAYSSM_CUDA_OPS(REPLAYSSM_NAME)};
#undef REPLAYSSM_NAME
}

// setup.py passes the archs as one preprocessor token, "90a_100a" (a ';' would not survive the shell
// that runs the compiler), and the version as "0.1.0".
std::string compiled_archs() {
#ifdef REPLAYSSM_CUDA_ARCHS
  std::string archs = REPLAYSSM_STR(REPLAYSSM_CUDA_ARCHS);
  for (char& c : archs) {
    if (c == '_') c = ';';
  }
  return archs;
#else
  return "unknown";
#endif
}

pybind11::dict build_info() {
  pybind11::dict info;
#ifdef REPLAYSSM_VERSION
  info["version"] = REPLAYSSM_STR(REPLAYSSM_VERSION);
#else
  info["version"] = "unknown";
#endif
  info["cuda_version"] = std::to_string(CUDART_VERSION);
  info["archs"] = compiled_archs();
  return info;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "replayssm_cuda compiled ops (torch.ops.replayssm.*) and build facts";
  m.def("build_info", &build_info, "dict(version, cuda_version, archs) of this build");
  m.def("compiled_ops", &compiled_ops, "names of the torch.ops.replayssm ops that have a CUDA kernel");
  replayssm::register_launch_api(m);
  replayssm::register_capabilities(m);
}
