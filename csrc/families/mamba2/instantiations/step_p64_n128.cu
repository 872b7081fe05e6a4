// Instantiation of the Mamba-2 step kernels for head_dim 64, state_dim 128 (one file per shape so
// the shapes compile in parallel); the ordered step (staggered flush) comes with it.
#include "families/mamba2/step_launch.cuh"

namespace replayssm::mamba2 {
template cudaError_t launch_step_shape<64, 128>(const Mamba2Params&, cudaStream_t);
}  // namespace replayssm::mamba2
