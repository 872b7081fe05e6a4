// torch.ops.replayssm.mamba2_update / mamba2_step: validate, fill Mamba2Params, launch on the current
// stream. Tensor table and math: kernels/mamba2.cuh. No allocation and no host synchronisation, so
// both are safe under CUDA-graph capture.
#include <string>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "api/checks.h"
#include "api/ops.h"
#include "kernels/mamba2.cuh"

namespace replayssm {
namespace {

using checks::dtype_str;
using checks::shape_str;

DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    case at::kFloat8_e4m3fn: return DType::kFloat8E4M3;
    case at::kInt: return DType::kInt32;
    default: return DType::kInt64;
  }
}

// One tensor argument: CUDA, on the reference device, the expected shape (-1: any), one of `dtypes`,
// contiguous last dim, and 16-byte rows where the kernel moves 16-byte vectors.
struct Expect {
  const char* op;
  const at::Tensor& device_ref;

  void operator()(const char* name, const at::Tensor& t, const std::vector<int64_t>& shape,
                  const std::vector<at::ScalarType>& dtypes, int vector_bytes = 0) const {
    checks::cuda(op, name, t);
    checks::same_device(op, name, t, "the first tensor argument", device_ref);
    bool shape_ok = t.dim() == static_cast<int64_t>(shape.size());
    for (size_t i = 0; shape_ok && i < shape.size(); ++i) shape_ok = shape[i] < 0 || shape[i] == t.size(i);
    if (!shape_ok) {
      std::string want = "(";
      for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + (shape[i] < 0 ? std::string("*") : std::to_string(shape[i]));
      TORCH_CHECK(false, checks::cat(op, ": ", name, " must have shape ", want, shape.size() == 1 ? ",)" : ")", ", got ", shape_str(t.sizes())));
    }
    bool dtype_ok = false;
    std::string names;
    for (auto d : dtypes) {
      dtype_ok = dtype_ok || t.scalar_type() == d;
      names += (names.empty() ? "" : ", ") + dtype_str(d);
    }
    TORCH_CHECK(dtype_ok, checks::cat(op, ": ", name, " must have dtype in {", names, "}, got ", dtype_str(t.scalar_type())));
    checks::last_dim_contiguous(op, name, t);
    if (vector_bytes > 0) {
      const int64_t elems = vector_bytes / static_cast<int64_t>(t.element_size());
      bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % vector_bytes == 0;
      for (int64_t i = 0; ok && i + 1 < t.dim(); ++i) ok = t.size(i) == 1 || t.stride(i) % elems == 0;
      TORCH_CHECK(ok, checks::cat(op, ": ", name, " must start on a ", vector_bytes, "-byte boundary with every stride but the last a multiple of ", elems, " elements (the kernel moves ", vector_bytes, "-byte vectors), got strides ", shape_str(t.strides())));
    }
  }
};

void check_shape_supported(const char* op, int64_t P, int64_t N) {
  const bool ok = (P == 64 || P == 80 || P == 128) && (N == 64 || N == 128);
  TORCH_CHECK(ok, checks::cat(op, ": checkpoint (head_dim P, state_dim N) must be one of " REPLAYSSM_MAMBA2_SHAPES ", got (", P, ", ", N, ")"));
}

