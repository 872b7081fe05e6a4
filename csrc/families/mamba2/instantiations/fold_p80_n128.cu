// Mamba-2 fold kernels (commit, flush, materialize; one layer or a layer table), head_dim 80, state_dim
// 128. One file per shape, so the shapes compile in parallel. Written by tools/generate_instantiations.py
// from the shapes in families/mamba2/variants.h: do not edit.
#include "families/mamba2/fold_launch.cuh"

namespace replayssm::mamba2_spec {
template cudaError_t launch_fold_shape<80, 128>(const Mamba2SpecParams&, const LayerTableArgs*, cudaStream_t);
}  // namespace replayssm::mamba2_spec
