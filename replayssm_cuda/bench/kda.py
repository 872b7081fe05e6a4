"""KDA (Kimi Delta Attention) benchmarks: Gated DeltaNet's (bench/gdn.py) with the decay per key channel.
The same set-ups, measurements, plans and byte models, run with family "kda": the kda_* ops, the gate input a
(batch, [T,] HV, K), dt_bias (HV, K) and g_buf (slots, HV, L, K), and c = K log decays a token per v-head in
the byte model (gdn.py's module doc, below). flash-linear-attention's rows are GDN's only here.
"""

from __future__ import annotations

import functools

from . import gdn
from .dims import DimsTable
from .registry import Bench, Family, register

# Kimi Linear 48B-A3B's KDA layers (tools/profile_ops.py's kimi): 32 heads of K = V = 128, one v-head a
# q/k head.
MODELS = {"kimi48b": {"H": 32, "HV": 32, "K": 128, "V": 128}}
DIMS_TABLE = DimsTable(fields=("H", "HV", "K", "V"), models=MODELS, tp_fields=("H", "HV"), check=gdn.DIMS_TABLE.check)
# Full width and the shard of one of 4 tensor-parallel GPUs (H = HV = 8).
DEFAULT_DIMS = ("kimi48b", "kimi48b@tp4")
DEFAULT_BATCHES = gdn.DEFAULT_BATCHES

CYCLE_DOC = ("µs per step: the conventional update (the baseline: our kda_update, state read and written every "
             "step) and the ReplaySSM step (kda_step, read copy none / bf16 / fp8) over whole L-step cycles, "
             "lock-step (all rows fold in the same step) and staggered (rows fold in different steps, as under "
             "continuous batching: the serving case). KDA's decay is per key channel: its gate input, g buffer "
             "and window carry K log decays a v-head (c = K below). A float32 (128, 128) checkpoint folds in "
             "kernels up to L = 63 (the fold keeps the window's decays in shared memory): a longer --buffer-len "
             "is noted and its replay rows skipped. Byte models: python -m replayssm_cuda bench kda cycle "
             "--help.")
SPEC_DOC = ("µs per speculative round of T draft tokens: the conventional snapshot step (the baseline: "
            "kda_update_snapshots, the state read once and T snapshots written) against the ReplaySSM "
            "verify(T) + commit(num_accepted), num_accepted uniform in [1, T]; fp32 state / checkpoint. "
            "verify + commit has no byte model (its fold rate follows the acceptance): tokens/s = batch (T + 1) "
            "/ 2 per round.")

FAMILY = register(Family("kda", "KDA, Kimi Delta Attention (Gated DeltaNet with the decay per key channel)",
                         DIMS_TABLE))
FAMILY.add(Bench("cycle", "update vs replay step cycles (lock-step and staggered)",
                 CYCLE_DOC + "\n\n" + __doc__ + "\n" + gdn.__doc__,
                 functools.partial(gdn.plan_cycle, family="kda"),
                 functools.partial(gdn._cycle_arguments, family="kda"), default_dims=DEFAULT_DIMS,
                 default_batches=DEFAULT_BATCHES,
                 needs_ops=("kda_update", "kda_step", "make_read_copy", "stagger_cursors"),
                 check=functools.partial(gdn.check_args, "cycle")))
FAMILY.add(Bench("spec", "conventional T-token snapshots vs verify(T) + commit",
                 SPEC_DOC + "\n\n" + __doc__ + "\n" + gdn.__doc__,
                 functools.partial(gdn.plan_spec, family="kda"), gdn._spec_arguments, default_dims=DEFAULT_DIMS,
                 default_batches=DEFAULT_BATCHES,
                 needs_ops=("kda_update_snapshots", "kda_verify", "kda_commit", "make_read_copy"),
                 check=functools.partial(gdn.check_args, "spec")))
