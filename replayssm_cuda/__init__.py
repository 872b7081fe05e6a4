"""replayssm_cuda: ReplaySSM decode kernels for Mamba-2, Gated DeltaNet and KDA layers.

The state objects (`Mamba2Cache`, `GDNCache`, `KDACache`, and `LayerCaches`: the slot management of all
layers of a model in one launch) are the API most engines want; the functional ops live in
`replayssm_cuda.ops`, their PyTorch specification in `replayssm_cuda.reference`,
and `torch.ops.replayssm.*` exists on every install (compiled kernels on CUDA where this build has
them, see `capabilities()`; the reference elsewhere).
"""

from . import _extension, _library  # noqa: F401  (_C's CUDA kernels, then the torch.ops.replayssm schemas)
from . import ops, reference
from ._extension import build_info, capabilities, is_compiled
from .cache import DeltaRuleWeights, GDNCache, KDACache, Mamba2Cache, Mamba2Weights
from .layer_caches import LayerCaches
from .launch import get_launch_overrides, launch_overrides

__version__ = "0.1.0"

__all__ = [
    "DeltaRuleWeights", "GDNCache", "KDACache", "LayerCaches", "Mamba2Cache", "Mamba2Weights",
    "build_info", "capabilities", "is_compiled", "ops", "reference", "__version__",
]
