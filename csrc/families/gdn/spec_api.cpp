// torch.ops.replayssm.gdn_verify / gdn_commit / gdn_flush / gdn_materialize and their layered forms
// (gdn_*_layers, with _C.gdn_layer_table), and KDA's kda_commit / kda_flush / kda_materialize (the same
// fold kernel with the decay per key channel, GdnGate::kVector): validate, fill GdnParams, launch on the current stream. Tensor tables and math: families/gdn/params.h and the kernels'
// headers (verify_kernel.cuh, fold_kernel.cuh). No allocation and no host synchronisation, so all are
// safe under CUDA-graph capture.
#include <string>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "api/checks.h"
#include "api/layer_table_api.h"
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
                      bool use_qk_l2norm, const std::optional<at::Tensor>& slots, int64_t batch, int64_t pad_slot_id,
                      GdnGate gate = GdnGate::kScalar) {
  GdnParams p{};
  const int64_t H = gdn_api::fill_cache(p.cache, expect, op, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf,
                                        beta_buf, u_buf, num_committed, written, /*buffers_written=*/false, gate,
                                        &p.kda.gb_entry_stride);
  p.gate = gate;
  fill_dims(p, checkpoint, k_buf, H);
  const int max_L = gdn_fold_max_buffer_len(gate, p.head_k_dim, p.head_v_dim, p.cache.checkpoint_dtype);
  TORCH_CHECK(p.cache.buffer_len <= max_L, checks::cat(op, ": the buffer length L (k_buf.size(2)) must be <= ", max_L, " with a ", checks::dtype_str(checkpoint.scalar_type()), " checkpoint of (head_v_dim, head_k_dim) = (", p.head_v_dim, ", ", p.head_k_dim, ") (the fold keeps the window's decay per key channel beside the checkpoint tile in a CTA's shared memory), got ", p.cache.buffer_len));
  TORCH_CHECK(batch * p.v_heads <= INT32_MAX, checks::cat(op, ": the number of rows times v-heads must be < 2^31, got ", batch, " x ", static_cast<int64_t>(p.v_heads)));
  gdn_api::fill_slots(p, expect, op, slots, batch, pad_slot_id, checkpoint.size(0));
  p.batch = static_cast<int32_t>(batch);
  p.tokens.use_qk_l2norm = use_qk_l2norm;
  return p;
}

}  // namespace

namespace {

void verify(const char* op, GdnGate gate, const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,
                const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
                const at::Tensor& num_committed, const at::Tensor& num_verified, const at::Tensor& q,
                const at::Tensor& k, const at::Tensor& v, const at::Tensor& a, const at::Tensor& b,
                const at::Tensor& A_log, const at::Tensor& dt_bias, const at::Tensor& out, std::optional<double> scale,
                bool use_qk_l2norm, const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                const std::optional<at::Tensor>& error_word) {
  const Expect expect{op, checkpoint, "checkpoint"};
  GdnParams p{};
  const int64_t H = gdn_api::fill_cache(p.cache, expect, op, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf,
                                        beta_buf, u_buf, num_committed, /*written=*/false, /*buffers_written=*/true, gate,
                                        &p.kda.gb_entry_stride);
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
                                             use_qk_l2norm, gate);
  gdn_api::fill_slots(p, expect, op, slots, batch, pad_slot_id, checkpoint.size(0));
  p.error_word = error_word_arg(expect, op, error_word);
  launch_checked(op, checkpoint, launch_gdn_verify, p);
}

