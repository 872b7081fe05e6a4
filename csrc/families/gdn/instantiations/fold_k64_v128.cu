// Instantiation of the Gated DeltaNet fold kernels (commit, flush, materialize) for head_k_dim 64,
// head_v_dim 128 (one file per shape so the shapes compile in parallel).
#include "families/gdn/fold_launch.cuh"

namespace replayssm::gdn {
template cudaError_t launch_fold_shape<64, 128>(const GdnParams&, cudaStream_t);
}  // namespace replayssm::gdn
