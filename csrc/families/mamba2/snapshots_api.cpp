// torch.ops.replayssm.mamba2_update_snapshots: validate, fill Mamba2SnapshotsParams, launch on the
// current stream. Tensor table and math: kernels/mamba2_snapshots.cuh. No allocation and no host
// synchronisation, so it is safe under CUDA-graph capture.
//
// This op has a token dimension everywhere, so its params struct is its own (mamba2_snapshots.cuh).
#include <string>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "api/checks.h"
#include "api/ops.h"
#include "api/tensor_args.h"
#include "families/mamba2/snapshots.h"
#include "families/mamba2/variants.h"

namespace replayssm {
namespace {

constexpr const char* kOp = "mamba2_update_snapshots";

}  // namespace

void mamba2_update_snapshots(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                             const at::Tensor& B, const at::Tensor& C, const at::Tensor& out,
                             const at::Tensor& snapshots, const std::optional<at::Tensor>& D,
                             const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias,
                             bool dt_softplus, const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  const Expect expect{kOp, state, "state"};
  expect("state", state, {-1, -1, -1, -1}, torch_dtypes(mamba2::kVariants.state_dtypes()), 16);
  const int64_t H = state.size(1), P = state.size(2), N = state.size(3);
  TORCH_CHECK(mamba2::kVariants.shape_compiled(P, N), checks::cat(kOp, ": state (head_dim P, state_dim N) must be one of ", mamba2::kVariants.shapes_text(), ", got (", P, ", ", N, ")"));

  expect("x", x, {-1, -1, H, P}, torch_dtypes(mamba2::kVariants.activation_dtypes()));
  const int64_t batch = x.size(0), T = x.size(1);
  TORCH_CHECK(batch <= 65535, checks::cat(kOp, ": batch (x.size(0)) must be <= 65535, got ", batch));
  TORCH_CHECK(T >= 1 && T <= kMamba2SnapshotsMaxTokens, checks::cat(kOp, ": the number of tokens T (x.size(1)) must be in [1, ", kMamba2SnapshotsMaxTokens, "], got ", T));
  TORCH_CHECK(H <= 65535, checks::cat(kOp, ": heads (state.size(1)) must be <= 65535, got ", H));
  const auto a = x.scalar_type();
  expect("B", B, {batch, T, -1, N}, {a});
  const int64_t G = B.size(2);
  TORCH_CHECK(G >= 1 && H % G == 0, checks::cat(kOp, ": the number of groups (B.size(2) = ", G, ") must divide the number of heads (", H, ")"));
  expect("C", C, {batch, T, G, N}, {a});
  expect("dt", dt, {batch, T, H}, {a, at::kFloat});
  expect("A", A, {H}, {at::kFloat});
  expect("out", out, {batch, T, H, P}, {a});
  checks::writable(kOp, "out", out);
  expect("snapshots", snapshots, {batch, T, H, P, N}, {state.scalar_type()}, 16);
  checks::writable(kOp, "snapshots", snapshots);
  checks::no_overlap(kOp, "snapshots", snapshots, "state", state);
  checks::no_overlap(kOp, "out", out, "snapshots", snapshots);
  if (D) expect("D", *D, {H}, {at::kFloat});
  if (z) expect("z", *z, {batch, T, H, P}, {a});
  if (dt_bias) expect("dt_bias", *dt_bias, {H}, {at::kFloat});
  if (slots) {
    expect("slots", *slots, {batch}, {at::kInt, at::kLong});
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
  fill_token_inputs(p, x, dt, A, B, C, out, D, z, dt_bias, dt_softplus);
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