void commit(const char* op, GdnGate gate, const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,
                const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
                const at::Tensor& num_committed, const at::Tensor& num_verified, const at::Tensor& num_accepted,
                int64_t max_draft_tokens, bool use_qk_l2norm, const std::optional<at::Tensor>& slots,
                int64_t pad_slot_id, const std::optional<at::Tensor>& error_word) {
  const Expect expect{op, checkpoint, "checkpoint"};
  expect("num_accepted", num_accepted, {-1}, {at::kInt, at::kLong});
  GdnParams p = fold_params(op, expect, checkpoint, /*written=*/true, read_copy, read_scale, k_buf, v_buf, g_buf,
                            beta_buf, u_buf, num_committed, use_qk_l2norm, slots, num_accepted.size(0), pad_slot_id, gate);
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

void flush(const char* op, GdnGate gate, const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
               const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,
               const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
               const at::Tensor& num_committed, bool use_qk_l2norm, const std::optional<at::Tensor>& slots,
               int64_t pad_slot_id) {
  const Expect expect{op, checkpoint, "checkpoint"};
  if (slots) expect("slots", *slots, {-1}, {at::kInt, at::kLong});
  const int64_t batch = slots ? slots->size(0) : checkpoint.size(0);
  GdnParams p = fold_params(op, expect, checkpoint, /*written=*/true, read_copy, read_scale, k_buf, v_buf, g_buf,
                            beta_buf, u_buf, num_committed, use_qk_l2norm, slots, batch, pad_slot_id, gate);
  p.mode = GdnFoldMode::kFlush;
  launch_checked(op, checkpoint, launch_gdn_fold, p);
}

void materialize(const char* op, GdnGate gate, const at::Tensor& checkpoint, const at::Tensor& k_buf, const at::Tensor& v_buf,
                     const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
                     const at::Tensor& num_committed, const at::Tensor& out, bool use_qk_l2norm,
                     const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  const Expect expect{op, checkpoint, "checkpoint"};
  expect("checkpoint", checkpoint, {-1, -1, -1, -1}, gdn_api::checkpoint_dtypes(), 16);
  expect("out", out, {-1, checkpoint.size(1), checkpoint.size(2), checkpoint.size(3)}, {at::kFloat}, 16);
  checks::writable(op, "out", out);
  GdnParams p = fold_params(op, expect, checkpoint, /*written=*/false, std::nullopt, std::nullopt, k_buf, v_buf, g_buf,
                            beta_buf, u_buf, num_committed, use_qk_l2norm, slots, out.size(0), pad_slot_id, gate);
  p.mode = GdnFoldMode::kMaterialize;
  p.state_out = out.data_ptr<float>();
  p.so_row_stride = out.stride(0);
  p.so_head_stride = out.stride(1);
  p.so_v_stride = out.stride(2);
  launch_checked(op, checkpoint, launch_gdn_fold, p);
}

}  // namespace

#define REPLAYSSM_FOLD_OPS(family, gate)                                                                          \
  void family##_verify(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,                  \
                       const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf, \
                       const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,               \
                       const at::Tensor& num_committed, const at::Tensor& num_verified, const at::Tensor& q,       \
                       const at::Tensor& k, const at::Tensor& v, const at::Tensor& a, const at::Tensor& b,         \
                       const at::Tensor& A_log, const at::Tensor& dt_bias, const at::Tensor& out,                  \
                       std::optional<double> scale, bool use_qk_l2norm, const std::optional<at::Tensor>& slots,    \
                       int64_t pad_slot_id, const std::optional<at::Tensor>& error_word) {                         \
    verify(#family "_verify", gate, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf,       \
           num_committed, num_verified, q, k, v, a, b, A_log, dt_bias, out, scale, use_qk_l2norm, slots,           \
           pad_slot_id, error_word);                                                                               \
  }                                                                                                                \
  void family##_commit(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,                  \
                       const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf, \
                       const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,               \
                       const at::Tensor& num_committed, const at::Tensor& num_verified,                            \
                       const at::Tensor& num_accepted, int64_t max_draft_tokens, bool use_qk_l2norm,               \
                       const std::optional<at::Tensor>& slots, int64_t pad_slot_id,                                \
                       const std::optional<at::Tensor>& error_word) {                                              \
    commit(#family "_commit", gate, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf,       \
           num_committed, num_verified, num_accepted, max_draft_tokens, use_qk_l2norm, slots, pad_slot_id,        \
           error_word);                                                                                            \
  }                                                                                                                \
  void family##_flush(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,                   \
                      const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf, \
                      const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,                \
                      const at::Tensor& num_committed, bool use_qk_l2norm, const std::optional<at::Tensor>& slots, \
                      int64_t pad_slot_id) {                                                                       \
    flush(#family "_flush", gate, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf,         \
          num_committed, use_qk_l2norm, slots, pad_slot_id);                                                       \
  }                                                                                                                \
  void family##_materialize(const at::Tensor& checkpoint, const at::Tensor& k_buf, const at::Tensor& v_buf,        \
                            const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,          \
                            const at::Tensor& num_committed, const at::Tensor& out, bool use_qk_l2norm,            \
                            const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {                         \
    materialize(#family "_materialize", gate, checkpoint, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed, out, \
                use_qk_l2norm, slots, pad_slot_id);                                                                \
  }

