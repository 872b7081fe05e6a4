// Gated DeltaNet fold kernels (commit, flush, materialize; one layer or a layer table), head_k_dim 64,
// head_v_dim 64. One file per shape, so the shapes compile in parallel. Written by
// tools/generate_instantiations.py from the shapes in families/gdn/variants.h: do not edit.
#include "families/gdn/fold_launch.cuh"

namespace replayssm::gdn {
template cudaError_t launch_fold_shape<64, 64>(const GdnParams&, const LayerTableArgs*, cudaStream_t);
}  // namespace replayssm::gdn
