// Gated DeltaNet speculative decoding: run-time choice of the compiled (K, V) instantiation of the
// verify and fold kernels (verify_kernel.cuh, fold_kernel.cuh), and the cursor kernel that commit and
// flush launch after their fold (cache/fold_cursor.h, the same for every family).
#include <type_traits>

#include "cache/fold_cursor.h"
#include "families/gdn/params.h"
#include "families/gdn/variants.h"

namespace replayssm {
namespace gdn {
template <int kK, int kV>
cudaError_t launch_verify_shape(const GdnParams& p, cudaStream_t stream);
template <int kK, int kV>
cudaError_t launch_fold_shape(const GdnParams& p, const LayerTableArgs* layers, cudaStream_t stream);

namespace {

bool common_params_ok(const GdnParams& p) {
  const GdnCache& c = p.cache;
  return p.heads >= 1 && p.v_heads >= 1 && p.v_heads % p.heads == 0 && p.batch >= 0 &&
         static_cast<int64_t>(p.batch) * p.v_heads <= INT32_MAX && c.buffer_len >= 1 &&
         c.buffer_len <= kGdnMaxBufferLen && c.num_committed != nullptr && c.checkpoint != nullptr &&
         (c.read_copy == nullptr || c.read_copy_dtype != DType::kFloat8E4M3 || c.read_scale != nullptr);
}

// KDA (GdnGate::kVector): g_buf's entries of K channels, 16-byte aligned for the staging copies.
bool gate_ok(const GdnParams& p) {
  return p.gate != GdnGate::kVector || (p.kda.gb_entry_stride >= p.head_k_dim && p.kda.gb_entry_stride % 4 == 0);
}

}  // namespace
}  // namespace gdn

cudaError_t launch_gdn_verify(const GdnParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  const int T = p.tokens.num_tokens;
  if (!gdn::common_params_ok(p) || !gdn::gate_ok(p) || p.cache.num_verified == nullptr || p.batch > 65535 || T < 1 || T > kGdnMaxDraftTokens || T > p.cache.buffer_len) {
    return cudaErrorInvalidValue;
  }
  return REPLAYSSM_GDN_SHAPE_SWITCH(p.head_k_dim, p.head_v_dim, [&](auto K, auto V) {
    return gdn::launch_verify_shape<decltype(K)::value, decltype(V)::value>(p, stream);
  });
}

namespace gdn {
namespace {

// The fold launch(es) of launch_gdn_fold / launch_gdn_fold_layers (layers null: one layer).
cudaError_t launch_fold_op(const GdnParams& p, const LayerTableArgs* layers, cudaStream_t stream) {
  const bool commit = p.mode == GdnFoldMode::kCommit;
  const bool materialize = p.mode == GdnFoldMode::kMaterialize;
  if (layers != nullptr && (layers->table == nullptr || layers->num_layers < 1 || layers->num_layers > 65535)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;  // no rows: nothing to fold and no cursor to move (no seed in GDN)
  if (!common_params_ok(p) || !gate_ok(p)) return cudaErrorInvalidValue;
  if ((commit && (p.num_accepted == nullptr || p.cache.num_verified == nullptr || p.cache.max_draft_tokens < 1 ||
                  p.cache.max_draft_tokens > p.cache.buffer_len)) ||
      (materialize && (p.state_out == nullptr || p.cache.read_copy != nullptr))) {
    return cudaErrorInvalidValue;
  }
  cudaError_t err = REPLAYSSM_GDN_SHAPE_SWITCH(p.head_k_dim, p.head_v_dim, [&](auto K, auto V) {
    return launch_fold_shape<decltype(K)::value, decltype(V)::value>(p, layers, stream);
  });
  if (err != cudaSuccess || materialize) return err;
  CursorMoveParams cm = cursor_move_rows(p);
  cm.num_committed = p.cache.num_committed;
  cm.num_verified = p.cache.num_verified;
  cm.buffer_len = p.cache.buffer_len;
  cm.max_draft_tokens = p.cache.max_draft_tokens;
  cm.rounding_seed = nullptr;
  cm.error_word = commit ? p.error_word : nullptr;
  return layers != nullptr ? launch_move_cursors_layers(cm, *layers, stream) : launch_move_cursors(cm, stream);
}

}  // namespace
}  // namespace gdn

cudaError_t launch_gdn_fold(const GdnParams& p, cudaStream_t stream) { return gdn::launch_fold_op(p, nullptr, stream); }

cudaError_t launch_gdn_fold_layers(const GdnParams& p, const LayerTableArgs& layers, cudaStream_t stream) {
  return gdn::launch_fold_op(p, &layers, stream);
}

}  // namespace replayssm
