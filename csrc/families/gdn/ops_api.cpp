// torch.ops.replayssm.gdn_update / gdn_update_snapshots / gdn_step and KDA's kda_update /
// kda_update_snapshots / kda_step (the same kernels with the decay per key channel, GdnGate::kVector):
// validate, fill GdnParams, launch on the current stream. Tensor tables and math: families/gdn/params.h
// and the kernels (update.cu, snapshots.cu, step_kernel.cuh). No allocation and no host synchronisation, so all are safe under
// CUDA-graph capture.
#include <optional>
#include <string>
#include <vector>

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "api/checks.h"
#include "api/ops.h"
#include "api/tensor_args.h"
#include "diag/cta_timeline_api.h"
#include "launch/overrides.h"
#include "families/gdn/cache_args.h"
#include "families/gdn/params.h"

namespace replayssm {
namespace {

void launch_checked(const char* op, const at::Tensor& on, cudaError_t (*launcher)(const GdnParams&, cudaStream_t),
                    const GdnParams& p) {
  const c10::cuda::CUDAGuard device_guard(on.device());
  checks::launched(op, launcher(p, c10::cuda::getCurrentCUDAStream().stream()));
}

// The state of the conventional ops: (slots, HV, V, K) of a table state dtype, 16-byte rows. Fills the
// checkpoint fields of the cache (the state is the update's checkpoint).
void fill_state(GdnParams& p, const Expect& expect, const char* op, const at::Tensor& state) {
  expect("state", state, {-1, -1, -1, -1}, gdn_api::state_dtypes(), 16);
  gdn_api::check_shape(op, "state", state.size(3), state.size(2));
  GdnCache& c = p.cache;
  c.checkpoint = state.data_ptr();
  c.checkpoint_dtype = kernel_dtype(state.scalar_type());
  c.ck_slot_stride = state.stride(0);
  c.ck_head_stride = state.stride(1);
  c.ck_row_stride = state.stride(2);
}

// q's heads: HV must be a multiple of them.
int64_t qk_heads(const char* op, const at::Tensor& q, int64_t HV, int head_dim) {
  checks::cuda(op, "q", q);
  TORCH_CHECK(q.dim() > head_dim, checks::cat(op, ": q must have ", head_dim + 2, " dims, got shape ", checks::shape_str(q.sizes())));
  const int64_t H = q.size(head_dim);
  TORCH_CHECK(H >= 1 && HV % H == 0, checks::cat(op, ": the number of v-heads (", HV, ") must be a multiple of the number of q/k heads (q.size(", head_dim, ")), got ", H));
  return H;
}

void update(const char* op, GdnGate gate, const at::Tensor& state, const at::Tensor& q, const at::Tensor& k,
            const at::Tensor& v, const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log,
            const at::Tensor& dt_bias, const at::Tensor& out, std::optional<double> scale, bool use_qk_l2norm,
            const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  const Expect expect{op, state, "state"};
  GdnParams p{};
  fill_state(p, expect, op, state);
  checks::writable(op, "state", state);
  const int64_t HV = state.size(1), V = state.size(2), K = state.size(3);
  const int64_t H = qk_heads(op, q, HV, 1);
  const auto act = q.scalar_type();
  expect("q", q, {-1, H, K}, gdn_api::activation_dtypes(), 16);
  const int64_t batch = gdn_api::fill_tokens(p, expect, op, H, HV, K, V, act, /*act_from_cache=*/false,
                                             /*has_tokens=*/false, q, k, v, a, b, A_log, dt_bias, out, scale,
                                             use_qk_l2norm, gate);
  gdn_api::fill_slots(p, expect, op, slots, batch, pad_slot_id, state.size(0));
  launch_checked(op, state, launch_gdn_update, p);
}

void update_snapshots(const char* op, GdnGate gate, const at::Tensor& state, const at::Tensor& q,
                      const at::Tensor& k, const at::Tensor& v, const at::Tensor& a, const at::Tensor& b,
                      const at::Tensor& A_log, const at::Tensor& dt_bias, const at::Tensor& out,
                      const at::Tensor& snapshots, std::optional<double> scale, bool use_qk_l2norm,
                      const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  const Expect expect{op, state, "state"};
  GdnParams p{};
  fill_state(p, expect, op, state);
  const int64_t HV = state.size(1), V = state.size(2), K = state.size(3);
  const int64_t H = qk_heads(op, q, HV, 2);
  const auto act = q.scalar_type();
  expect("q", q, {-1, -1, H, K}, gdn_api::activation_dtypes(), 16);
  const int64_t T = q.size(1);
  TORCH_CHECK(T >= 1 && T <= kGdnMaxDraftTokens, checks::cat(op, ": the number of tokens T (q.size(1)) must be in [1, ", kGdnMaxDraftTokens, "], got ", T));
  const int64_t batch = gdn_api::fill_tokens(p, expect, op, H, HV, K, V, act, /*act_from_cache=*/false,
                                             /*has_tokens=*/true, q, k, v, a, b, A_log, dt_bias, out, scale,
                                             use_qk_l2norm, gate);
  expect("snapshots", snapshots, {batch, T, HV, V, K}, {state.scalar_type()}, 16);
  checks::writable(op, "snapshots", snapshots);
  checks::no_overlap(op, "snapshots", snapshots, "state", state);
  checks::no_overlap(op, "out", out, "snapshots", snapshots);
  p.snapshots = snapshots.data_ptr();
  p.sn_row_stride = snapshots.stride(0);
  p.sn_token_stride = snapshots.stride(1);
  p.sn_head_stride = snapshots.stride(2);
  p.sn_v_stride = snapshots.stride(3);
  gdn_api::fill_slots(p, expect, op, slots, batch, pad_slot_id, state.size(0));
  launch_checked(op, state, launch_gdn_update_snapshots, p);
}

void step(const char* op, GdnGate gate, const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
          const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,
          const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
          const at::Tensor& num_committed, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
          const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log, const at::Tensor& dt_bias,
          const at::Tensor& out, std::optional<double> scale, bool use_qk_l2norm, int64_t max_draft_tokens,
          const std::optional<at::Tensor>& slots, int64_t pad_slot_id, bool staggered_flush) {
  const Expect expect{op, checkpoint, "checkpoint"};
  GdnParams p{};
  const int64_t H = gdn_api::fill_cache(p.cache, expect, op, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf,
                                        beta_buf, u_buf, num_committed, /*written=*/true, /*buffers_written=*/true, gate,
                                        &p.kda.gb_entry_stride);
  const int64_t S = checkpoint.size(0), HV = checkpoint.size(1), V = checkpoint.size(2), K = checkpoint.size(3);
  const int64_t L = p.cache.buffer_len;
  TORCH_CHECK(max_draft_tokens >= 1 && max_draft_tokens <= L, checks::cat(op, ": max_draft_tokens must be in [1, L = ", L, "], got ", max_draft_tokens));
  p.cache.max_draft_tokens = static_cast<int32_t>(max_draft_tokens);
  TORCH_CHECK(HV <= 32767, checks::cat(op, ": the number of v-heads must be <= 32767 (the cursor carries per-launch head tickets), got ", HV));
  const int64_t batch = gdn_api::fill_tokens(p, expect, op, H, HV, K, V, k_buf.scalar_type(), /*act_from_cache=*/true,
                                             /*has_tokens=*/false, q, k, v, a, b, A_log, dt_bias, out, scale,
                                             use_qk_l2norm, gate);
  gdn_api::fill_slots(p, expect, op, slots, batch, pad_slot_id, S);
  p.staggered_flush = staggered_flush;
  // The order pass's workspace (the folding rows first; launch/gdn_policy.h says where it runs), from the
  // caching allocator on the current stream: under graph capture from the graph's pool, reused in stream
  // order after the launch.
  at::Tensor row_order;
  if ((staggered_flush || launch::launch_overrides().gdn_step_order == 2) && batch > 0) {
    row_order = at::empty({3 * batch}, checkpoint.options().dtype(at::kInt));
    p.row_order = row_order.data_ptr<int32_t>();
  }
  attach_cta_timeline(p);
  launch_checked(op, checkpoint, launch_gdn_step, p);
}

}  // namespace

// The ops of one family (api/ops.h): GDN's scalar gate or KDA's vector gate, the op named in messages.
#define REPLAYSSM_UPDATE_STEP_OPS(family, gate)                                                                      \
  void family##_update(const at::Tensor& state, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,       \
                       const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log, const at::Tensor& dt_bias,  \
                       const at::Tensor& out, std::optional<double> scale, bool use_qk_l2norm,                        \
                       const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {                                 \
    update(#family "_update", gate, state, q, k, v, a, b, A_log, dt_bias, out, scale, use_qk_l2norm, slots,          \
           pad_slot_id);                                                                                              \
  }                                                                                                                   \
  void family##_update_snapshots(const at::Tensor& state, const at::Tensor& q, const at::Tensor& k,                  \
                                 const at::Tensor& v, const at::Tensor& a, const at::Tensor& b,                      \
                                 const at::Tensor& A_log, const at::Tensor& dt_bias, const at::Tensor& out,          \
                                 const at::Tensor& snapshots, std::optional<double> scale, bool use_qk_l2norm,       \
                                 const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {                      \
    update_snapshots(#family "_update_snapshots", gate, state, q, k, v, a, b, A_log, dt_bias, out, snapshots, scale, \
                     use_qk_l2norm, slots, pad_slot_id);                                                              \
  }                                                                                                                   \
  void family##_step(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,                       \
                     const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,  \
                     const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,                   \
                     const at::Tensor& num_committed, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, \
                     const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log, const at::Tensor& dt_bias,   \
                     const at::Tensor& out, std::optional<double> scale, bool use_qk_l2norm,                         \
                     int64_t max_draft_tokens, const std::optional<at::Tensor>& slots, int64_t pad_slot_id,          \
                     bool staggered_flush) {                                                                         \
    step(#family "_step", gate, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf,             \
         num_committed, q, k, v, a, b, A_log, dt_bias, out, scale, use_qk_l2norm, max_draft_tokens, slots,           \
         pad_slot_id, staggered_flush);                                                                              \
  }

REPLAYSSM_UPDATE_STEP_OPS(gdn, GdnGate::kScalar)
REPLAYSSM_UPDATE_STEP_OPS(kda, GdnGate::kVector)
#undef REPLAYSSM_UPDATE_STEP_OPS

}  // namespace replayssm
