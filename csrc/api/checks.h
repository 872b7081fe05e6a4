// Argument checks shared by the API layer. Every message has the form
//   "<op>: <argument> must <expectation>, got <what was given>"
// so a caller can tell which tensor is wrong and how.
//
// Messages are built with std::string and std::to_string only, never with iostreams (c10::str with
// numbers): on the H200 build machine an extension compiled with its /opt/gcc toolchain segfaulted
// the first time a check formatted an integer through an ostream, while string-only messages worked.
// Each check is its own inline function, so every throw comes from the same kind of frame.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include "common/dispatch.h"

namespace replayssm::checks {

inline std::string piece(const std::string& s) { return s; }
inline std::string piece(const char* s) { return s; }
inline std::string piece(int64_t v) { return std::to_string(v); }
inline std::string piece(int v) { return std::to_string(v); }

// Concatenates strings and integers into one message.
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::string out;
  ((out += piece(parts)), ...);
  return out;
}

inline std::string shape_str(c10::IntArrayRef sizes) {
  std::string out = "(";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + (sizes.size() == 1 ? ",)" : ")");
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

// "float32, bfloat16 or float16"
template <class Dtypes>
std::string dtype_list(const Dtypes& dtypes) {
  std::string out;
  size_t i = 0;
  for (at::ScalarType t : dtypes) {
    out += (i == 0 ? "" : (i + 1 == dtypes.size() ? " or " : ", ")) + dtype_str(t);
    ++i;
  }
  return out;
}

inline void cuda(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.is_cuda(), cat(op, ": ", name, " must be a CUDA tensor, got a tensor on ", t.device().str()));
}

inline void same_device(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                        const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), cat(op, ": ", name, " must be on the same device as ", ref_name, " (",
                                              ref.device().str(), "), got ", t.device().str()));
}

// layout names the dimensions, e.g. "(num_slots, heads, rows, cols)".
inline void dims(const char* op, const char* name, const at::Tensor& t, int64_t ndim, const char* layout) {
  TORCH_CHECK(t.dim() == ndim, cat(op, ": ", name, " must be ", ndim, "-D ", layout, ", got ", t.dim(),
                                   "-D with shape ", shape_str(t.sizes())));
}

// `allowed`: a braced list or a std::vector<at::ScalarType> (a variants table's dtypes).
template <class Dtypes>
void dtype_in(const char* op, const char* name, const at::Tensor& t, const Dtypes& allowed) {
  bool ok = false;
  for (at::ScalarType a : allowed) ok = ok || t.scalar_type() == a;
  TORCH_CHECK(ok, cat(op, ": ", name, " must have dtype ", dtype_list(allowed), ", got ", dtype_str(t.scalar_type())));
}
inline void dtype_in(const char* op, const char* name, const at::Tensor& t,
                     std::initializer_list<at::ScalarType> allowed) {
  dtype_in<std::initializer_list<at::ScalarType>>(op, name, t, allowed);
}

// An input of a replay op has the cache's activation dtype, that of its buffer `buffer` (e.g. "x_buf"):
// the message names the input that differs (checking the buffer against the input would blame the cache).
inline void cache_activation(const char* op, const char* name, const at::Tensor& t, const char* buffer,
                             at::ScalarType act) {
  TORCH_CHECK(t.scalar_type() == act, cat(op, ": ", name, " must have the cache's activation dtype (", buffer, "'s, ",
                                          dtype_str(act), "), got ", dtype_str(t.scalar_type())));
}

// what names the dimension, e.g. "last dim (cols)".
inline void size_in(const char* op, const char* name, const at::Tensor& t, int64_t dim, const char* what,
                    int64_t lo, int64_t hi) {
  const int64_t size = t.size(dim);
  TORCH_CHECK(size >= lo && size <= hi, cat(op, ": ", name, " ", what, " must be in [", lo, ", ", hi, "], got ",
                                            size, " in shape ", shape_str(t.sizes())));
}

inline void last_dim_contiguous(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1,
              cat(op, ": ", name, " must have a contiguous last dimension (stride 1), got strides ",
                  shape_str(t.strides()), " for shape ", shape_str(t.sizes())));
}

inline void same_shape(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                       c10::IntArrayRef expected) {
  TORCH_CHECK(t.sizes() == expected, cat(op, ": ", name, " must have the same shape as ", ref_name, " ",
                                         shape_str(expected), ", got ", shape_str(t.sizes())));
}

// layout names the dimensions, e.g. "(num_slots, heads, rows)".
inline void shape_is(const char* op, const char* name, const at::Tensor& t, const char* layout,
                     c10::IntArrayRef expected) {
  TORCH_CHECK(t.sizes() == expected, cat(op, ": ", name, " must have shape ", layout, " = ", shape_str(expected),
                                         ", got ", shape_str(t.sizes())));
}

// An optional argument that must be given; `expected` says what it must be.
inline void given(const char* op, const char* name, bool has_value, const std::string& when,
                  const std::string& expected) {
  TORCH_CHECK(has_value, cat(op, ": ", name, " is required when ", when, " (", expected, "), got None"));
}

// An optional argument that must be None; `why` says why.
inline void none(const char* op, const char* name, const std::optional<at::Tensor>& t, const std::string& when,
                 const std::string& why) {
  TORCH_CHECK(!t.has_value(), cat(op, ": ", name, " must be None when ", when, " (", why,
                                  "), got a tensor of shape ", t.has_value() ? shape_str(t->sizes()) : ""));
}

// Outputs must not write one element twice (expanded / stride-0 views) nor alias an input.
inline void writable(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes,
              cat(op, ": ", name, " must not have overlapping elements (e.g. an expanded view), got strides ",
                  shape_str(t.strides()), " for shape ", shape_str(t.sizes())));
}

inline void no_overlap(const char* op, const char* name, const at::Tensor& t, const char* other_name,
                       const at::Tensor& other) {
  const auto status = at::get_overlap_status(t, other);
  TORCH_CHECK(status != at::MemOverlapStatus::Full && status != at::MemOverlapStatus::Partial,
              cat(op, ": ", name, " must not share memory with ", other_name, ", got overlapping tensors"));
}

// A launcher's status: a variant no kernel was compiled for (the launcher's dispatch recorded which,
// common/dispatch.h) or a CUDA error.
inline void launched(const char* op, cudaError_t err) {
  const std::string unsupported = take_unsupported_dispatch();
  TORCH_CHECK(err != cudaErrorInvalidValue || unsupported.empty(), cat(op, ": no compiled kernel for ", unsupported));
  TORCH_CHECK(err == cudaSuccess, cat(op, ": CUDA kernel launch failed: ", cudaGetErrorString(err)));
}

}  // namespace replayssm::checks
