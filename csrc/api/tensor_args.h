// Tensor arguments -> kernel params, shared by the API files: the dtype enum the kernels take, the
// one-call check of a tensor argument (device, shape, dtype, layout) with the message form of
// checks.h ("<op>: <argument> must <expectation>, got <what was given>"), and the filling of the
// per-token Mamba-2 inputs that several params structs share.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "api/checks.h"
#include "common/dtype.h"

namespace replayssm {

// The kernels' name for a dtype the checks already admitted; any other is a bug in the checks, and
// throws rather than reaching a kernel as another type.
inline DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    case at::kFloat8_e4m3fn: return DType::kFloat8E4M3;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    default: break;
  }
  TORCH_CHECK(false, checks::cat("replayssm: no kernel takes a tensor of dtype ", checks::dtype_str(t),
                                 " (float32, bfloat16, float16, float8_e4m3fn, int32 or int64)"));
}

// torch's name for a kernel dtype (the variants tables list DTypes).
inline at::ScalarType torch_dtype(DType t) {
  switch (t) {
    case DType::kFloat32: return at::kFloat;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kFloat16: return at::kHalf;
    case DType::kFloat8E4M3: return at::kFloat8_e4m3fn;
    case DType::kInt32: return at::kInt;
    case DType::kInt64: return at::kLong;
  }
  TORCH_CHECK(false, checks::cat("replayssm: unknown kernel dtype ", static_cast<int>(t)));
}

inline std::vector<at::ScalarType> torch_dtypes(const std::vector<DType>& dtypes) {
  std::vector<at::ScalarType> out;
  for (DType t : dtypes) out.push_back(torch_dtype(t));
  return out;
}

// One tensor argument: CUDA, on the device of `device_ref`, the expected shape (-1: any), one of
// `dtypes`, contiguous last dim, and (vector_bytes > 0) a base address and strides that keep every
// row start on a vector_bytes boundary, because the kernel moves vectors of that size.
struct Expect {
  const char* op;
  const at::Tensor& device_ref;
  const char* device_ref_name = "the first tensor argument";

  void operator()(const char* name, const at::Tensor& t, const std::vector<int64_t>& shape,
                  const std::vector<at::ScalarType>& dtypes, int vector_bytes = 0) const {
    checks::cuda(op, name, t);
    checks::same_device(op, name, t, device_ref_name, device_ref);
    bool shape_ok = t.dim() == static_cast<int64_t>(shape.size());
    for (size_t i = 0; shape_ok && i < shape.size(); ++i) shape_ok = shape[i] < 0 || shape[i] == t.size(i);
    if (!shape_ok) {
      std::string want = "(";
      for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + (shape[i] < 0 ? std::string("*") : std::to_string(shape[i]));
      TORCH_CHECK(false, checks::cat(op, ": ", name, " must have shape ", want, shape.size() == 1 ? ",)" : ")", ", got ", checks::shape_str(t.sizes())));
    }
    bool dtype_ok = false;
    std::string names;
    for (auto d : dtypes) {
      dtype_ok = dtype_ok || t.scalar_type() == d;
      names += (names.empty() ? "" : ", ") + checks::dtype_str(d);
    }
    TORCH_CHECK(dtype_ok, checks::cat(op, ": ", name, " must have dtype in {", names, "}, got ", checks::dtype_str(t.scalar_type())));
    checks::last_dim_contiguous(op, name, t);
    if (vector_bytes > 0) {
      const int64_t elems = vector_bytes / static_cast<int64_t>(t.element_size());
      bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % vector_bytes == 0;
      for (int64_t i = 0; ok && i + 1 < t.dim(); ++i) ok = t.size(i) == 1 || t.stride(i) % elems == 0;
      TORCH_CHECK(ok, checks::cat(op, ": ", name, " must start on a ", vector_bytes, "-byte boundary with every stride but the last a multiple of ", elems, " elements (the kernel moves ", vector_bytes, "-byte vectors), got strides ", checks::shape_str(t.strides())));
    }
  }
};

// The optional error word of verify and commit (cache/error_word.cuh): int32 (4,), written by the
// kernels; nullptr when not given.
inline int32_t* error_word_arg(const Expect& expect, const char* op, const std::optional<at::Tensor>& error_word) {
  if (!error_word) return nullptr;
  expect("error_word", *error_word, {4}, {at::kInt});
  checks::writable(op, "error_word", *error_word);
  return error_word->data_ptr<int32_t>();
}

// The per-(row, token) Mamba-2 inputs of a T-token op (verify, the snapshot step): x, z, out
// (batch, T, H, P), dt (batch, T, H), B, C (batch, T, G, N), and the per-head weights, into any params
// struct with these field names. The caller has checked every tensor.
template <class Params>
void fill_token_inputs(Params& p, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                       const at::Tensor& C, const at::Tensor& out, const std::optional<at::Tensor>& D,
                       const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias, bool dt_softplus) {
  p.act_dtype = kernel_dtype(x.scalar_type());
  p.x = x.data_ptr();
  p.x_row_stride = x.stride(0);
  p.x_token_stride = x.stride(1);
  p.x_head_stride = x.stride(2);
  p.dt = dt.data_ptr();
  p.dt_dtype = kernel_dtype(dt.scalar_type());
  p.dt_row_stride = dt.stride(0);
  p.dt_token_stride = dt.stride(1);
  p.dt_head_stride = dt.stride(2);
  p.B = B.data_ptr();
  p.B_row_stride = B.stride(0);
  p.B_token_stride = B.stride(1);
  p.B_group_stride = B.stride(2);
  p.C = C.data_ptr();
  p.C_row_stride = C.stride(0);
  p.C_token_stride = C.stride(1);
  p.C_group_stride = C.stride(2);
  p.z = z ? z->data_ptr() : nullptr;
  p.z_row_stride = z ? z->stride(0) : 0;
  p.z_token_stride = z ? z->stride(1) : 0;
  p.z_head_stride = z ? z->stride(2) : 0;
  p.out = out.data_ptr();
  p.out_row_stride = out.stride(0);
  p.out_token_stride = out.stride(1);
  p.out_head_stride = out.stride(2);
  p.A = A.data_ptr<float>();
  p.D = D ? D->data_ptr<float>() : nullptr;
  p.dt_bias = dt_bias ? dt_bias->data_ptr<float>() : nullptr;
  p.dt_softplus = dt_softplus;
}

}  // namespace replayssm
