// Mamba-2's step order pass (staggered flush): cache/row_order.cuh's pass, shared with GDN, which says
// why it exists (without it, Mamba-2's staggered cycles with an fp8 read copy were 41-70% slower than
// lock-step ones). The launch plan (plan_mamba2_step, launch/mamba2_policy.cpp) says where the pass runs:
// with a read copy, more than one wave of CTAs and more than one head per CTA, or with a fold split (the
// first folding rows in smaller CTAs than the rest), whose rows the pass marks.
#include "cache/row_order.cuh"
#include "families/mamba2/params.h"
#include "families/mamba2/tile.cuh"

namespace replayssm {
namespace mamba2 {

// The shared pass (cache/row_order.cuh) with Mamba-2's fold rule (step_folds: folds_after_append with
// max_draft_tokens) and the fold split's mark on its first folding rows.
cudaError_t launch_step_row_order(const Mamba2Params& p, const Mamba2StepLaunch& launch, cudaStream_t stream) {
  static_assert(kRowOrderMaxBatch == 65535, "the step's grid.y limit, checked by the dispatcher");
  RowOrderArgs a{};
  a.num_committed = p.num_committed;
  a.order = p.row_order;
  a.batch = p.batch;
  a.buffer_len = p.buffer_len;
  a.max_draft_tokens = p.max_draft_tokens;
  a.fine_rows = launch.fold_split_rows;
  a.fine_mark = kFineFoldRow;
  a.pdl_wait = launch.pdl_wait;
  a.pdl_trigger = launch.pdl_trigger;
  a.release_step = launch.after_order_pass;
  return launch_row_order(p, a, p.num_slots, stream);
}

}  // namespace mamba2
}  // namespace replayssm
