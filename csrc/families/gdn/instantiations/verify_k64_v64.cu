// Instantiation of the Gated DeltaNet verify kernels for head_k_dim 64, head_v_dim 64 (one file per
// shape so the shapes compile in parallel).
#include "families/gdn/verify_launch.cuh"

namespace replayssm::gdn {
template cudaError_t launch_verify_shape<64, 64>(const GdnParams&, cudaStream_t, int);
}  // namespace replayssm::gdn
