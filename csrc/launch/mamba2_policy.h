// Launch plans of the Mamba-2 kernels: every launch decision of the update, the step, verify and the
// fold (commit, flush, materialize), as host-only C++ (no CUDA headers). A launcher measures what only
// the CUDA runtime knows (CTAs per SM from the occupancy query, the device's DeviceInfo), asks its plan
// function, and launches what the plan says. The rules, the measurements behind them and their
// overrides: docs/TUNING.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "launch/device_info.h"
#include "launch/overrides.h"
#include "launch/ring.h"

namespace replayssm {
namespace launch {

// ---------------------------------------------------------------------------------------------------
// The rules the plans are made of (each tested on its own by tests/test_launch_policy.py).
// ---------------------------------------------------------------------------------------------------

// Which refinements of the heads-per-CTA rule apply (mamba2_heads_per_cta).
struct HeadsRules {
  int waves = 4;                       // the base rule: the largest block that keeps >= `waves` waves
  bool one_wave = false;               // whole groups where they fill every SM in one wave; below, one wave
  bool full_waves = false;             // at <= 2 CTAs an SM, larger blocks whose last wave is >= 95% full
  bool fill_last_wave = false;         // down to half-size blocks where the waves' slots are < 95% used
  bool half_below_four_waves = false;  // half groups where whole groups make fewer than four waves
};

// Heads of one group a CTA pipelines (step, verify). `forced` > 0 (an override) takes the largest divisor
// of the group size <= forced instead of the rules.
int mamba2_heads_per_cta(int64_t batch, int heads, int groups, int ctas_per_sm, int sm_count,
                         const HeadsRules& rules, int forced);

// Heads per CTA of the step under the staggered-flush hint (before any fold split): the base rule at four
// waves, or step_staggered_heads_per_cta's block where that override is set (and step_heads_per_cta is
// not). plan_mamba2_step takes it, and mamba2_fold_split starts from it.
int mamba2_staggered_heads_per_cta(int64_t batch, int heads, int groups, int ctas_per_sm, int sm_count,
                                   const LaunchOverrides& overrides);

// Whether the tensor-core step with a read copy runs CTAs of two whole groups; `by_rule`: the copy is
// fp8 (the only one the rule takes).
bool mamba2_two_group_ctas(int64_t batch, int groups, int ctas_per_sm, int sm_count, bool by_rule,
                           const LaunchOverrides& overrides);

// The step's fold split under the staggered-flush hint: CTAs of heads_per_cta heads for the replaying
// rows and `split` times smaller ones for the first `rows` folding rows. split = 1: none.
struct FoldSplit {
  int heads_per_cta = 0;
  int split = 1;
  int rows = 0;
};
// `hint_heads`: the heads per CTA of the hint's launch without a split (step_staggered_heads_per_cta's
// block where that override is set). The overrides step_fold_split >= 1 and step_staggered_heads_per_cta
// choose the split by hand (overrides.h).
FoldSplit mamba2_fold_split(int64_t batch, int heads, int groups, int buffer_len, int ctas_per_sm, int sm_count,
                            int hint_heads, const LaunchOverrides& overrides);

// ---------------------------------------------------------------------------------------------------
// Plans.
// ---------------------------------------------------------------------------------------------------

// ---- mamba2_update: a persistent grid walking the (row, head) items through a ring of state tiles ----

// Whether the update splits each (row, head) item into `parts` items of one pass of state rows each (a
// compiled form of the kernel whose tile is one pass: P / parts rows). `parts` <= 1: no such form.
bool mamba2_update_split(int64_t batch, int heads, int parts, int sm_count, const LaunchOverrides& overrides);

struct Mamba2UpdateProblem {
  int64_t batch = 0;
  int heads = 0;
  int parts = 1;              // items per (row, head): 1 whole heads, else its one-pass tiles (the split)
  int tile_bytes = 0;         // one item's state tile (rows x N x state bytes)
  int max_stages = 0;         // the kernel's barrier arrays hold this many stages
  int static_bytes = 0;       // the kernel's static shared memory (barriers, item ids), rounded up
  bool work_counter = false;  // the caller gave the counter that claims need
};

struct Mamba2UpdatePlan {
  int stages = 0;             // ring stages (dynamic shared memory: stages x tile_bytes)
  int64_t grid = 0;           // CTAs
  bool claims = false;        // items past the first `stages` rounds claimed from the counter (zeroed first)
};

// Ring stages, before the occupancy query (0: not even one tile fits).
int plan_mamba2_update_stages(const Mamba2UpdateProblem& problem, const DeviceInfo& device,
                              const LaunchOverrides& overrides);
// The launch, with the CTAs per SM the occupancy query gave at those stages.
Mamba2UpdatePlan plan_mamba2_update(const Mamba2UpdateProblem& problem, int stages, int ctas_per_sm,
                                    const DeviceInfo& device, const LaunchOverrides& overrides);

// ---- mamba2_step: CTAs of a block of one group's heads of one row ----

enum class ReadCopyKind { kNone, k16Bit, kFp8 };

struct Mamba2StepProblem {
  int64_t batch = 0;
  int heads = 0;
  int groups = 0;
  int buffer_len = 0;
  bool staggered_flush = false;   // the caller's hint: slots fold at different steps
  bool order_workspace = false;   // the caller gave row_order, so the order pass may run
  bool fp32_checkpoint = false;
  ReadCopyKind read_copy = ReadCopyKind::kNone;
  bool tensor_replay = false;     // the kernel of these dtypes replays on tensor cores
};

enum class StepKernel {
  kPlain,      // CTA (x, y): heads block x of row y
  kTwoGroups,  // CTA (x, y): groups 2x and 2x + 1 of row y
  kOrdered,    // the order pass first; CTA rows follow its list (folding rows first), with the fold split
};

struct Mamba2StepPlan {
  StepKernel kernel = StepKernel::kPlain;
  int heads_per_cta = 0;
  int fold_split = 1;       // kOrdered: the first fold_split_rows folding rows take heads_per_cta / fold_split
  int fold_split_rows = 0;  // heads a CTA; the grid has fold_split_rows x (fold_split - 1) helper rows first
  int64_t grid_x = 0, grid_y = 0;
};

// `ctas_per_sm`: the occupancy of the plain kernel (the others share its layout).
Mamba2StepPlan plan_mamba2_step(const Mamba2StepProblem& problem, int ctas_per_sm, const DeviceInfo& device,
                                const LaunchOverrides& overrides);

// ---- mamba2_verify: CTAs of a block of one group's heads of one row, T draft tokens each ----

struct Mamba2VerifyProblem {
  int64_t batch = 0;
  int heads = 0;
  int groups = 0;
};

struct Mamba2VerifyPlan {
  int heads_per_cta = 0;
  int ring_stages = 0;
  int64_t grid_x = 0, grid_y = 0;
};

// Ring stages, before the occupancy query (0: not even one stage fits).
int plan_mamba2_verify_stages(const RingBytes& ring, const DeviceInfo& device);
Mamba2VerifyPlan plan_mamba2_verify(const Mamba2VerifyProblem& problem, int stages, int ctas_per_sm,
                                    const DeviceInfo& device, const LaunchOverrides& overrides);

// ---- the fold (commit, flush, materialize): a persistent grid over the (row, head) items ----

struct Mamba2FoldProblem {
  int64_t batch = 0;
  int heads = 0;
  int layers = 1;  // a layered launch folds every layer of a layer table (cache/layer_table.h)
};

struct Mamba2FoldPlan {
  int ring_stages = 0;
  int64_t grid = 0;  // CTAs per layer (gridDim.x); a layered launch has `layers` of them (gridDim.y)
};

// Ring stages, before the occupancy query (0: not even two stages fit).
int plan_mamba2_fold_stages(const RingBytes& ring, const DeviceInfo& device);
Mamba2FoldPlan plan_mamba2_fold(const Mamba2FoldProblem& problem, int stages, int ctas_per_sm,
                                const DeviceInfo& device);

}  // namespace launch
}  // namespace replayssm
