// The GDN step kernels of head_k_dim 64, head_v_dim 128, every dtype variant (one file per shape so that
// the shapes compile in parallel).
#include "families/gdn/step_launch.cuh"

namespace replayssm::gdn {
template cudaError_t launch_step_shape<64, 128>(const GdnParams&, cudaStream_t);
}  // namespace replayssm::gdn
