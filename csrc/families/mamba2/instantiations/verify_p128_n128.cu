// Mamba-2 verify kernels, head_dim 128, state_dim 128. One file per shape, so the shapes compile in
// parallel. Written by tools/generate_instantiations.py from the shapes in families/mamba2/variants.h: do
// not edit.
#include "families/mamba2/verify_launch.cuh"

namespace replayssm::mamba2_spec {
template cudaError_t launch_verify_shape<128, 128>(const Mamba2SpecParams&, cudaStream_t);
}  // namespace replayssm::mamba2_spec
