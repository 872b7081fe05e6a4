// Mamba-2 step kernels (the ordered and two-group ones with them), head_dim 64, state_dim 128. One file per
// shape, so the shapes compile in parallel. Written by tools/generate_instantiations.py from the shapes in
// families/mamba2/variants.h: do not edit.
#include "families/mamba2/step_launch.cuh"

namespace replayssm::mamba2 {
template cudaError_t launch_step_shape<64, 128>(const Mamba2Params&, cudaStream_t);
}  // namespace replayssm::mamba2
