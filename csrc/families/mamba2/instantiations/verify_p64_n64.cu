// Instantiation of the Mamba-2 verify kernels for head_dim 64, state_dim 64 (one file per shape so the
// shapes compile in parallel).
#include "families/mamba2/verify_launch.cuh"

namespace replayssm::mamba2_spec {
template cudaError_t launch_verify_shape<64, 64>(const Mamba2SpecParams&, cudaStream_t);
}  // namespace replayssm::mamba2_spec
