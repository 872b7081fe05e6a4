// Mamba-2 speculative decoding: run-time choice of the compiled (head_dim, state_dim) instantiation of
// the verify and fold kernels (verify_launch.cuh, fold_launch.cuh; the shapes in variants.h), and the
// cursor kernel that commit and flush launch after their fold.
#include "common/stochastic_rounding.cuh"
#include "families/mamba2/spec_common.cuh"
#include "families/mamba2/variants.h"

namespace replayssm {
namespace mamba2_spec {
template <int kP, int kN>
cudaError_t launch_verify_shape(const Mamba2SpecParams& p, cudaStream_t stream);
template <int kP, int kN>
cudaError_t launch_fold_shape(const Mamba2SpecParams& p, cudaStream_t stream);

namespace {

// One thread per row. Runs after the fold kernel, which read the cursors as they were, so this is the
// only writer: commit moves the cursor past the accepted entries (0 where the row folded), flush
// empties the folded slots. The rules are the fold kernel's (entries_to_fold), restated per row.
// Every fold CTA has also read the rounding offset by now, so the first thread advances it: the
// stochastic rounding of commit and flush costs no launch of its own.
__global__ void cursor_kernel(const Mamba2SpecParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row == 0 && p.rounding_seed != nullptr) p.rounding_seed[1] += 1;
  if (row >= p.batch) return;
  const int64_t slot = resolve_slot(p, row);
  if (slot < 0) return;
  const int L = p.buffer_len;
  const int w = p.num_committed[slot];
  if (w < 0 || w > L) return;
  if (p.mode == Mamba2FoldMode::kFlush) {
    if (w > 0) p.num_committed[slot] = 0;
    return;
  }
  const int64_t accepted = load_index(p.num_accepted, p.num_accepted_dtype, row, p.num_accepted_stride);
  const int64_t moved = accepted < 0 ? 0 : (accepted > L - w ? L - w : accepted);
  const int n = w + static_cast<int>(moved);
  p.num_committed[slot] = n + p.max_draft_tokens > L ? 0 : n;
}

bool common_params_ok(const Mamba2SpecParams& p) {
  return p.heads >= 1 && p.groups >= 1 && p.heads % p.groups == 0 && p.heads <= 65535 && p.batch >= 0 &&
         p.buffer_len >= 1 && p.buffer_len <= kMamba2SpecMaxBufferLen && p.num_committed != nullptr;
}

}  // namespace
}  // namespace mamba2_spec

cudaError_t launch_mamba2_verify(const Mamba2SpecParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (!mamba2_spec::common_params_ok(p) || p.batch > 65535 || p.num_tokens < 1 ||
      p.num_tokens > kMamba2SpecMaxDraftTokens || p.num_tokens > p.buffer_len) {
    return cudaErrorInvalidValue;
  }
  return REPLAYSSM_MAMBA2_SHAPE_SWITCH(p.head_dim, p.state_dim, [&](auto P, auto N) {
    return mamba2_spec::launch_verify_shape<decltype(P)::value, decltype(N)::value>(p, stream);
  });
}

cudaError_t launch_mamba2_fold(const Mamba2SpecParams& p, cudaStream_t stream) {
  const bool commit = p.mode == Mamba2FoldMode::kCommit;
  const bool materialize = p.mode == Mamba2FoldMode::kMaterialize;
  if (p.rounding_seed != nullptr && (materialize || p.checkpoint_dtype == DType::kFloat32)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) {  // nothing to fold; a launch with a seed still moves the offset, like the reference
    return p.rounding_seed != nullptr ? launch_rounding_offset_advance(p.rounding_seed, stream) : cudaSuccess;
  }
  if (!mamba2_spec::common_params_ok(p)) return cudaErrorInvalidValue;
  if ((commit && (p.num_accepted == nullptr || p.max_draft_tokens < 1 || p.max_draft_tokens > p.buffer_len)) ||
      (materialize && p.state_out == nullptr)) {
    return cudaErrorInvalidValue;
  }
  cudaError_t err = REPLAYSSM_MAMBA2_SHAPE_SWITCH(p.head_dim, p.state_dim, [&](auto P, auto N) {
    return mamba2_spec::launch_fold_shape<decltype(P)::value, decltype(N)::value>(p, stream);
  });
  if (err != cudaSuccess || materialize) return err;
  constexpr int kRowsPerBlock = 256;
  const int64_t blocks = (static_cast<int64_t>(p.batch) + kRowsPerBlock - 1) / kRowsPerBlock;
  mamba2_spec::cursor_kernel<<<static_cast<unsigned>(blocks), kRowsPerBlock, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace replayssm
