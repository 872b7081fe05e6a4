// torch.ops.replayssm.gdn_verify / gdn_commit / gdn_flush / gdn_materialize: validate, fill GdnParams,
// launch on the current stream. Tensor tables and math: families/gdn/params.h and the kernels'
// headers (verify_kernel.cuh, fold_kernel.cuh). No allocation and no host synchronisation, so all are
// safe under CUDA-graph capture.
#include <string>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "api/checks.h"
#include "api/ops.h"
#include "api/tensor_args.h"
#include "families/gdn/params.h"
#include "families/gdn/cache_args.h"

namespace replayssm {
namespace {

// fill_cache's shape facts into the params the kernels read besides the cache.
void fill_dims(GdnParams& p, const at::Tensor& checkpoint, const at::Tensor& k_buf, int64_t H) {
  p.act_dtype = kernel_dtype(k_buf.scalar_type());
  p.heads = static_cast<int32_t>(H);
  p.v_heads = static_cast<int32_t>(checkpoint.size(1));
  p.head_k_dim = static_cast<int32_t>(checkpoint.size(3));
  p.head_v_dim = static_cast<int32_t>(checkpoint.size(2));
}

void launch_checked(const char* op, const at::Tensor& on, cudaError_t (*launcher)(const GdnParams&, cudaStream_t),
                    const GdnParams& p) {
  const c10::cuda::CUDAGuard device_guard(on.device());
  checks::launched(op, launcher(p, c10::cuda::getCurrentCUDAStream().stream()));
}

// What commit, flush and materialize share: the cache (the read copy only where it is refreshed), the
// rows and their slots. `batch` rows; the caller fills the mode and its own tensors.
GdnParams fold_params(const char* op, const Expect& expect, const at::Tensor& checkpoint, bool written,
                      const std::optional<at::Tensor>& read_copy, const std::optional<at::Tensor>& read_scale,
                      const at::Tensor& k_buf, const at::Tensor& v_buf, const at::Tensor& g_buf,
                      const at::Tensor& beta_buf, const at::Tensor& u_buf, const at::Tensor& num_committed,
                      bool use_qk_l2norm, const std::optional<at::Tensor>& slots, int64_t batch, int64_t pad_slot_id) {
  GdnParams p{};
  const int64_t H = gdn_api::fill_cache(p.cache, expect, op, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf,
                                        beta_buf, u_buf, num_committed, written, /*buffers_written=*/false);
  fill_dims(p, checkpoint, k_buf, H);
  TORCH_CHECK(batch * p.v_heads <= INT32_MAX, checks::cat(op, ": the number of rows times v-heads must be < 2^31, got ", batch, " x ", static_cast<int64_t>(p.v_heads)));
  gdn_api::fill_slots(p, expect, op, slots, batch, pad_slot_id, checkpoint.size(0));
  p.batch = static_cast<int32_t>(batch);
  p.tokens.use_qk_l2norm = use_qk_l2norm;
  return p;
}

}  // namespace

void gdn_verify(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,
                const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
                const at::Tensor& num_committed, const at::Tensor& num_verified, const at::Tensor& q,
                const at::Tensor& k, const at::Tensor& v, const at::Tensor& a, const at::Tensor& b,
                const at::Tensor& A_log, const at::Tensor& dt_bias, const at::Tensor& out, std::optional<double> scale,
                bool use_qk_l2norm, const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                const std::optional<at::Tensor>& error_word) {
  constexpr const char* op = "gdn_verify";
  const Expect expect{op, checkpoint, "checkpoint"};
  GdnParams p{};
  const int64_t H = gdn_api::fill_cache(p.cache, expect, op, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf,
                                        beta_buf, u_buf, num_committed, /*written=*/false, /*buffers_written=*/true);
  gdn_api::fill_num_verified(p.cache, expect, op, num_verified, num_committed);
  const int64_t HV = checkpoint.size(1), V = checkpoint.size(2), K = checkpoint.size(3), L = p.cache.buffer_len;
  const auto act = k_buf.scalar_type();
  checks::cache_activation(op, "q", q, "k_buf", act);
  expect("q", q, {-1, -1, H, K}, {act}, 16);
  const int64_t T = q.size(1);
  const int64_t max_T = L < kGdnMaxDraftTokens ? L : kGdnMaxDraftTokens;
  TORCH_CHECK(T >= 1 && T <= max_T, checks::cat(op, ": the number of draft tokens T (q.size(1)) must be in [1, min(L = ", L, ", ", static_cast<int64_t>(kGdnMaxDraftTokens), ")], got ", T));
  const int64_t batch = gdn_api::fill_tokens(p, expect, op, H, HV, K, V, act, /*act_from_cache=*/true,
                                             /*has_tokens=*/true, q, k, v, a, b, A_log, dt_bias, out, scale,
                                             use_qk_l2norm);
  gdn_api::fill_slots(p, expect, op, slots, batch, pad_slot_id, checkpoint.size(0));
  p.error_word = error_word_arg(expect, op, error_word);
  launch_checked(op, checkpoint, launch_gdn_verify, p);
}

void gdn_commit(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,
                const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
                const at::Tensor& num_committed, const at::Tensor& num_verified, const at::Tensor& num_accepted,
                int64_t max_draft_tokens, bool use_qk_l2norm, const std::optional<at::Tensor>& slots,
                int64_t pad_slot_id, const std::optional<at::Tensor>& error_word) {
  constexpr const char* op = "gdn_commit";
  const Expect expect{op, checkpoint, "checkpoint"};
  expect("num_accepted", num_accepted, {-1}, {at::kInt, at::kLong});
  GdnParams p = fold_params(op, expect, checkpoint, /*written=*/true, read_copy, read_scale, k_buf, v_buf, g_buf,
                            beta_buf, u_buf, num_committed, use_qk_l2norm, slots, num_accepted.size(0), pad_slot_id);
  const int64_t L = p.cache.buffer_len;
  TORCH_CHECK(max_draft_tokens >= 1 && max_draft_tokens <= L, checks::cat(op, ": max_draft_tokens must be in [1, L = ", L, "], got ", max_draft_tokens));
  gdn_api::fill_num_verified(p.cache, expect, op, num_verified, num_committed);
  p.error_word = error_word_arg(expect, op, error_word);
  p.mode = GdnFoldMode::kCommit;
  p.cache.max_draft_tokens = static_cast<int32_t>(max_draft_tokens);
  p.num_accepted = num_accepted.data_ptr();
  p.num_accepted_dtype = kernel_dtype(num_accepted.scalar_type());
  p.num_accepted_stride = num_accepted.stride(0);
  launch_checked(op, checkpoint, launch_gdn_fold, p);
}

void gdn_flush(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
               const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,
               const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
               const at::Tensor& num_committed, bool use_qk_l2norm, const std::optional<at::Tensor>& slots,
               int64_t pad_slot_id) {
  constexpr const char* op = "gdn_flush";
  const Expect expect{op, checkpoint, "checkpoint"};
  if (slots) expect("slots", *slots, {-1}, {at::kInt, at::kLong});
  const int64_t batch = slots ? slots->size(0) : checkpoint.size(0);
  GdnParams p = fold_params(op, expect, checkpoint, /*written=*/true, read_copy, read_scale, k_buf, v_buf, g_buf,
                            beta_buf, u_buf, num_committed, use_qk_l2norm, slots, batch, pad_slot_id);
  p.mode = GdnFoldMode::kFlush;
  launch_checked(op, checkpoint, launch_gdn_fold, p);
}

void gdn_materialize(const at::Tensor& checkpoint, const at::Tensor& k_buf, const at::Tensor& v_buf,
                     const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
                     const at::Tensor& num_committed, const at::Tensor& out, bool use_qk_l2norm,
                     const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "gdn_materialize";
  const Expect expect{op, checkpoint, "checkpoint"};
  expect("checkpoint", checkpoint, {-1, -1, -1, -1}, gdn_api::checkpoint_dtypes(), 16);
  expect("out", out, {-1, checkpoint.size(1), checkpoint.size(2), checkpoint.size(3)}, {at::kFloat}, 16);
  checks::writable(op, "out", out);
  GdnParams p = fold_params(op, expect, checkpoint, /*written=*/false, std::nullopt, std::nullopt, k_buf, v_buf, g_buf,
                            beta_buf, u_buf, num_committed, use_qk_l2norm, slots, out.size(0), pad_slot_id);
  p.mode = GdnFoldMode::kMaterialize;
  p.state_out = out.data_ptr<float>();
  p.so_row_stride = out.stride(0);
  p.so_head_stride = out.stride(1);
  p.so_v_stride = out.stride(2);
  launch_checked(op, checkpoint, launch_gdn_fold, p);
}

}  // namespace replayssm
