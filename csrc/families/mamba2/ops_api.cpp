// torch.ops.replayssm.mamba2_update / mamba2_step / mamba2_verify / mamba2_commit / mamba2_flush /
// mamba2_materialize: validate, fill the params, launch on the current stream. Tensor tables and math:
// kernels/mamba2.cuh (update, step) and kernels/mamba2_spec.cuh (the speculative ops). No allocation
// and no host synchronisation, so all are safe under CUDA-graph capture.
#include <string>
#include <vector>

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "api/checks.h"
#include "diag/cta_timeline_api.h"
#include "api/ops.h"
#include "api/tensor_args.h"
#include "api/layer_table_api.h"
#include "cache/layer_table.h"
#include "families/mamba2/params.h"
#include "families/mamba2/spec_params.h"
#include "families/mamba2/variants.h"

namespace replayssm {
namespace {

// The variants table (variants.h) says what is compiled; the checks and their messages read it.
void check_shape_supported(const char* op, int64_t P, int64_t N) {
  TORCH_CHECK(mamba2::kVariants.shape_compiled(P, N), checks::cat(op, ": checkpoint (head_dim P, state_dim N) must be one of ", mamba2::kVariants.shapes_text(), ", got (", P, ", ", N, ")"));
}

std::vector<at::ScalarType> checkpoint_dtypes() { return torch_dtypes(mamba2::kVariants.checkpoint_dtypes()); }
std::vector<at::ScalarType> activation_dtypes() { return torch_dtypes(mamba2::kVariants.activation_dtypes()); }

// The checkpoint fields, shared by every op's params struct (Mamba2Params, Mamba2SpecParams).
template <class Params>
void fill_checkpoint(Params& p, const at::Tensor& checkpoint) {
  p.checkpoint = checkpoint.data_ptr();
  p.checkpoint_dtype = kernel_dtype(checkpoint.scalar_type());
  p.ck_slot_stride = checkpoint.stride(0);
  p.ck_head_stride = checkpoint.stride(1);
  p.ck_row_stride = checkpoint.stride(2);
}

// The optional read copy and its fp8 scales, of a dtype the variants table pairs with the checkpoint's.
template <class Params>
void fill_read_copy(Params& p, const Expect& expect, const char* op, const at::Tensor& checkpoint,
                    const std::optional<at::Tensor>& read_copy, const std::optional<at::Tensor>& read_scale,
                    bool written) {
  const int64_t S = checkpoint.size(0), H = checkpoint.size(1), P = checkpoint.size(2), N = checkpoint.size(3);
  if (read_copy) {
    const auto allowed = torch_dtypes(mamba2::kVariants.read_copy_dtypes(kernel_dtype(checkpoint.scalar_type())));
    expect("read_copy", *read_copy, {S, H, P, N}, allowed, 16);
    if (written) checks::writable(op, "read_copy", *read_copy);
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
}

// The buffers and cursors; returns the buffer length L. `act` is the activation dtype they must hold.
template <class Params>
int64_t fill_buffers(Params& p, const Expect& expect, const char* op, const at::Tensor& checkpoint, at::ScalarType act,
                     const at::Tensor& x_buf, const at::Tensor& B_buf, const at::Tensor& dt_buf,
                     const at::Tensor& num_committed, bool written) {
  const int64_t S = checkpoint.size(0), H = checkpoint.size(1), P = checkpoint.size(2), N = checkpoint.size(3);
  expect("x_buf", x_buf, {S, H, -1, P}, {act}, 16);
  const int64_t L = x_buf.size(2);
  TORCH_CHECK(L >= 1 && L <= kMamba2MaxBufferLen, checks::cat(op, ": the buffer length (x_buf.size(2)) must be in [1, ", kMamba2MaxBufferLen, "], got ", L));
  expect("B_buf", B_buf, {S, -1, L, N}, {act}, 16);
  expect("dt_buf", dt_buf, {S, H, L}, {at::kFloat});
  expect("num_committed", num_committed, {S}, {at::kInt});
  if (written) {
    for (const auto* t : {&x_buf, &B_buf, &dt_buf, &num_committed}) checks::writable(op, "a cache buffer", *t);
  }
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
  return L;
}

// num_verified (verify writes it, commit reads and zeroes it): int32 (num_slots,), apart from the cursors.
void fill_num_verified(Mamba2SpecParams& p, const Expect& expect, const char* op, const at::Tensor& num_verified,
                       const at::Tensor& num_committed) {
  expect("num_verified", num_verified, {num_committed.size(0)}, {at::kInt});
  checks::writable(op, "num_verified", num_verified);
  checks::no_overlap(op, "num_verified", num_verified, "num_committed", num_committed);
  p.num_verified = num_verified.data_ptr<int32_t>();
}

// The optional [seed, offset] of stochastic rounding: only where a bf16 / fp16 checkpoint is written.
template <class Params>
void fill_rounding_seed(Params& p, const Expect& expect, const char* op, const char* checkpoint_name,
                        const at::Tensor& checkpoint, const std::optional<at::Tensor>& rounding_seed) {
  p.rounding_seed = nullptr;
  if (!rounding_seed) return;
  const auto ck = checkpoint.scalar_type();
  TORCH_CHECK(ck == at::kBFloat16 || ck == at::kHalf, checks::cat(op, ": rounding_seed (stochastic rounding) is only for a bfloat16 or float16 ", checkpoint_name, ", got a ", checks::dtype_str(ck), " ", checkpoint_name, "; pass None"));
  expect("rounding_seed", *rounding_seed, {2}, {at::kLong});
  checks::writable(op, "rounding_seed", *rounding_seed);
  p.rounding_seed = rounding_seed->data_ptr<int64_t>();
}

void fill_slots(Mamba2SpecParams& p, const Expect& expect, const char* op, const std::optional<at::Tensor>& slots,
                int64_t batch, int64_t pad_slot_id, int64_t num_slots) {
  if (slots) {
    expect("slots", *slots, {batch}, {at::kInt, at::kLong});
  } else {
    TORCH_CHECK(batch <= num_slots, checks::cat(op, ": without slots, row r uses slot r, so batch (", batch, ") must be <= num_slots (", num_slots, ")"));
  }
  p.slots = slots ? slots->data_ptr() : nullptr;
  p.slots_dtype = slots ? kernel_dtype(slots->scalar_type()) : DType::kInt64;
  p.slots_stride = slots ? slots->stride(0) : 1;
  p.pad_slot_id = pad_slot_id;
  p.num_slots = num_slots;
}

// The replay ops' activations (x, B, C, z, out) have the cache's dtype, x_buf's.
void check_cache_activations(const char* op, at::ScalarType act, const at::Tensor& x, const at::Tensor& B,
                             const at::Tensor& C, const std::optional<at::Tensor>& z, const at::Tensor& out) {
  checks::cache_activation(op, "x", x, "x_buf", act);
  checks::cache_activation(op, "B", B, "x_buf", act);
  checks::cache_activation(op, "C", C, "x_buf", act);
  if (z) checks::cache_activation(op, "z", *z, "x_buf", act);
  checks::cache_activation(op, "out", out, "x_buf", act);
}

// The per-row inputs, weights and slots mamba2_update and mamba2_step share.
void fill_inputs(Mamba2Params& p, const Expect& expect, const char* op, int64_t H, int64_t P, int64_t N,
                 const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                 const at::Tensor& C, const at::Tensor& out, const std::optional<at::Tensor>& D,
                 const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias, bool dt_softplus,
                 const std::optional<at::Tensor>& slots, int64_t pad_slot_id, int64_t num_slots) {
  expect("x", x, {-1, H, P}, activation_dtypes(), 16);
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

template <class Params>
void launch_checked(const char* op, const at::Tensor& on, cudaError_t (*launcher)(const Params&, cudaStream_t),
                    const Params& p) {
  const c10::cuda::CUDAGuard device_guard(on.device());
  checks::launched(op, launcher(p, c10::cuda::getCurrentCUDAStream().stream()));
}

}  // namespace

void mamba2_update(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                   const at::Tensor& B, const at::Tensor& C, const at::Tensor& out, const std::optional<at::Tensor>& D,
                   const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias, bool dt_softplus,
                   const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                   const std::optional<at::Tensor>& rounding_seed) {
  constexpr const char* op = "mamba2_update";
  const Expect expect{op, state};
  expect("state", state, {-1, -1, -1, -1}, torch_dtypes(mamba2::kVariants.state_dtypes()), 16);
  checks::writable(op, "state", state);
  const int64_t H = state.size(1), P = state.size(2), N = state.size(3);
  check_shape_supported(op, P, N);
  Mamba2Params p{};
  fill_checkpoint(p, state);
  fill_inputs(p, expect, op, H, P, N, x, dt, A, B, C, out, D, z, dt_bias, dt_softplus, slots, pad_slot_id, state.size(0));
  fill_rounding_seed(p, expect, op, "state", state, rounding_seed);
  // The launcher's item counter (see Mamba2Params::work_counter): from the caching allocator on the
  // current stream, so that concurrent launches never share one; under graph capture from the graph's
  // pool, its zeroing captured with the launch.
  at::Tensor work_counter;
  if (p.batch > 0) {
    work_counter = at::empty({1}, state.options().dtype(at::kInt));
    p.work_counter = work_counter.data_ptr<int32_t>();
  }
  attach_cta_timeline(p);
  launch_checked(op, state, launch_mamba2_update, p);
}

void mamba2_step(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                 const std::optional<at::Tensor>& read_scale, const at::Tensor& x_buf, const at::Tensor& B_buf,
                 const at::Tensor& dt_buf, const at::Tensor& num_committed, const at::Tensor& x, const at::Tensor& dt,
                 const at::Tensor& A, const at::Tensor& B, const at::Tensor& C, const at::Tensor& out,
                 const std::optional<at::Tensor>& D, const std::optional<at::Tensor>& z,
                 const std::optional<at::Tensor>& dt_bias, bool dt_softplus, int64_t max_draft_tokens,
                 const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                 const std::optional<at::Tensor>& rounding_seed, bool staggered_flush) {
  constexpr const char* op = "mamba2_step";
  const Expect expect{op, checkpoint};
  expect("checkpoint", checkpoint, {-1, -1, -1, -1}, checkpoint_dtypes(), 16);
  checks::writable(op, "checkpoint", checkpoint);
  const int64_t S = checkpoint.size(0), H = checkpoint.size(1), P = checkpoint.size(2), N = checkpoint.size(3);
  check_shape_supported(op, P, N);
  Mamba2Params p{};
  fill_checkpoint(p, checkpoint);
  fill_read_copy(p, expect, op, checkpoint, read_copy, read_scale, /*written=*/true);
  expect("x_buf", x_buf, {S, H, -1, P}, activation_dtypes(), 16);
  const auto act = x_buf.scalar_type();
  check_cache_activations(op, act, x, B, C, z, out);
  const int64_t L = fill_buffers(p, expect, op, checkpoint, act, x_buf, B_buf, dt_buf, num_committed, /*written=*/true);
  TORCH_CHECK(max_draft_tokens >= 1 && max_draft_tokens <= L, checks::cat(op, ": max_draft_tokens must be in [1, L = ", L, "], got ", max_draft_tokens));
  p.max_draft_tokens = static_cast<int32_t>(max_draft_tokens);
  TORCH_CHECK(H <= 32767, checks::cat(op, ": heads must be <= 32767 (the cursor carries per-launch head tickets), got ", H));

  fill_inputs(p, expect, op, H, P, N, x, dt, A, B, C, out, D, z, dt_bias, dt_softplus, slots, pad_slot_id, S);
  TORCH_CHECK(B_buf.size(1) == p.groups, checks::cat(op, ": B has ", p.groups, " groups but B_buf holds ", B_buf.size(1)));
  fill_rounding_seed(p, expect, op, "checkpoint", checkpoint, rounding_seed);
  p.staggered_flush = staggered_flush;
  // The order pass's workspace (folding rows first; see mamba2_step_order.cu): wherever the rows fold
  // at different steps, the launch policy deciding whether the pass runs. Allocated per call from the
  // caching allocator on the current stream: under graph capture from the graph's pool, and reused in
  // stream order after the launch.
  at::Tensor row_order;
  if (staggered_flush && p.batch > 0) {
    row_order = at::empty({2 * static_cast<int64_t>(p.batch)}, checkpoint.options().dtype(at::kInt));
    p.row_order = row_order.data_ptr<int32_t>();
  }
  attach_cta_timeline(p);
  launch_checked(op, checkpoint, launch_mamba2_step, p);
}

void mamba2_verify(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                   const std::optional<at::Tensor>& read_scale, const at::Tensor& x_buf, const at::Tensor& B_buf,
                   const at::Tensor& dt_buf, const at::Tensor& num_committed, const at::Tensor& num_verified,
                   const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                   const at::Tensor& C, const at::Tensor& out, const std::optional<at::Tensor>& D,
                   const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias, bool dt_softplus,
                   const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                   const std::optional<at::Tensor>& error_word) {
  constexpr const char* op = "mamba2_verify";
  const Expect expect{op, checkpoint};
  expect("checkpoint", checkpoint, {-1, -1, -1, -1}, checkpoint_dtypes(), 16);
  const int64_t S = checkpoint.size(0), H = checkpoint.size(1), P = checkpoint.size(2), N = checkpoint.size(3);
  check_shape_supported(op, P, N);
  Mamba2SpecParams p{};
  fill_checkpoint(p, checkpoint);
  fill_read_copy(p, expect, op, checkpoint, read_copy, read_scale, /*written=*/false);

  expect("x_buf", x_buf, {S, H, -1, P}, activation_dtypes(), 16);
  const auto act = x_buf.scalar_type();
  check_cache_activations(op, act, x, B, C, z, out);
  expect("x", x, {-1, -1, H, P}, {act}, 16);
  const int64_t L = fill_buffers(p, expect, op, checkpoint, act, x_buf, B_buf, dt_buf, num_committed, /*written=*/true);
  fill_num_verified(p, expect, op, num_verified, num_committed);
  const int64_t batch = x.size(0), T = x.size(1);
  const int64_t max_T = L < kMamba2SpecMaxDraftTokens ? L : kMamba2SpecMaxDraftTokens;
  TORCH_CHECK(T >= 1 && T <= max_T, checks::cat(op, ": the number of draft tokens T (x.size(1)) must be in [1, min(L = ", L, ", ", kMamba2SpecMaxDraftTokens, ")], got ", T));
  TORCH_CHECK(batch <= 65535, checks::cat(op, ": batch (x.size(0)) must be <= 65535, got ", batch));
  expect("B", B, {batch, T, -1, N}, {act}, 16);
  const int64_t G = B.size(2);
  TORCH_CHECK(G >= 1 && H % G == 0, checks::cat(op, ": the number of groups (B.size(2) = ", G, ") must divide the number of heads (", H, ")"));
  TORCH_CHECK(B_buf.size(1) == G, checks::cat(op, ": B has ", G, " groups but B_buf holds ", B_buf.size(1)));
  expect("C", C, {batch, T, G, N}, {act}, 16);
  expect("dt", dt, {batch, T, H}, {act, at::kFloat});
  expect("A", A, {H}, {at::kFloat});
  expect("out", out, {batch, T, H, P}, {act});
  checks::writable(op, "out", out);
  if (D) expect("D", *D, {H}, {at::kFloat});
  if (z) expect("z", *z, {batch, T, H, P}, {act});
  if (dt_bias) expect("dt_bias", *dt_bias, {H}, {at::kFloat});
  fill_slots(p, expect, op, slots, batch, pad_slot_id, S);
  p.error_word = error_word_arg(expect, op, error_word);

  p.num_tokens = static_cast<int32_t>(T);
  fill_token_inputs(p, x, dt, A, B, C, out, D, z, dt_bias, dt_softplus);
  p.batch = static_cast<int32_t>(batch);
  p.heads = static_cast<int32_t>(H);
  p.groups = static_cast<int32_t>(G);
  p.head_dim = static_cast<int32_t>(P);
  p.state_dim = static_cast<int32_t>(N);
  launch_checked(op, checkpoint, launch_mamba2_verify, p);
}

namespace {

// What commit, flush and materialize share: the cache (the read copy only where it is refreshed), A,
// the rows and their slots. `batch` rows; the caller fills the mode and its own tensors.
Mamba2SpecParams fold_params(const char* op, const Expect& expect, const at::Tensor& checkpoint, bool written,
                             const std::optional<at::Tensor>& read_copy, const std::optional<at::Tensor>& read_scale,
                             const at::Tensor& x_buf, const at::Tensor& B_buf, const at::Tensor& dt_buf,
                             const at::Tensor& num_committed, const at::Tensor& A,
                             const std::optional<at::Tensor>& slots, int64_t batch, int64_t pad_slot_id) {
  expect("checkpoint", checkpoint, {-1, -1, -1, -1}, checkpoint_dtypes(), 16);
  if (written) checks::writable(op, "checkpoint", checkpoint);
  const int64_t S = checkpoint.size(0), H = checkpoint.size(1), P = checkpoint.size(2), N = checkpoint.size(3);
  check_shape_supported(op, P, N);
  TORCH_CHECK(H <= 65535, checks::cat(op, ": heads must be <= 65535, got ", H));
  Mamba2SpecParams p{};
  fill_checkpoint(p, checkpoint);
  fill_read_copy(p, expect, op, checkpoint, read_copy, read_scale, written);
  expect("x_buf", x_buf, {S, H, -1, P}, activation_dtypes(), 16);
  fill_buffers(p, expect, op, checkpoint, x_buf.scalar_type(), x_buf, B_buf, dt_buf, num_committed, written);
  const int64_t G = B_buf.size(1);
  TORCH_CHECK(G >= 1 && H % G == 0, checks::cat(op, ": the number of groups (B_buf.size(1) = ", G, ") must divide the number of heads (", H, ")"));
  expect("A", A, {H}, {at::kFloat});
  TORCH_CHECK(batch <= INT32_MAX, checks::cat(op, ": the number of rows must be < 2^31, got ", batch));
  fill_slots(p, expect, op, slots, batch, pad_slot_id, S);
  p.act_dtype = kernel_dtype(x_buf.scalar_type());
  p.A = A.data_ptr<float>();
  p.batch = static_cast<int32_t>(batch);
  p.heads = static_cast<int32_t>(H);
  p.groups = static_cast<int32_t>(G);
  p.head_dim = static_cast<int32_t>(P);
  p.state_dim = static_cast<int32_t>(N);
  return p;
}

}  // namespace

void mamba2_commit(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                   const std::optional<at::Tensor>& read_scale, const at::Tensor& x_buf, const at::Tensor& B_buf,
                   const at::Tensor& dt_buf, const at::Tensor& num_committed, const at::Tensor& num_verified,
                   const at::Tensor& num_accepted, const at::Tensor& A, int64_t max_draft_tokens,
                   const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                   const std::optional<at::Tensor>& rounding_seed, const std::optional<at::Tensor>& error_word) {
  constexpr const char* op = "mamba2_commit";
  const Expect expect{op, checkpoint};
  expect("num_accepted", num_accepted, {-1}, {at::kInt, at::kLong});
  Mamba2SpecParams p = fold_params(op, expect, checkpoint, /*written=*/true, read_copy, read_scale, x_buf, B_buf,
                                   dt_buf, num_committed, A, slots, num_accepted.size(0), pad_slot_id);
  TORCH_CHECK(max_draft_tokens >= 1 && max_draft_tokens <= p.buffer_len, checks::cat(op, ": max_draft_tokens must be in [1, L = ", p.buffer_len, "], got ", max_draft_tokens));
  fill_num_verified(p, expect, op, num_verified, num_committed);
  p.error_word = error_word_arg(expect, op, error_word);
  p.mode = Mamba2FoldMode::kCommit;
  p.max_draft_tokens = static_cast<int32_t>(max_draft_tokens);
  p.num_accepted = num_accepted.data_ptr();
  p.num_accepted_dtype = kernel_dtype(num_accepted.scalar_type());
  p.num_accepted_stride = num_accepted.stride(0);
  fill_rounding_seed(p, expect, op, "checkpoint", checkpoint, rounding_seed);
  launch_checked(op, checkpoint, launch_mamba2_fold, p);
}

void mamba2_flush(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                  const std::optional<at::Tensor>& read_scale, const at::Tensor& x_buf, const at::Tensor& B_buf,
                  const at::Tensor& dt_buf, const at::Tensor& num_committed, const at::Tensor& A,
                  const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                  const std::optional<at::Tensor>& rounding_seed) {
  constexpr const char* op = "mamba2_flush";
  const Expect expect{op, checkpoint};
  if (slots) expect("slots", *slots, {-1}, {at::kInt, at::kLong});
  const int64_t batch = slots ? slots->size(0) : checkpoint.size(0);
  Mamba2SpecParams p = fold_params(op, expect, checkpoint, /*written=*/true, read_copy, read_scale, x_buf, B_buf,
                                   dt_buf, num_committed, A, slots, batch, pad_slot_id);
  p.mode = Mamba2FoldMode::kFlush;
  fill_rounding_seed(p, expect, op, "checkpoint", checkpoint, rounding_seed);
  launch_checked(op, checkpoint, launch_mamba2_fold, p);
}

void mamba2_materialize(const at::Tensor& checkpoint, const at::Tensor& x_buf, const at::Tensor& B_buf,
                        const at::Tensor& dt_buf, const at::Tensor& num_committed, const at::Tensor& A,
                        const at::Tensor& out, const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "mamba2_materialize";
  const Expect expect{op, checkpoint};
  expect("checkpoint", checkpoint, {-1, -1, -1, -1}, checkpoint_dtypes(), 16);
  expect("out", out, {-1, checkpoint.size(1), checkpoint.size(2), checkpoint.size(3)}, {at::kFloat}, 16);
  checks::writable(op, "out", out);
  Mamba2SpecParams p = fold_params(op, expect, checkpoint, /*written=*/false, std::nullopt, std::nullopt, x_buf,
                                   B_buf, dt_buf, num_committed, A, slots, out.size(0), pad_slot_id);
  p.mode = Mamba2FoldMode::kMaterialize;
  p.state_out = out.data_ptr<float>();
  p.so_row_stride = out.stride(0);
  p.so_head_stride = out.stride(1);
  p.so_p_stride = out.stride(2);
  launch_checked(op, checkpoint, launch_mamba2_fold, p);
}

// ---- every layer in one launch (replayssm_cuda.LayerCaches) ----------------------------------------
//
// The layered ops take the cache tensors of all layers as lists (one entry per layer; read_copies,
// read_scales, rounding_seeds and error_words empty where the layers have none) and the layer table
// that mamba2_layer_table built for them. Layer 0's tensors go through the checks of the per-layer op and
// fill the params; every other layer must have layer 0's shapes, strides and dtypes (checked on every
// call, naming the layer and the tensor), and the kernels read its pointers from the table, whose
// fingerprint of all of the lists' tensors must equal the call's (else they trap).
namespace {

using layer_table_api::LayerList;
using layer_table_api::layer0;

struct LayerLists {
  at::TensorList checkpoints, read_copies, read_scales, x_bufs, B_bufs, dt_bufs, num_committed, num_verified, A,
      rounding_seeds, error_words;

  // The lists in table-record order, with their names, whether a layer may go without (an empty list)
  // and whether layers may share them (A: read only).
  std::vector<LayerList> named() const {
    return {{"checkpoints", checkpoints},     {"read_copies", read_copies, true},
            {"read_scales", read_scales, true}, {"x_bufs", x_bufs},
            {"B_bufs", B_bufs},                 {"dt_bufs", dt_bufs},
            {"num_committed", num_committed}, {"num_verified", num_verified},
            {"A", A, false, true},              {"rounding_seeds", rounding_seeds, true},
            {"error_words", error_words, true}};
  }
};

// What the layered commit, flush and materialize share: the lists checked, layer 0's params, the table.
Mamba2SpecParams layered_fold_params(const char* op, const LayerLists& l, const at::Tensor& table, bool written,
                                     const std::optional<at::Tensor>& slots, int64_t batch, int64_t pad_slot_id,
                                     LayerTableArgs& args) {
  int64_t num_layers = 0;
  const uint64_t fingerprint = layer_table_api::check_layers(op, l.named(), num_layers);
  const at::Tensor& ck = l.checkpoints[0];
  const Expect expect{op, ck, "checkpoints[0]"};
  Mamba2SpecParams p = fold_params(op, expect, ck, written, layer0(l.read_copies), layer0(l.read_scales), l.x_bufs[0],
                                   l.B_bufs[0], l.dt_bufs[0], l.num_committed[0], l.A[0], slots, batch, pad_slot_id);
  fill_num_verified(p, expect, op, l.num_verified[0], l.num_committed[0]);
  args = layer_table_api::table_args(op, "mamba2_layer_table", table, ck, num_layers, fingerprint);
  return p;
}

}  // namespace

at::Tensor mamba2_layer_table(at::TensorList checkpoints, at::TensorList read_copies, at::TensorList read_scales,
                              at::TensorList x_bufs, at::TensorList B_bufs, at::TensorList dt_bufs,
                              at::TensorList num_committed, at::TensorList num_verified, at::TensorList A,
                              at::TensorList rounding_seeds, at::TensorList error_words) {
  constexpr const char* op = "mamba2_layer_table";
  const LayerLists l{checkpoints, read_copies, read_scales, x_bufs, B_bufs, dt_bufs, num_committed, num_verified,
                     A, rounding_seeds, error_words};
  const std::vector<LayerList> lists = l.named();
  int64_t num_layers = 0;
  const uint64_t fingerprint = layer_table_api::check_layers(op, lists, num_layers);
  const at::Tensor& ck = checkpoints[0];
  const Expect expect{op, ck, "checkpoints[0]"};
  // Layer 0 as the per-layer commit checks it (the others have its geometry), with its seed and error word.
  Mamba2SpecParams p = fold_params(op, expect, ck, /*written=*/true, layer0(read_copies), layer0(read_scales),
                                   x_bufs[0], B_bufs[0], dt_bufs[0], num_committed[0], A[0], std::nullopt, 0, -1);
  fill_num_verified(p, expect, op, num_verified[0], num_committed[0]);
  fill_rounding_seed(p, expect, op, "checkpoint", ck, layer0(rounding_seeds));
  error_word_arg(expect, op, layer0(error_words));
  using layer_table_api::layer_ptr;
  return layer_table_api::build_table(op, lists, num_layers, fingerprint, ck, [&](int64_t i, LayerPointers& r) {
    r.checkpoint = checkpoints[i].data_ptr();
    r.read_copy = layer_ptr(read_copies, i);
    r.read_scale = static_cast<float*>(layer_ptr(read_scales, i));
    r.buffers[0] = x_bufs[i].data_ptr();
    r.buffers[1] = B_bufs[i].data_ptr();
    r.buffers[2] = dt_bufs[i].data_ptr();
    r.num_committed = num_committed[i].data_ptr<int32_t>();
    r.num_verified = num_verified[i].data_ptr<int32_t>();
    r.weights[0] = A[i].data_ptr();
    r.rounding_seed = static_cast<int64_t*>(layer_ptr(rounding_seeds, i));
    r.error_word = static_cast<int32_t*>(layer_ptr(error_words, i));
  });
}

void mamba2_commit_layers(const at::Tensor& layer_table, at::TensorList checkpoints, at::TensorList read_copies,
                          at::TensorList read_scales, at::TensorList x_bufs, at::TensorList B_bufs,
                          at::TensorList dt_bufs, at::TensorList num_committed, at::TensorList num_verified,
                          at::TensorList A, at::TensorList rounding_seeds, at::TensorList error_words,
                          const at::Tensor& num_accepted, int64_t max_draft_tokens,
                          const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "mamba2_commit_layers";
  const LayerLists l{checkpoints, read_copies, read_scales, x_bufs, B_bufs, dt_bufs, num_committed, num_verified,
                     A, rounding_seeds, error_words};
  TORCH_CHECK(!checkpoints.empty(), checks::cat(op, ": checkpoints must hold one checkpoint per layer, got none"));
  const Expect expect{op, checkpoints[0], "checkpoints[0]"};
  expect("num_accepted", num_accepted, {-1}, {at::kInt, at::kLong});
  LayerTableArgs args{};
  Mamba2SpecParams p = layered_fold_params(op, l, layer_table, /*written=*/true, slots, num_accepted.size(0),
                                           pad_slot_id, args);
  TORCH_CHECK(max_draft_tokens >= 1 && max_draft_tokens <= p.buffer_len, checks::cat(op, ": max_draft_tokens must be in [1, L = ", p.buffer_len, "], got ", max_draft_tokens));
  p.error_word = error_word_arg(expect, op, layer0(error_words));
  p.mode = Mamba2FoldMode::kCommit;
  p.max_draft_tokens = static_cast<int32_t>(max_draft_tokens);
  p.num_accepted = num_accepted.data_ptr();
  p.num_accepted_dtype = kernel_dtype(num_accepted.scalar_type());
  p.num_accepted_stride = num_accepted.stride(0);
  fill_rounding_seed(p, expect, op, "checkpoint", checkpoints[0], layer0(rounding_seeds));
  const c10::cuda::CUDAGuard device_guard(checkpoints[0].device());
  checks::launched(op, launch_mamba2_fold_layers(p, args, c10::cuda::getCurrentCUDAStream().stream()));
}

void mamba2_flush_layers(const at::Tensor& layer_table, at::TensorList checkpoints, at::TensorList read_copies,
                         at::TensorList read_scales, at::TensorList x_bufs, at::TensorList B_bufs,
                         at::TensorList dt_bufs, at::TensorList num_committed, at::TensorList num_verified,
                         at::TensorList A, at::TensorList rounding_seeds, at::TensorList error_words,
                         const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "mamba2_flush_layers";
  const LayerLists l{checkpoints, read_copies, read_scales, x_bufs, B_bufs, dt_bufs, num_committed, num_verified,
                     A, rounding_seeds, error_words};
  TORCH_CHECK(!checkpoints.empty(), checks::cat(op, ": checkpoints must hold one checkpoint per layer, got none"));
  const Expect expect{op, checkpoints[0], "checkpoints[0]"};
  if (slots) expect("slots", *slots, {-1}, {at::kInt, at::kLong});
  const int64_t batch = slots ? slots->size(0) : checkpoints[0].size(0);
  LayerTableArgs args{};
  Mamba2SpecParams p = layered_fold_params(op, l, layer_table, /*written=*/true, slots, batch, pad_slot_id, args);
  p.mode = Mamba2FoldMode::kFlush;
  fill_rounding_seed(p, expect, op, "checkpoint", checkpoints[0], layer0(rounding_seeds));
  const c10::cuda::CUDAGuard device_guard(checkpoints[0].device());
  checks::launched(op, launch_mamba2_fold_layers(p, args, c10::cuda::getCurrentCUDAStream().stream()));
}

void mamba2_materialize_layers(const at::Tensor& layer_table, at::TensorList checkpoints, at::TensorList read_copies,
                               at::TensorList read_scales, at::TensorList x_bufs, at::TensorList B_bufs,
                               at::TensorList dt_bufs, at::TensorList num_committed, at::TensorList num_verified,
                               at::TensorList A, at::TensorList rounding_seeds, at::TensorList error_words,
                               const at::Tensor& out, const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "mamba2_materialize_layers";
  const LayerLists l{checkpoints, read_copies, read_scales, x_bufs, B_bufs, dt_bufs, num_committed, num_verified,
                     A, rounding_seeds, error_words};
  TORCH_CHECK(!checkpoints.empty(), checks::cat(op, ": checkpoints must hold one checkpoint per layer, got none"));
  const at::Tensor& ck = checkpoints[0];
  const Expect expect{op, ck, "checkpoints[0]"};
  expect("out", out, {static_cast<int64_t>(checkpoints.size()), -1, ck.size(1), ck.size(2), ck.size(3)}, {at::kFloat}, 16);
  checks::writable(op, "out", out);
  LayerTableArgs args{};
  Mamba2SpecParams p = layered_fold_params(op, l, layer_table, /*written=*/false, slots, out.size(1), pad_slot_id, args);
  p.mode = Mamba2FoldMode::kMaterialize;
  p.read_copy = nullptr;  // materialize refreshes nothing: the kernel of mamba2_materialize, without a read copy
  p.read_scale = nullptr;
  p.state_out = out.data_ptr<float>();
  p.so_row_stride = out.stride(1);
  p.so_head_stride = out.stride(2);
  p.so_p_stride = out.stride(3);
  args.out_layer_stride = out.stride(0);
  const c10::cuda::CUDAGuard device_guard(ck.device());
  checks::launched(op, launch_mamba2_fold_layers(p, args, c10::cuda::getCurrentCUDAStream().stream()));
}

}  // namespace replayssm
