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
#include "api/tensor_args.h"
#include "cache/read_copy.cuh"
#include "cache/variants.h"

namespace replayssm {
namespace {

constexpr const char* kOp = "make_read_copy";

}  // namespace

void make_read_copy(const at::Tensor& checkpoint, const at::Tensor& read_copy,
                    const std::optional<at::Tensor>& read_scale, const std::optional<at::Tensor>& slots,
                    int64_t pad_slot_id) {
  checks::cuda(kOp, "checkpoint", checkpoint);
  checks::dims(kOp, "checkpoint", checkpoint, 4, "(num_slots, heads, rows, cols)");
  checks::dtype_in(kOp, "checkpoint", checkpoint, torch_dtypes(cache::checkpoint_dtypes()));
  checks::size_in(kOp, "checkpoint", checkpoint, 3, "last dim (cols)", 1, kReadCopyMaxCols);
  checks::last_dim_contiguous(kOp, "checkpoint", checkpoint);

  checks::cuda(kOp, "read_copy", read_copy);
  checks::same_device(kOp, "read_copy", read_copy, "checkpoint", checkpoint);
  checks::same_shape(kOp, "read_copy", read_copy, "checkpoint", checkpoint.sizes());
  checks::dtype_in(kOp, "read_copy", read_copy, torch_dtypes(cache::read_copy_dtypes()));
  checks::last_dim_contiguous(kOp, "read_copy", read_copy);
  checks::writable(kOp, "read_copy", read_copy);
  checks::no_overlap(kOp, "read_copy", read_copy, "checkpoint", checkpoint);

  const std::vector<int64_t> scale_shape{checkpoint.size(0), checkpoint.size(1), checkpoint.size(2)};
  const bool fp8 = read_copy.scalar_type() == at::kFloat8_e4m3fn;
  if (fp8) {
    checks::given(kOp, "read_scale", read_scale.has_value(), "read_copy is float8_e4m3fn",
                  "a float32 tensor of shape " + checks::shape_str(scale_shape));
    const at::Tensor& s = *read_scale;
    checks::cuda(kOp, "read_scale", s);
    checks::same_device(kOp, "read_scale", s, "checkpoint", checkpoint);
    checks::shape_is(kOp, "read_scale", s, "(num_slots, heads, rows)", scale_shape);
    checks::dtype_in(kOp, "read_scale", s, {at::kFloat});
    checks::writable(kOp, "read_scale", s);
    checks::no_overlap(kOp, "read_scale", s, "checkpoint", checkpoint);
    checks::no_overlap(kOp, "read_scale", s, "read_copy", read_copy);
  } else {
    checks::none(kOp, "read_scale", read_scale, "read_copy is " + checks::dtype_str(read_copy.scalar_type()),
                 "scales exist only for float8_e4m3fn read copies");
  }

  if (slots.has_value()) {
    const at::Tensor& sl = *slots;
    checks::cuda(kOp, "slots", sl);
    checks::same_device(kOp, "slots", sl, "checkpoint", checkpoint);
    checks::dims(kOp, "slots", sl, 1, "(num_entries,)");
    checks::dtype_in(kOp, "slots", sl, {at::kInt, at::kLong});
  }

  ReadCopyParams p{};
  p.checkpoint = checkpoint.data_ptr();
  p.read_copy = read_copy.data_ptr();
  p.read_scale = fp8 ? read_scale->data_ptr<float>() : nullptr;
  p.slots = slots.has_value() ? slots->data_ptr() : nullptr;
  p.checkpoint_dtype = kernel_dtype(checkpoint.scalar_type());
  p.read_copy_dtype = kernel_dtype(read_copy.scalar_type());
  p.slots_dtype = slots.has_value() ? kernel_dtype(slots->scalar_type()) : DType::kInt64;
  p.num_slots = checkpoint.size(0);
  p.heads = checkpoint.size(1);
  p.rows = checkpoint.size(2);
  p.cols = checkpoint.size(3);
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
  checks::launched(kOp, launch_make_read_copy(p, c10::cuda::getCurrentCUDAStream().stream()));
}

}  // namespace replayssm
