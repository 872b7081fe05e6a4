// Argument checks shared by the API layer. Every message has the form
//   "<op>: <argument> must <expectation>, got <what was given>"
// so a caller can tell which tensor is wrong and how.
#pragma once

#include <sstream>
#include <string>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace replayssm::checks {

inline std::string shape_str(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << sizes[i];
  out << (sizes.size() == 1 ? ",)" : ")");
  return out.str();
}

// torch's Python spelling (torch.float32, ...), which is what the caller wrote.
inline std::string dtype_str(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kFloat8_e4m3fn: return "float8_e4m3fn";
    case at::kFloat8_e5m2: return "float8_e5m2";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

inline void cuda(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got a tensor on ", t.device().str());
}

inline void same_device(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                        const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " must be on the same device as ", ref_name, " (",
              ref.device().str(), "), got ", t.device().str());
}

inline void last_dim_contiguous(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, ": ", name,
              " must have a contiguous last dimension (stride 1), got strides ", shape_str(t.strides()),
              " for shape ", shape_str(t.sizes()));
}

inline void same_shape(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                       c10::IntArrayRef expected) {
  TORCH_CHECK(t.sizes() == expected, op, ": ", name, " must have the same shape as ", ref_name, " ",
              shape_str(expected), ", got ", shape_str(t.sizes()));
}

// Outputs must not write one element twice (expanded / stride-0 views) nor alias an input.
inline void writable(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, op, ": ", name,
              " must not have overlapping elements (e.g. an expanded view), got strides ", shape_str(t.strides()),
              " for shape ", shape_str(t.sizes()));
}

inline void no_overlap(const char* op, const char* name, const at::Tensor& t, const char* other_name,
                       const at::Tensor& other) {
  const auto status = at::get_overlap_status(t, other);
  TORCH_CHECK(status != at::MemOverlapStatus::Full && status != at::MemOverlapStatus::Partial, op, ": ", name,
              " must not share memory with ", other_name, ", got overlapping tensors");
}

}  // namespace replayssm::checks
