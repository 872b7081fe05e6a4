"""replayssm_cuda: ReplaySSM decode kernels for Mamba-2, Gated DeltaNet and KDA layers.

The state objects (`Mamba2Cache`, `GDNCache`, `KDACache`) are the API most engines want; the
functional ops live in `replayssm_cuda.ops` and their PyTorch specification in
`replayssm_cuda.reference`. Compiled kernels are used for CUDA tensors where this build has them.
"""

from . import ops, reference
from ._extension import build_info, is_compiled
from .cache import DeltaRuleWeights, GDNCache, KDACache, Mamba2Cache, Mamba2Weights
from .launch import get_launch_overrides, launch_overrides

__version__ = "0.1.0"

__all__ = [
    "DeltaRuleWeights", "GDNCache", "KDACache", "Mamba2Cache", "Mamba2Weights",
    "build_info", "is_compiled", "ops", "reference", "__version__",
]