REPLAYSSM_FOLD_OPS(gdn, GdnGate::kScalar)
REPLAYSSM_FOLD_OPS(kda, GdnGate::kVector)
#undef REPLAYSSM_FOLD_OPS

// ---- every layer in one launch (replayssm_cuda.LayerCaches) ----------------------------------------
//
// As the Mamba-2 layered ops (families/mamba2/ops_api.cpp): the cache tensors of all layers as lists
// (read_copies, read_scales and error_words empty where the layers have none) and the layer table that
// gdn_layer_table built for them. Layer 0's tensors go through the checks of the per-layer op and fill
// the params; every other layer must have layer 0's shapes, strides and dtypes (checked on every call,
// naming the layer and the tensor), and the kernels read its pointers from the table, whose fingerprint
// of all of the lists' tensors must equal the call's (else they trap). GDN's fold reads no weights and
// has no rounding seed: the record's buffers are k_buf, v_buf, g_buf, beta_buf, u_buf.
namespace {

using layer_table_api::LayerList;
using layer_table_api::layer0;

struct GdnLayerLists {
  at::TensorList checkpoints, read_copies, read_scales, k_bufs, v_bufs, g_bufs, beta_bufs, u_bufs, num_committed,
      num_verified, error_words;

  // The lists in table-record order, with their names and whether a layer may go without (an empty list).
  std::vector<LayerList> named() const {
    return {{"checkpoints", checkpoints},     {"read_copies", read_copies, true},
            {"read_scales", read_scales, true}, {"k_bufs", k_bufs},
            {"v_bufs", v_bufs},                 {"g_bufs", g_bufs},
            {"beta_bufs", beta_bufs},           {"u_bufs", u_bufs},
            {"num_committed", num_committed}, {"num_verified", num_verified},
            {"error_words", error_words, true}};
  }
};

// Layer 0's params as the per-layer op fills them (the read copy only where `refresh`: commit and
// flush), num_verified checked; the lists checked against layer 0.
GdnParams layer0_params(const char* op, const GdnLayerLists& l, bool written, bool refresh, bool use_qk_l2norm,
                        const std::optional<at::Tensor>& slots, int64_t batch, int64_t pad_slot_id,
                        int64_t& num_layers, uint64_t& fingerprint) {
  fingerprint = layer_table_api::check_layers(op, l.named(), num_layers);
  const at::Tensor& ck = l.checkpoints[0];
  const Expect expect{op, ck, "checkpoints[0]"};
  GdnParams p = fold_params(op, expect, ck, written, refresh ? layer0(l.read_copies) : std::nullopt,
                            refresh ? layer0(l.read_scales) : std::nullopt, l.k_bufs[0], l.v_bufs[0], l.g_bufs[0],
                            l.beta_bufs[0], l.u_bufs[0], l.num_committed[0], use_qk_l2norm, slots, batch, pad_slot_id);
  gdn_api::fill_num_verified(p.cache, expect, op, l.num_verified[0], l.num_committed[0]);
  return p;
}

// What the layered commit, flush and materialize share: layer 0's params and the table argument.
GdnParams layered_fold_params(const char* op, const GdnLayerLists& l, const at::Tensor& table, bool written,
                              bool refresh, bool use_qk_l2norm, const std::optional<at::Tensor>& slots, int64_t batch,
                              int64_t pad_slot_id, LayerTableArgs& args) {
  int64_t num_layers = 0;
  uint64_t fingerprint = 0;
  GdnParams p = layer0_params(op, l, written, refresh, use_qk_l2norm, slots, batch, pad_slot_id, num_layers,
                              fingerprint);
  args = layer_table_api::table_args(op, "gdn_layer_table", table, l.checkpoints[0], num_layers, fingerprint);
  return p;
}

void launch_layers_checked(const char* op, const at::Tensor& on, const GdnParams& p, const LayerTableArgs& args) {
  const c10::cuda::CUDAGuard device_guard(on.device());
  checks::launched(op, launch_gdn_fold_layers(p, args, c10::cuda::getCurrentCUDAStream().stream()));
}

}  // namespace