// The per-row inputs, weights and slots both ops share.
void fill_inputs(Mamba2Params& p, const Expect& expect, const char* op, int64_t H, int64_t P, int64_t N,
                 const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                 const at::Tensor& C, const at::Tensor& out, const std::optional<at::Tensor>& D,
                 const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias, bool dt_softplus,
                 const std::optional<at::Tensor>& slots, int64_t pad_slot_id, int64_t num_slots) {
  const std::vector<at::ScalarType> act{at::kBFloat16, at::kHalf};
  expect("x", x, {-1, H, P}, act, 16);
  const int64_t batch = x.size(0);
  TORCH_CHECK(batch <= 65535, checks::cat(op, ": batch (x.size(0)) must be <= 65535, got ", batch));
  const auto a = x.scalar_type();
  expect("B", B, {batch, -1, N}, {a}, 16);
  const int64_t G = B.size(1);
  TORCH_CHECK(G >= 1 && H % G == 0, checks::cat(op, ": the number of groups (B.size(1) = ", G, ") must divide the number of heads (", H, ")"));
  expect("C", C, {batch, G, N}, {a}, 16);
  expect("dt", dt, {batch, H}, {a, at::kFloat});
  expect("A", A, {H}, {at::kFloat});
  expect("out", out, {batch, H, P}, {a});
  checks::writable(op, "out", out);
  if (D) expect("D", *D, {H}, {at::kFloat});
  if (z) expect("z", *z, {batch, H, P}, {a});
  if (dt_bias) expect("dt_bias", *dt_bias, {H}, {at::kFloat});
  if (slots) {
    expect("slots", *slots, {batch}, {at::kInt, at::kLong});
  } else {
    TORCH_CHECK(batch <= num_slots, checks::cat(op, ": without slots, row r uses slot r, so batch (", batch, ") must be <= num_slots (", num_slots, ")"));
  }
  p.x = x.data_ptr();
  p.x_row_stride = x.stride(0);
  p.x_head_stride = x.stride(1);
  p.dt = dt.data_ptr();
  p.dt_dtype = kernel_dtype(dt.scalar_type());
  p.dt_row_stride = dt.stride(0);
  p.dt_head_stride = dt.stride(1);
  p.B = B.data_ptr();
  p.B_row_stride = B.stride(0);
  p.B_group_stride = B.stride(1);
  p.C = C.data_ptr();
  p.C_row_stride = C.stride(0);
  p.C_group_stride = C.stride(1);
  p.z = z ? z->data_ptr() : nullptr;
  p.z_row_stride = z ? z->stride(0) : 0;
  p.z_head_stride = z ? z->stride(1) : 0;
  p.out = out.data_ptr();
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.act_dtype = kernel_dtype(a);
  p.A = A.data_ptr<float>();
  p.D = D ? D->data_ptr<float>() : nullptr;
  p.dt_bias = dt_bias ? dt_bias->data_ptr<float>() : nullptr;
  p.dt_softplus = dt_softplus;
  p.slots = slots ? slots->data_ptr() : nullptr;
  p.slots_dtype = slots ? kernel_dtype(slots->scalar_type()) : DType::kInt64;
  p.slots_stride = slots ? slots->stride(0) : 1;
  p.pad_slot_id = pad_slot_id;
  p.num_slots = num_slots;
  p.batch = static_cast<int32_t>(batch);
  p.heads = static_cast<int32_t>(H);
  p.groups = static_cast<int32_t>(G);
  p.head_dim = static_cast<int32_t>(P);
  p.state_dim = static_cast<int32_t>(N);
}

void launch_checked(const char* op, const at::Tensor& on, cudaError_t (*launcher)(const Mamba2Params&, cudaStream_t),
                    const Mamba2Params& p) {
  const c10::cuda::CUDAGuard device_guard(on.device());
  const cudaError_t err = launcher(p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, checks::cat(op, ": CUDA kernel launch failed: ", cudaGetErrorString(err)));
}

}  // namespace

void mamba2_update(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                   const at::Tensor& B, const at::Tensor& C, const at::Tensor& out, const std::optional<at::Tensor>& D,
                   const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias, bool dt_softplus,
                   const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "mamba2_update";
  const Expect expect{op, state};
  expect("state", state, {-1, -1, -1, -1}, {at::kFloat, at::kBFloat16, at::kHalf}, 16);
  checks::writable(op, "state", state);
  const int64_t H = state.size(1), P = state.size(2), N = state.size(3);
  check_shape_supported(op, P, N);
  Mamba2Params p{};
  p.checkpoint = state.data_ptr();
  p.checkpoint_dtype = kernel_dtype(state.scalar_type());
  p.ck_slot_stride = state.stride(0);
  p.ck_head_stride = state.stride(1);
  p.ck_row_stride = state.stride(2);
  fill_inputs(p, expect, op, H, P, N, x, dt, A, B, C, out, D, z, dt_bias, dt_softplus, slots, pad_slot_id, state.size(0));
  launch_checked(op, state, launch_mamba2_update, p);
}

