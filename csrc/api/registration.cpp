// Registers the CUDA kernels of the ops in api/ops.h with torch.library and exposes build facts, the
// launch overrides and the capabilities to Python.
//
// The schemas of torch.ops.replayssm.* are defined in Python (replayssm_cuda/_schemas.py, through
// replayssm_cuda/_library.py), so that a pure-Python install has the same ops, with the checked PyTorch
// reference as their CPU kernel (and their CUDA kernel where none is compiled). Importing
// replayssm_cuda._C adds the CUDA kernels below; the dispatcher prefers them to the reference on CUDA
// tensors. REPLAYSSM_CUDA_OPS keeps each compiled op's schema text, which tests/test_library.py checks
// against the Python definitions.
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include "api/nvtx_range.h"
#include "api/ops.h"
#include "api/python_api.h"

#define REPLAYSSM_STR_(x) #x
#define REPLAYSSM_STR(x) REPLAYSSM_STR_(x)

// Each op's NVTX range name (api/nvtx_range.h), with the static storage a template argument needs.
namespace replayssm::nvtx_names {
#define REPLAYSSM_NVTX_NAME(name, schema) constexpr char name[] = "replayssm::" #name;
REPLAYSSM_CUDA_OPS(REPLAYSSM_NVTX_NAME)
#undef REPLAYSSM_NVTX_NAME
}  // namespace replayssm::nvtx_names

TORCH_LIBRARY_IMPL(replayssm, CUDA, m) {
#define REPLAYSSM_IMPL(name, schema) \
  m.impl(#name, &replayssm::Ranged<decltype(&replayssm::name), &replayssm::name, replayssm::nvtx_names::name>::call);
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
  m.def(
      "slot_table",
      [](const std::vector<at::Tensor>& cache_tensors, const std::vector<double>& fill_values,
         const std::vector<int64_t>& fill_periods) {
        return replayssm::slot_table(cache_tensors, fill_values, fill_periods);
      },
      "the device table of fill_slots_table / copy_slots_table for these cache tensors (built once: it validates "
      "them and copies the table to their device)",
      pybind11::arg("cache_tensors"), pybind11::arg("fill_values"), pybind11::arg("fill_periods"));
  m.def(
      "mamba2_layer_table",
      [](const std::vector<at::Tensor>& checkpoints, const std::vector<at::Tensor>& read_copies,
         const std::vector<at::Tensor>& read_scales, const std::vector<at::Tensor>& x_bufs,
         const std::vector<at::Tensor>& B_bufs, const std::vector<at::Tensor>& dt_bufs,
         const std::vector<at::Tensor>& num_committed, const std::vector<at::Tensor>& num_verified,
         const std::vector<at::Tensor>& A, const std::vector<at::Tensor>& rounding_seeds,
         const std::vector<at::Tensor>& error_words) {
        return replayssm::mamba2_layer_table(checkpoints, read_copies, read_scales, x_bufs, B_bufs, dt_bufs,
                                             num_committed, num_verified, A, rounding_seeds, error_words);
      },
      "the device table of the mamba2_*_layers ops for these layers' cache tensors (built once: it validates them "
      "and copies the layers' pointers to their device)",
      pybind11::arg("checkpoints"), pybind11::arg("read_copies"), pybind11::arg("read_scales"), pybind11::arg("x_bufs"),
      pybind11::arg("B_bufs"), pybind11::arg("dt_bufs"), pybind11::arg("num_committed"),
      pybind11::arg("num_verified"), pybind11::arg("A"), pybind11::arg("rounding_seeds"),
      pybind11::arg("error_words"));
  m.def(
      "gdn_layer_table",
      [](const std::vector<at::Tensor>& checkpoints, const std::vector<at::Tensor>& read_copies,
         const std::vector<at::Tensor>& read_scales, const std::vector<at::Tensor>& k_bufs,
         const std::vector<at::Tensor>& v_bufs, const std::vector<at::Tensor>& g_bufs,
         const std::vector<at::Tensor>& beta_bufs, const std::vector<at::Tensor>& u_bufs,
         const std::vector<at::Tensor>& num_committed, const std::vector<at::Tensor>& num_verified,
         const std::vector<at::Tensor>& error_words) {
        return replayssm::gdn_layer_table(checkpoints, read_copies, read_scales, k_bufs, v_bufs, g_bufs, beta_bufs,
                                          u_bufs, num_committed, num_verified, error_words);
      },
      "the device table of the gdn_*_layers ops for these layers' cache tensors (built once: it validates them "
      "and copies the layers' pointers to their device)",
      pybind11::arg("checkpoints"), pybind11::arg("read_copies"), pybind11::arg("read_scales"), pybind11::arg("k_bufs"),
      pybind11::arg("v_bufs"), pybind11::arg("g_bufs"), pybind11::arg("beta_bufs"), pybind11::arg("u_bufs"),
      pybind11::arg("num_committed"), pybind11::arg("num_verified"), pybind11::arg("error_words"));
  replayssm::register_launch_api(m);
  replayssm::register_capabilities(m);
}