at::Tensor gdn_layer_table(at::TensorList checkpoints, at::TensorList read_copies, at::TensorList read_scales,
                           at::TensorList k_bufs, at::TensorList v_bufs, at::TensorList g_bufs,
                           at::TensorList beta_bufs, at::TensorList u_bufs, at::TensorList num_committed,
                           at::TensorList num_verified, at::TensorList error_words) {
  constexpr const char* op = "gdn_layer_table";
  const GdnLayerLists l{checkpoints, read_copies, read_scales, k_bufs, v_bufs, g_bufs, beta_bufs, u_bufs,
                        num_committed, num_verified, error_words};
  int64_t num_layers = 0;
  uint64_t fingerprint = 0;
  // Layer 0 as the per-layer commit checks it (the others have its geometry), with its error word.
  layer0_params(op, l, /*written=*/true, /*refresh=*/true, /*use_qk_l2norm=*/false, std::nullopt, 0, -1, num_layers,
                fingerprint);
  error_word_arg(Expect{op, checkpoints[0], "checkpoints[0]"}, op, layer0(error_words));
  using layer_table_api::layer_ptr;
  return layer_table_api::build_table(op, l.named(), num_layers, fingerprint, checkpoints[0],
                                      [&](int64_t i, LayerPointers& r) {
    r.checkpoint = checkpoints[i].data_ptr();
    r.read_copy = layer_ptr(read_copies, i);
    r.read_scale = static_cast<float*>(layer_ptr(read_scales, i));
    r.buffers[0] = k_bufs[i].data_ptr();
    r.buffers[1] = v_bufs[i].data_ptr();
    r.buffers[2] = g_bufs[i].data_ptr();
    r.buffers[3] = beta_bufs[i].data_ptr();
    r.buffers[4] = u_bufs[i].data_ptr();
    r.num_committed = num_committed[i].data_ptr<int32_t>();
    r.num_verified = num_verified[i].data_ptr<int32_t>();
    r.error_word = static_cast<int32_t*>(layer_ptr(error_words, i));
  });
}

void gdn_commit_layers(const at::Tensor& layer_table, at::TensorList checkpoints, at::TensorList read_copies,
                       at::TensorList read_scales, at::TensorList k_bufs, at::TensorList v_bufs, at::TensorList g_bufs,
                       at::TensorList beta_bufs, at::TensorList u_bufs, at::TensorList num_committed,
                       at::TensorList num_verified, at::TensorList error_words, const at::Tensor& num_accepted,
                       int64_t max_draft_tokens, bool use_qk_l2norm, const std::optional<at::Tensor>& slots,
                       int64_t pad_slot_id) {
  constexpr const char* op = "gdn_commit_layers";
  const GdnLayerLists l{checkpoints, read_copies, read_scales, k_bufs, v_bufs, g_bufs, beta_bufs, u_bufs,
                        num_committed, num_verified, error_words};
  TORCH_CHECK(!checkpoints.empty(), checks::cat(op, ": checkpoints must hold one checkpoint per layer, got none"));
  const Expect expect{op, checkpoints[0], "checkpoints[0]"};
  expect("num_accepted", num_accepted, {-1}, {at::kInt, at::kLong});
  LayerTableArgs args{};
  GdnParams p = layered_fold_params(op, l, layer_table, /*written=*/true, /*refresh=*/true, use_qk_l2norm, slots,
                                    num_accepted.size(0), pad_slot_id, args);
  const int64_t L = p.cache.buffer_len;
  TORCH_CHECK(max_draft_tokens >= 1 && max_draft_tokens <= L, checks::cat(op, ": max_draft_tokens must be in [1, L = ", L, "], got ", max_draft_tokens));
  p.error_word = error_word_arg(expect, op, layer0(error_words));
  p.mode = GdnFoldMode::kCommit;
  p.cache.max_draft_tokens = static_cast<int32_t>(max_draft_tokens);
  p.num_accepted = num_accepted.data_ptr();
  p.num_accepted_dtype = kernel_dtype(num_accepted.scalar_type());
  p.num_accepted_stride = num_accepted.stride(0);
  launch_layers_checked(op, checkpoints[0], p, args);
}

