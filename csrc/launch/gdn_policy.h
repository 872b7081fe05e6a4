// Launch plans of the Gated DeltaNet kernels (families/gdn/): the conventional update and its
// snapshot-writing variant, the step, verify and the fold (commit, flush, materialize), as host-only C++
// (no CUDA headers). As for Mamba-2 (mamba2_policy.h), a launcher measures what only the CUDA runtime
// knows (CTAs per SM from the occupancy query, the device's DeviceInfo), asks its plan function, and
// launches what the plan says. The rules and their overrides: docs/TUNING.md, "Gated DeltaNet".
#pragma once

#include <cstdint>

#include "launch/device_info.h"
#include "launch/overrides.h"
#include "launch/ring.h"

namespace replayssm {
namespace launch {

// A two-dimensional grid: CTA (x, y) serves part x of row y.
struct GdnGridPlan {
  int64_t grid_x = 0, grid_y = 0;
};

// ---- gdn_update, gdn_update_snapshots: CTAs of a block of one (row, v-head)'s value rows ----

struct GdnUpdateProblem {
  int64_t batch = 0;
  int v_heads = 0;
  int ctas_per_head = 0;        // the kernel's: V / the value rows a CTA owns
  int split_ctas_per_head = 0;  // the split kernel's (4 KB CTAs; gdn_update only); 0: no split kernel
};

struct GdnUpdatePlan {
  bool split = false;  // the split kernel: a tile in CTAs of 4 KB instead of 16 KB
  int64_t grid_x = 0, grid_y = 0;
};

GdnUpdatePlan plan_gdn_update(const GdnUpdateProblem& problem, int sm_count, const LaunchOverrides& overrides);

// ---- gdn_step: `parts` CTAs per (row, v-head), each V / parts value rows ----

struct GdnStepProblem {
  int64_t batch = 0;
  int v_heads = 0;
  int v_dim = 0;                 // V (head_v_dim): parts divide V / 32
  bool staggered_flush = false;  // the caller's hint: slots fold at different steps
  bool order_workspace = false;  // the caller gave row_order, so the order pass may run
  int ctas_per_sm = 0;           // resident CTAs an SM (occupancy query): asked only where the order pass may run
  int buffer_len = 16;           // L: about batch / L rows fold in a step of an even stagger
  bool read_copy = false;        // the replay reads a read copy (the fold split's rule)
  bool chunked_tile = false;     // the kernel can take its tile in chunks (an fp32 tile without a copy)
  bool staged_tile = false;      // a staged kernel can ask for its 16-bit read copy's tile over the set-up
};

struct GdnStepPlan {
  int parts = 1;  // CTAs per (row, v-head)
  bool ordered = false;  // the order pass first (cache/row_order.cuh): the folding rows' CTAs start first
  // The fold split (ordered, one part): the first fold_rows folding rows take fold_parts CTAs a v-head,
  // the grid fold_rows x (fold_parts - 1) helper rows after the batch. 1 / 0: none.
  int fold_parts = 1;
  int fold_rows = 0;
  int64_t grid_x = 0, grid_y = 0;  // (v_heads parts, batch)
  int tile_stages = 0;  // the tile in chunks of one replay pass, at most this many in flight; 0: one copy
};

// Parts per (row, v-head). `forced` > 0 (the gdn_step_parts override) takes the largest allowed part
// count <= forced instead of the rule. Neither the CTAs per SM nor the staggered-flush hint enter the
// rule (gdn_policy.cpp says why); only the order rule needs the CTAs per SM, so the launcher asks the
// occupancy query under the hint alone.
int gdn_step_parts(int64_t batch, int v_heads, int v_dim, int sm_count, int forced);

GdnStepPlan plan_gdn_step(const GdnStepProblem& problem, const DeviceInfo& device, const LaunchOverrides& overrides);

// ---- gdn_verify: CTAs of a block of v-heads of one row, T draft tokens each ----

// V-heads a verify CTA takes. `forced` > 0 (the verify_heads_per_cta override) takes the largest divisor
// of v_heads <= forced instead of the rule.
int gdn_verify_heads_per_cta(int64_t batch, int v_heads, int ctas_per_sm, int sm_count, int forced);

struct GdnVerifyProblem {
  int64_t batch = 0;
  int v_heads = 0;
};

struct GdnVerifyPlan {
  int heads_per_cta = 0;
  int ring_stages = 0;
  int64_t grid_x = 0, grid_y = 0;
};

// Ring stages, before the occupancy query (0: not even one stage fits).
int plan_gdn_verify_stages(const RingBytes& ring, const DeviceInfo& device);
GdnVerifyPlan plan_gdn_verify(const GdnVerifyProblem& problem, int stages, int ctas_per_sm, const DeviceInfo& device,
                              const LaunchOverrides& overrides);

// ---- the fold (commit, flush, materialize): a persistent grid over the (row, v-head) items ----

struct GdnFoldProblem {
  int64_t batch = 0;
  int v_heads = 0;
  int layers = 1;  // a layered launch folds every layer of a layer table (cache/layer_table.h)
};

struct GdnFoldPlan {
  int ring_stages = 0;
  int64_t grid = 0;  // CTAs per layer (gridDim.x); a layered launch has `layers` of them (gridDim.y)
};

// Ring stages, before the occupancy query (0: not even one stage fits).
int plan_gdn_fold_stages(const RingBytes& ring, const DeviceInfo& device);
GdnFoldPlan plan_gdn_fold(const GdnFoldProblem& problem, int stages, int ctas_per_sm, const DeviceInfo& device);

}  // namespace launch
}  // namespace replayssm
