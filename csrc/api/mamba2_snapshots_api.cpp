// torch.ops.replayssm.mamba2_update_snapshots: validate, fill Mamba2SnapshotsParams, launch on the
// current stream. Tensor table and math: kernels/mamba2_snapshots.cuh. No allocation and no host
// synchronisation, so it is safe under CUDA-graph capture.
//
// The tensor checks duplicate the small `Expect` helper of mamba2_api.cpp on purpose: that file is being
// refactored, and this op has a token dimension everywhere, so its params struct is its own.
#include <string>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "api/checks.h"
#include "api/ops.h"
#include "kernels/mamba2_snapshots.cuh"

namespace replayssm {
namespace {

constexpr const char* kOp = "mamba2_update_snapshots";

using checks::dtype_str;
using checks::shape_str;

DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    case at::kInt: return DType::kInt32;
    default: return DType::kInt64;
  }
}

// One tensor argument: CUDA, on the state's device, the expected shape (-1: any), one of `dtypes`,
// contiguous last dim, and (vector_bytes > 0) a base address and strides that keep every row start on
// a vector_bytes boundary, because the kernel moves 16-byte vectors.
void expect(const char* name, const at::Tensor& t, const at::Tensor& state, const std::vector<int64_t>& shape,
            const std::vector<at::ScalarType>& dtypes, int vector_bytes = 0) {
  checks::cuda(kOp, name, t);
  checks::same_device(kOp, name, t, "state", state);
  bool shape_ok = t.dim() == static_cast<int64_t>(shape.size());
  for (size_t i = 0; shape_ok && i < shape.size(); ++i) shape_ok = shape[i] < 0 || shape[i] == t.size(i);
  if (!shape_ok) {
    std::string want = "(";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + (shape[i] < 0 ? std::string("*") : std::to_string(shape[i]));
    TORCH_CHECK(false, checks::cat(kOp, ": ", name, " must have shape ", want, shape.size() == 1 ? ",)" : ")", ", got ", shape_str(t.sizes())));
  }
  bool dtype_ok = false;
  std::string names;
  for (auto d : dtypes) {
    dtype_ok = dtype_ok || t.scalar_type() == d;
    names += (names.empty() ? "" : ", ") + dtype_str(d);
  }
  TORCH_CHECK(dtype_ok, checks::cat(kOp, ": ", name, " must have dtype in {", names, "}, got ", dtype_str(t.scalar_type())));
  checks::last_dim_contiguous(kOp, name, t);
  if (vector_bytes > 0) {
    const int64_t elems = vector_bytes / static_cast<int64_t>(t.element_size());
    bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % vector_bytes == 0;
    for (int64_t i = 0; ok && i + 1 < t.dim(); ++i) ok = t.size(i) == 1 || t.stride(i) % elems == 0;
    TORCH_CHECK(ok, checks::cat(kOp, ": ", name, " must start on a ", vector_bytes, "-byte boundary with every stride but the last a multiple of ", elems, " elements (the kernel moves ", vector_bytes, "-byte vectors), got strides ", shape_str(t.strides())));
  }
}

}  // namespace