void gdn_flush_layers(const at::Tensor& layer_table, at::TensorList checkpoints, at::TensorList read_copies,
                      at::TensorList read_scales, at::TensorList k_bufs, at::TensorList v_bufs, at::TensorList g_bufs,
                      at::TensorList beta_bufs, at::TensorList u_bufs, at::TensorList num_committed,
                      at::TensorList num_verified, at::TensorList error_words, bool use_qk_l2norm,
                      const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "gdn_flush_layers";
  const GdnLayerLists l{checkpoints, read_copies, read_scales, k_bufs, v_bufs, g_bufs, beta_bufs, u_bufs,
                        num_committed, num_verified, error_words};
  TORCH_CHECK(!checkpoints.empty(), checks::cat(op, ": checkpoints must hold one checkpoint per layer, got none"));
  const Expect expect{op, checkpoints[0], "checkpoints[0]"};
  if (slots) expect("slots", *slots, {-1}, {at::kInt, at::kLong});
  const int64_t batch = slots ? slots->size(0) : checkpoints[0].size(0);
  LayerTableArgs args{};
  GdnParams p = layered_fold_params(op, l, layer_table, /*written=*/true, /*refresh=*/true, use_qk_l2norm, slots,
                                    batch, pad_slot_id, args);
  p.mode = GdnFoldMode::kFlush;
  launch_layers_checked(op, checkpoints[0], p, args);
}

void gdn_materialize_layers(const at::Tensor& layer_table, at::TensorList checkpoints, at::TensorList read_copies,
                            at::TensorList read_scales, at::TensorList k_bufs, at::TensorList v_bufs,
                            at::TensorList g_bufs, at::TensorList beta_bufs, at::TensorList u_bufs,
                            at::TensorList num_committed, at::TensorList num_verified, at::TensorList error_words,
                            const at::Tensor& out, bool use_qk_l2norm, const std::optional<at::Tensor>& slots,
                            int64_t pad_slot_id) {
  constexpr const char* op = "gdn_materialize_layers";
  const GdnLayerLists l{checkpoints, read_copies, read_scales, k_bufs, v_bufs, g_bufs, beta_bufs, u_bufs,
                        num_committed, num_verified, error_words};
  TORCH_CHECK(!checkpoints.empty(), checks::cat(op, ": checkpoints must hold one checkpoint per layer, got none"));
  const at::Tensor& ck = checkpoints[0];
  const Expect expect{op, ck, "checkpoints[0]"};
  expect("checkpoints[0]", ck, {-1, -1, -1, -1}, gdn_api::checkpoint_dtypes(), 16);
  expect("out", out, {static_cast<int64_t>(checkpoints.size()), -1, ck.size(1), ck.size(2), ck.size(3)}, {at::kFloat}, 16);
  checks::writable(op, "out", out);
  LayerTableArgs args{};
  // materialize refreshes nothing: the kernel of gdn_materialize, without a read copy.
  GdnParams p = layered_fold_params(op, l, layer_table, /*written=*/false, /*refresh=*/false, use_qk_l2norm, slots,
                                    out.size(1), pad_slot_id, args);
  p.mode = GdnFoldMode::kMaterialize;
  p.state_out = out.data_ptr<float>();
  p.so_row_stride = out.stride(1);
  p.so_head_stride = out.stride(2);
  p.so_v_stride = out.stride(3);
  args.out_layer_stride = out.stride(0);
  launch_layers_checked(op, ck, p, args);
}

}  // namespace replayssm
