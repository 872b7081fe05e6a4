// ReplaySSM Mamba-2 step: run-time choice of the compiled (head_dim, state_dim) instantiation.
// The kernel and its contract are in step_kernel.cuh; the shapes in variants.h.
#include "common/stochastic_rounding.cuh"
#include "families/mamba2/params.h"
#include "families/mamba2/variants.h"

namespace replayssm {
namespace mamba2 {
template <int kP, int kN>
cudaError_t launch_step_shape(const Mamba2Params& p, cudaStream_t stream);
}  // namespace mamba2

namespace {

cudaError_t dispatch_shape(const Mamba2Params& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (p.heads < 1 || p.groups < 1 || p.heads % p.groups != 0 || p.heads > 65535 || p.batch > 65535 ||
      p.buffer_len < 1 || p.buffer_len > kMamba2MaxBufferLen || p.max_draft_tokens < 1 ||
      p.max_draft_tokens > p.buffer_len || p.num_committed == nullptr) {
    return cudaErrorInvalidValue;
  }
  return REPLAYSSM_MAMBA2_SHAPE_SWITCH(p.head_dim, p.state_dim, [&](auto P, auto N) {
    return mamba2::launch_step_shape<decltype(P)::value, decltype(N)::value>(p, stream);
  });
}

}  // namespace

cudaError_t launch_mamba2_step(const Mamba2Params& p, cudaStream_t stream) {
  if (p.rounding_seed != nullptr && p.checkpoint_dtype == DType::kFloat32) return cudaErrorInvalidValue;
  const cudaError_t err = dispatch_shape(p, stream);
  // The step's CTAs all read the offset; it moves in a launch of its own after them (see
  // stochastic_rounding.cu for why not a ticket). Every launch with a seed moves it, as in the reference.
  if (err != cudaSuccess || p.rounding_seed == nullptr) return err;
  return launch_rounding_offset_advance(p.rounding_seed, stream);
}

}  // namespace replayssm
