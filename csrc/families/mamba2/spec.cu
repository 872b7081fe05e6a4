// Mamba-2 speculative decoding: run-time choice of the compiled (head_dim, state_dim) instantiation of
// the verify and fold kernels (verify_launch.cuh, fold_launch.cuh; the shapes in variants.h), and the
// cursor kernel that commit and flush launch after their fold (cache/fold_cursor.h, the same for every
// family; it also advances the stochastic-rounding offset, every fold CTA having read it by then).
#include "cache/fold_cursor.h"
#include "common/stochastic_rounding.cuh"
#include "families/mamba2/spec_common.cuh"
#include "families/mamba2/variants.h"

namespace replayssm {
namespace mamba2_spec {
template <int kP, int kN>
cudaError_t launch_verify_shape(const Mamba2SpecParams& p, cudaStream_t stream);
template <int kP, int kN>
cudaError_t launch_fold_shape(const Mamba2SpecParams& p, const LayerTableArgs* layers, cudaStream_t stream);

namespace {

bool common_params_ok(const Mamba2SpecParams& p) {
  return p.heads >= 1 && p.groups >= 1 && p.heads % p.groups == 0 && p.heads <= 65535 && p.batch >= 0 &&
         p.buffer_len >= 1 && p.buffer_len <= kMamba2SpecMaxBufferLen && p.num_committed != nullptr;
}

}  // namespace
}  // namespace mamba2_spec

cudaError_t launch_mamba2_verify(const Mamba2SpecParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (!mamba2_spec::common_params_ok(p) || p.num_verified == nullptr || p.batch > 65535 || p.num_tokens < 1 ||
      p.num_tokens > kMamba2SpecMaxDraftTokens || p.num_tokens > p.buffer_len) {
    return cudaErrorInvalidValue;
  }
  return REPLAYSSM_MAMBA2_SHAPE_SWITCH(p.head_dim, p.state_dim, [&](auto P, auto N) {
    return mamba2_spec::launch_verify_shape<decltype(P)::value, decltype(N)::value>(p, stream);
  });
}

namespace mamba2_spec {
namespace {

// The fold launch(es) of launch_mamba2_fold / launch_mamba2_fold_layers (layers null: one layer).
cudaError_t launch_fold_op(const Mamba2SpecParams& p, const LayerTableArgs* layers, cudaStream_t stream) {
  const bool commit = p.mode == Mamba2FoldMode::kCommit;
  const bool materialize = p.mode == Mamba2FoldMode::kMaterialize;
  if (p.rounding_seed != nullptr && (materialize || p.checkpoint_dtype == DType::kFloat32)) {
    return cudaErrorInvalidValue;
  }
  if (layers != nullptr && (layers->table == nullptr || layers->num_layers < 1 || layers->num_layers > 65535)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 && layers == nullptr) {  // nothing to fold; a launch with a seed still moves the offset, like the reference
    return p.rounding_seed != nullptr ? launch_rounding_offset_advance(p.rounding_seed, stream) : cudaSuccess;
  }
  if (!common_params_ok(p)) return cudaErrorInvalidValue;
  if ((commit && (p.num_accepted == nullptr || p.num_verified == nullptr || p.max_draft_tokens < 1 ||
                  p.max_draft_tokens > p.buffer_len)) ||
      (materialize && p.state_out == nullptr)) {
    return cudaErrorInvalidValue;
  }
  cudaError_t err = cudaSuccess;
  if (p.batch > 0) {  // a layered batch 0 launches only the cursor kernel, which moves the seeds' offsets
    err = REPLAYSSM_MAMBA2_SHAPE_SWITCH(p.head_dim, p.state_dim, [&](auto P, auto N) {
      return launch_fold_shape<decltype(P)::value, decltype(N)::value>(p, layers, stream);
    });
  }
  if (err != cudaSuccess || materialize) return err;
  CursorMoveParams cm = cursor_move_rows(p);
  cm.num_committed = p.num_committed;
  cm.num_verified = p.num_verified;
  cm.buffer_len = p.buffer_len;
  cm.max_draft_tokens = p.max_draft_tokens;
  cm.rounding_seed = p.rounding_seed;
  cm.error_word = commit ? p.error_word : nullptr;
  if (layers != nullptr) return p.batch > 0 || p.rounding_seed != nullptr ? launch_move_cursors_layers(cm, *layers, stream) : cudaSuccess;
  return launch_move_cursors(cm, stream);
}

}  // namespace
}  // namespace mamba2_spec

cudaError_t launch_mamba2_fold(const Mamba2SpecParams& p, cudaStream_t stream) {
  return mamba2_spec::launch_fold_op(p, nullptr, stream);
}

cudaError_t launch_mamba2_fold_layers(const Mamba2SpecParams& p, const LayerTableArgs& layers, cudaStream_t stream) {
  return mamba2_spec::launch_fold_op(p, &layers, stream);
}

}  // namespace replayssm
