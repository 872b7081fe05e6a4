// torch.ops.replayssm.make_read_copy: validate, fill ReadCopyParams, launch on the current stream.
//
//   tensor      shape                           dtype                      in/out
//   checkpoint  (num_slots, heads, rows, cols)  float32/bfloat16/float16   in; last dim contiguous
//   read_copy   same as checkpoint              bfloat16/float16/fp8-e4m3  out; last dim contiguous
//   read_scale  (num_slots, heads, rows)        float32                    out; fp8 read copies only
//   slots       (num_entries,) or None          int32/int64                in; None = every slot
//
// Entries of `slots` equal to pad_slot_id or outside [0, num_slots) are skipped; slots not named stay
// bit-identical. No allocation, no host synchronisation: safe under CUDA-graph capture.
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "api/checks.h"
#include "api/ops.h"
#include "kernels/read_copy.cuh"

namespace replayssm {
namespace {

constexpr const char* kOp = "make_read_copy";

DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    case at::kFloat8_e4m3fn: return DType::kFloat8E4M3;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    default: break;
  }
  TORCH_CHECK(false, kOp, ": internal error: no kernel dtype for ", checks::dtype_str(t));
}

}  // namespace

void make_read_copy(const at::Tensor& checkpoint, const at::Tensor& read_copy,
                    const std::optional<at::Tensor>& read_scale, const std::optional<at::Tensor>& slots,
                    int64_t pad_slot_id) {
  using checks::dtype_str;
  using checks::shape_str;

  checks::cuda(kOp, "checkpoint", checkpoint);
  TORCH_CHECK(checkpoint.dim() == 4, kOp, ": checkpoint must be 4-D (num_slots, heads, rows, cols), got ",
              checkpoint.dim(), "-D with shape ", shape_str(checkpoint.sizes()));
  const auto ck_dtype = checkpoint.scalar_type();
  TORCH_CHECK(ck_dtype == at::kFloat || ck_dtype == at::kBFloat16 || ck_dtype == at::kHalf, kOp,
              ": checkpoint must have dtype float32, bfloat16 or float16, got ", dtype_str(ck_dtype));
  const int64_t cols = checkpoint.size(3);
  TORCH_CHECK(cols >= 1 && cols <= kReadCopyMaxCols, kOp, ": checkpoint last dim (cols) must be in [1, ",
              kReadCopyMaxCols, "], got ", cols, " in shape ", shape_str(checkpoint.sizes()));
  checks::last_dim_contiguous(kOp, "checkpoint", checkpoint);

  checks::cuda(kOp, "read_copy", read_copy);
  checks::same_device(kOp, "read_copy", read_copy, "checkpoint", checkpoint);
  checks::same_shape(kOp, "read_copy", read_copy, "checkpoint", checkpoint.sizes());
  const auto rc_dtype = read_copy.scalar_type();
  TORCH_CHECK(rc_dtype == at::kBFloat16 || rc_dtype == at::kHalf || rc_dtype == at::kFloat8_e4m3fn, kOp,
              ": read_copy must have dtype bfloat16, float16 or float8_e4m3fn, got ", dtype_str(rc_dtype));
  checks::last_dim_contiguous(kOp, "read_copy", read_copy);
  checks::writable(kOp, "read_copy", read_copy);
  checks::no_overlap(kOp, "read_copy", read_copy, "checkpoint", checkpoint);

  const std::vector<int64_t> scale_shape{checkpoint.size(0), checkpoint.size(1), checkpoint.size(2)};
  const bool fp8 = rc_dtype == at::kFloat8_e4m3fn;
  if (fp8) {
    TORCH_CHECK(read_scale.has_value(), kOp,
                ": read_scale is required when read_copy is float8_e4m3fn (a float32 tensor of shape ",
                shape_str(scale_shape), "), got None");
    const at::Tensor& s = *read_scale;
    checks::cuda(kOp, "read_scale", s);
    checks::same_device(kOp, "read_scale", s, "checkpoint", checkpoint);
    TORCH_CHECK(s.sizes() == c10::IntArrayRef(scale_shape), kOp,
                ": read_scale must have shape (num_slots, heads, rows) = ", shape_str(scale_shape), ", got ",
                shape_str(s.sizes()));
    TORCH_CHECK(s.scalar_type() == at::kFloat, kOp, ": read_scale must have dtype float32, got ",
                dtype_str(s.scalar_type()));
    checks::writable(kOp, "read_scale", s);
    checks::no_overlap(kOp, "read_scale", s, "checkpoint", checkpoint);
    checks::no_overlap(kOp, "read_scale", s, "read_copy", read_copy);
  } else {
    TORCH_CHECK(!read_scale.has_value(), kOp, ": read_scale must be None when read_copy is ", dtype_str(rc_dtype),
                " (scales exist only for float8_e4m3fn read copies), got a tensor of shape ",
                shape_str(read_scale->sizes()));
  }

  if (slots.has_value()) {
    const at::Tensor& sl = *slots;
    checks::cuda(kOp, "slots", sl);
    checks::same_device(kOp, "slots", sl, "checkpoint", checkpoint);
    TORCH_CHECK(sl.dim() == 1, kOp, ": slots must be 1-D (num_entries,), got ", sl.dim(), "-D with shape ",
                shape_str(sl.sizes()));
    TORCH_CHECK(sl.scalar_type() == at::kInt || sl.scalar_type() == at::kLong, kOp,
                ": slots must have dtype int32 or int64, got ", dtype_str(sl.scalar_type()));
  }

  ReadCopyParams p{};
  p.checkpoint = checkpoint.data_ptr();
  p.read_copy = read_copy.data_ptr();
  p.read_scale = fp8 ? read_scale->data_ptr<float>() : nullptr;
  p.slots = slots.has_value() ? slots->data_ptr() : nullptr;
  p.checkpoint_dtype = to_dtype(ck_dtype);
  p.read_copy_dtype = to_dtype(rc_dtype);
  p.slots_dtype = slots.has_value() ? to_dtype(slots->scalar_type()) : DType::kInt64;
  p.num_slots = checkpoint.size(0);
  p.heads = checkpoint.size(1);
  p.rows = checkpoint.size(2);
  p.cols = cols;
  p.num_entries = slots.has_value() ? slots->size(0) : p.num_slots;
  p.pad_slot_id = pad_slot_id;
  p.checkpoint_slot_stride = checkpoint.stride(0);
  p.checkpoint_head_stride = checkpoint.stride(1);
  p.checkpoint_row_stride = checkpoint.stride(2);
  p.read_copy_slot_stride = read_copy.stride(0);
  p.read_copy_head_stride = read_copy.stride(1);
  p.read_copy_row_stride = read_copy.stride(2);
  if (fp8) {
    p.read_scale_slot_stride = read_scale->stride(0);
    p.read_scale_head_stride = read_scale->stride(1);
    p.read_scale_row_stride = read_scale->stride(2);
  }
  p.slots_stride = slots.has_value() ? slots->stride(0) : 1;

  const c10::cuda::CUDAGuard device_guard(checkpoint.device());
  const cudaError_t err = launch_make_read_copy(p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace replayssm