void mamba2_update_snapshots(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                             const at::Tensor& B, const at::Tensor& C, const at::Tensor& out,
                             const at::Tensor& snapshots, const std::optional<at::Tensor>& D,
                             const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias,
                             bool dt_softplus, const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  expect("state", state, state, {-1, -1, -1, -1}, {at::kFloat, at::kBFloat16, at::kHalf}, 16);
  const int64_t H = state.size(1), P = state.size(2), N = state.size(3);
  const bool shape_ok = (P == 64 || P == 80 || P == 128) && (N == 64 || N == 128);
  TORCH_CHECK(shape_ok, checks::cat(kOp, ": state (head_dim P, state_dim N) must be one of (P, N) in {64, 80, 128} x {64, 128}, got (", P, ", ", N, ")"));

  const std::vector<at::ScalarType> act{at::kBFloat16, at::kHalf};
  expect("x", x, state, {-1, -1, H, P}, act);
  const int64_t batch = x.size(0), T = x.size(1);
  TORCH_CHECK(batch <= 65535, checks::cat(kOp, ": batch (x.size(0)) must be <= 65535, got ", batch));
  TORCH_CHECK(T >= 1 && T <= kMamba2SnapshotsMaxTokens, checks::cat(kOp, ": the number of tokens T (x.size(1)) must be in [1, ", kMamba2SnapshotsMaxTokens, "], got ", T));
  TORCH_CHECK(H <= 65535, checks::cat(kOp, ": heads (state.size(1)) must be <= 65535, got ", H));
  const auto a = x.scalar_type();
  expect("B", B, state, {batch, T, -1, N}, {a});
  const int64_t G = B.size(2);
  TORCH_CHECK(G >= 1 && H % G == 0, checks::cat(kOp, ": the number of groups (B.size(2) = ", G, ") must divide the number of heads (", H, ")"));
  expect("C", C, state, {batch, T, G, N}, {a});
  expect("dt", dt, state, {batch, T, H}, {a, at::kFloat});
  expect("A", A, state, {H}, {at::kFloat});
  expect("out", out, state, {batch, T, H, P}, {a});
  checks::writable(kOp, "out", out);
  expect("snapshots", snapshots, state, {batch, T, H, P, N}, {state.scalar_type()}, 16);
  checks::writable(kOp, "snapshots", snapshots);
  checks::no_overlap(kOp, "snapshots", snapshots, "state", state);
  checks::no_overlap(kOp, "out", out, "snapshots", snapshots);
  if (D) expect("D", *D, state, {H}, {at::kFloat});
  if (z) expect("z", *z, state, {batch, T, H, P}, {a});
  if (dt_bias) expect("dt_bias", *dt_bias, state, {H}, {at::kFloat});
  if (slots) {
    expect("slots", *slots, state, {batch}, {at::kInt, at::kLong});
  } else {
    TORCH_CHECK(batch <= state.size(0), checks::cat(kOp, ": without slots, row r uses slot r, so batch (", batch, ") must be <= num_slots (", state.size(0), ")"));
  }

  Mamba2SnapshotsParams p{};
  p.state = state.data_ptr();
  p.state_dtype = kernel_dtype(state.scalar_type());
  p.st_slot_stride = state.stride(0);
  p.st_head_stride = state.stride(1);
  p.st_row_stride = state.stride(2);
  p.snapshots = snapshots.data_ptr();
  p.sn_row_stride = snapshots.stride(0);
  p.sn_token_stride = snapshots.stride(1);
  p.sn_head_stride = snapshots.stride(2);
  p.sn_prow_stride = snapshots.stride(3);
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
  p.act_dtype = kernel_dtype(a);
  p.A = A.data_ptr<float>();
  p.D = D ? D->data_ptr<float>() : nullptr;
  p.dt_bias = dt_bias ? dt_bias->data_ptr<float>() : nullptr;
  p.dt_softplus = dt_softplus;
  p.slots = slots ? slots->data_ptr() : nullptr;
  p.slots_dtype = slots ? kernel_dtype(slots->scalar_type()) : DType::kInt64;
  p.slots_stride = slots ? slots->stride(0) : 1;
  p.pad_slot_id = pad_slot_id;
  p.num_slots = state.size(0);
  p.batch = static_cast<int32_t>(batch);
  p.tokens = static_cast<int32_t>(T);
  p.heads = static_cast<int32_t>(H);
  p.groups = static_cast<int32_t>(G);
  p.head_dim = static_cast<int32_t>(P);
  p.state_dim = static_cast<int32_t>(N);

  const c10::cuda::CUDAGuard device_guard(state.device());
  checks::launched(kOp, launch_mamba2_update_snapshots(p, c10::cuda::getCurrentCUDAStream().stream()));
}

}  // namespace replayssm