void mamba2_step(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                 const std::optional<at::Tensor>& read_scale, const at::Tensor& x_buf, const at::Tensor& B_buf,
                 const at::Tensor& dt_buf, const at::Tensor& num_committed, const at::Tensor& x, const at::Tensor& dt,
                 const at::Tensor& A, const at::Tensor& B, const at::Tensor& C, const at::Tensor& out,
                 const std::optional<at::Tensor>& D, const std::optional<at::Tensor>& z,
                 const std::optional<at::Tensor>& dt_bias, bool dt_softplus, int64_t max_draft_tokens,
                 const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "mamba2_step";
  const Expect expect{op, checkpoint};
  expect("checkpoint", checkpoint, {-1, -1, -1, -1}, {at::kFloat, at::kBFloat16, at::kHalf}, 16);
  checks::writable(op, "checkpoint", checkpoint);
  const int64_t S = checkpoint.size(0), H = checkpoint.size(1), P = checkpoint.size(2), N = checkpoint.size(3);
  check_shape_supported(op, P, N);
  Mamba2Params p{};
  p.checkpoint = checkpoint.data_ptr();
  p.checkpoint_dtype = kernel_dtype(checkpoint.scalar_type());
  p.ck_slot_stride = checkpoint.stride(0);
  p.ck_head_stride = checkpoint.stride(1);
  p.ck_row_stride = checkpoint.stride(2);

  if (read_copy) {
    const auto ck = checkpoint.scalar_type();
    const std::vector<at::ScalarType> allowed = ck == at::kFloat
        ? std::vector<at::ScalarType>{at::kBFloat16, at::kHalf, at::kFloat8_e4m3fn}
        : std::vector<at::ScalarType>{at::kFloat8_e4m3fn};
    expect("read_copy", *read_copy, {S, H, P, N}, allowed, 16);
    checks::writable(op, "read_copy", *read_copy);
    p.read_copy = read_copy->data_ptr();
    p.read_copy_dtype = kernel_dtype(read_copy->scalar_type());
    p.rc_slot_stride = read_copy->stride(0);
    p.rc_head_stride = read_copy->stride(1);
    p.rc_row_stride = read_copy->stride(2);
    if (read_copy->scalar_type() == at::kFloat8_e4m3fn) {
      TORCH_CHECK(read_scale.has_value(), checks::cat(op, ": read_scale is required with a float8_e4m3fn read_copy (float32, shape (", S, ", ", H, ", ", P, ")), got None"));
      expect("read_scale", *read_scale, {S, H, P}, {at::kFloat});
      p.read_scale = read_scale->data_ptr<float>();
      p.rs_slot_stride = read_scale->stride(0);
      p.rs_head_stride = read_scale->stride(1);
    } else {
      TORCH_CHECK(!read_scale.has_value(), checks::cat(op, ": read_scale must be None unless read_copy is float8_e4m3fn"));
    }
  } else {
    TORCH_CHECK(!read_scale.has_value(), checks::cat(op, ": read_scale is given but read_copy is None"));
  }

  const auto act = x.scalar_type();
  expect("x_buf", x_buf, {S, H, -1, P}, {act}, 16);
  const int64_t L = x_buf.size(2);
  TORCH_CHECK(L >= 1 && L <= kMamba2MaxBufferLen, checks::cat(op, ": the buffer length (x_buf.size(2)) must be in [1, ", kMamba2MaxBufferLen, "], got ", L));
  TORCH_CHECK(max_draft_tokens >= 1 && max_draft_tokens <= L, checks::cat(op, ": max_draft_tokens must be in [1, L = ", L, "], got ", max_draft_tokens));
  expect("B_buf", B_buf, {S, -1, L, N}, {act}, 16);
  expect("dt_buf", dt_buf, {S, H, L}, {at::kFloat});
  expect("num_committed", num_committed, {S}, {at::kInt});
  for (const auto* t : {&x_buf, &B_buf, &dt_buf, &num_committed}) checks::writable(op, "a cache buffer", *t);
  p.x_buf = x_buf.data_ptr();
  p.xb_slot_stride = x_buf.stride(0);
  p.xb_head_stride = x_buf.stride(1);
  p.xb_entry_stride = x_buf.stride(2);
  p.B_buf = B_buf.data_ptr();
  p.Bb_slot_stride = B_buf.stride(0);
  p.Bb_group_stride = B_buf.stride(1);
  p.Bb_entry_stride = B_buf.stride(2);
  p.dt_buf = dt_buf.data_ptr<float>();
  p.dtb_slot_stride = dt_buf.stride(0);
  p.dtb_head_stride = dt_buf.stride(1);
  p.num_committed = num_committed.data_ptr<int32_t>();
  p.buffer_len = static_cast<int32_t>(L);
  p.max_draft_tokens = static_cast<int32_t>(max_draft_tokens);
  TORCH_CHECK(H <= 32767, checks::cat(op, ": heads must be <= 32767 (the cursor carries per-launch head tickets), got ", H));

  fill_inputs(p, expect, op, H, P, N, x, dt, A, B, C, out, D, z, dt_bias, dt_softplus, slots, pad_slot_id, S);
  TORCH_CHECK(B_buf.size(1) == p.groups, checks::cat(op, ": B has ", p.groups, " groups but B_buf holds ", B_buf.size(1)));
  launch_checked(op, checkpoint, launch_mamba2_step, p);
}

}  // namespace replayssm
