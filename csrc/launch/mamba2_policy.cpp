// Launch plans of the Mamba-2 kernels (mamba2_policy.h). Each rule carries its reason in a line; the
// measurements behind it are in docs/TUNING.md, under the rule's name.
#include "launch/mamba2_policy.h"

#include <algorithm>

#include "launch/waves.h"

namespace replayssm {
namespace launch {

// The base rule (`waves`): as many of a group's heads as keep `waves` waves of CTAs. Every CTA pays a
// set-up of a few DRAM round trips, so fewer, larger CTAs win where the waves stay full; small batches
// need more, smaller CTAs to fill the SMs. The refinements (HeadsRules) and why: docs/TUNING.md,
// "Replay step".
int mamba2_heads_per_cta(int64_t batch, int heads, int groups, int ctas_per_sm, int sm_count,
                         const HeadsRules& rules, int forced) {
  const int heads_per_group = heads / groups;
  if (forced >= 1) return largest_divisor_at_most(heads_per_group, forced);
  const int64_t resident = resident_ctas(sm_count, ctas_per_sm);
  const int64_t group_ctas = batch * groups;
  // one_wave: where whole groups fill every SM in a single wave, splitting them only adds set-ups and a
  // second, partial wave.
  if (rules.one_wave && group_ctas >= sm_count && group_ctas <= resident) return heads_per_group;
  // one_wave below one CTA per SM: the smallest block whose CTAs still all start at once.
  if (rules.one_wave && group_ctas < sm_count) {
    for (int d = 1; d < heads_per_group; ++d) {
      if (heads_per_group % d == 0 && batch * (heads / d) <= resident) return d;
    }
    return heads_per_group;
  }
  const int64_t target = rules.waves * resident;
  int chosen = 1;
  for (int d = heads_per_group; d > 1; --d) {
    if (heads_per_group % d == 0 && batch * (heads / d) >= target) {
      chosen = d;
      break;
    }
  }
  // full_waves: at two CTAs an SM a CTA's start hides behind the other's, so larger CTAs win wherever
  // their last wave stays full (not at three, where they lost).
  if (rules.full_waves && ctas_per_sm <= 2) {
    for (int d = heads_per_group; d > chosen; --d) {
      if (heads_per_group % d == 0 && batch * (heads / d) >= resident && slots_used(batch * (heads / d), resident) >= 95) {
        return d;
      }
    }
  }
  // half_below_four_waves: whole groups in fewer than four waves leave too much of the last one empty.
  if (rules.half_below_four_waves && chosen == heads_per_group && batch * groups < 4 * resident) {
    for (int d = heads_per_group / 2; d > 1; --d) {
      if (heads_per_group % d == 0) return d;
    }
  }
  // fill_last_wave: the `waves` rule counts whole waves; where its CTAs leave > 5% of their waves'
  // slots empty, CTAs of at least half its size that leave <= 10% (smaller ones pay the set-up too often).
  if (rules.fill_last_wave && chosen > 1) {
    const int64_t used = slots_used(batch * (heads / chosen), resident);
    if (used < 95) {
      for (int d = chosen - 1; 2 * d >= chosen; --d) {
        if (heads_per_group % d != 0) continue;
        const int64_t used_d = slots_used(batch * (heads / d), resident);
        if (used_d >= 90 && used_d > used) return d;
      }
    }
  }
  return chosen;
}

// Two-group CTAs: a quarter as many CTAs pay the set-up (a third of an fp8-copy CTA's life at batch
// 64) once, where they fit in one wave or fill >= 95% of their waves' slots. Not with a bf16 copy (its
// step is near copy speed already), nor below one wave of whole groups.
bool mamba2_two_group_ctas(int64_t batch, int groups, int ctas_per_sm, int sm_count, bool by_rule,
                           const LaunchOverrides& overrides) {
  if (groups % 2 != 0) return false;
  if (overrides.step_groups_per_cta != 0) return overrides.step_groups_per_cta == 2;
  if (!by_rule || overrides.step_heads_per_cta > 0) return false;
  const int64_t resident = resident_ctas(sm_count, ctas_per_sm);
  if (batch * groups <= resident) return false;  // whole groups in one wave
  const int64_t pair_ctas = batch * (groups / 2);
  if (pair_ctas <= resident) return true;  // one wave of two-group CTAs
  return slots_used(pair_ctas, resident) >= 95;
}

// The fold split: under the hint a step folds about batch / L slots, one folding CTA's heads one
// after the other, so the folding rows get smaller CTAs than the replaying ones, all in one wave. Only
// where every row's whole-group CTAs fit in one wave and the hint's own launch makes >= 3 waves, or >= 2
// where every step has a fold (batch >= L; below both the order pass costs more than the split saves:
// at batch < L it runs in steps that fold nothing), with folding CTAs of at most 2 heads.
// step_fold_split = k >= 1 (an override, for tuning the shapes the rule was not measured at) forces folds
// of k heads: from step_staggered_heads_per_cta's block where that is set, else from the rule's replay
// block where the rule splits, else from the hint's own block, in any number of waves.
FoldSplit mamba2_fold_split(int64_t batch, int heads, int groups, int buffer_len, int ctas_per_sm, int sm_count,
                            int hint_heads, const LaunchOverrides& overrides) {
  const FoldSplit none;
  if (overrides.step_fold_split == 0 || overrides.step_heads_per_cta > 0) return none;
  if (batch < 1 || buffer_len < 1 || hint_heads < 1) return none;
  const int heads_per_group = heads / groups;
  const int64_t resident = resident_ctas(sm_count, ctas_per_sm);
  const int64_t rows = (batch + buffer_len - 1) / buffer_len;  // the folds of a step of an even stagger
  FoldSplit rule = none;
  const int64_t hint_ctas = batch * (heads / hint_heads);
  const bool enough_waves = hint_ctas >= 3 * resident || (batch >= buffer_len && hint_ctas >= 2 * resident);
  if (overrides.step_staggered_heads_per_cta <= 0 && batch * groups <= resident && enough_waves) {
    constexpr int kMaxFoldHeads = 2;
    for (int replay = 2; replay <= heads_per_group && rule.split == 1; ++replay) {
      if (heads_per_group % replay != 0 || batch * (heads / replay) > resident) continue;
      for (int fold = 1; fold < replay && fold <= kMaxFoldHeads; ++fold) {
        if (replay % fold != 0) continue;
        if (batch * (heads / replay) + rows * (heads / fold - heads / replay) <= resident) {
          rule = FoldSplit{replay, replay / fold, static_cast<int>(rows)};
          break;
        }
      }
    }
  }
  if (overrides.step_fold_split < 1) return rule;
  const int replay = rule.split > 1 ? rule.heads_per_cta : hint_heads;
  const int fold = largest_divisor_at_most(replay, overrides.step_fold_split);
  // The grid's rows: the batch and the helper rows of the split (grid.y <= 65535).
  if (fold >= replay || batch + rows * (replay / fold - 1) > 65535) return none;
  return FoldSplit{replay, replay / fold, static_cast<int>(rows)};
}

// The split: with few (row, head) items, whole heads leave SMs idle and make each busy one stream a
// whole tile (32 KB for fp32 64 x 128) in and out alone, so the kernel's time is one SM's transfer of it
// after the DRAM round trips; items of one pass of rows (4 KB there) spread the same bytes over every
// SM, as the conventional kernels of other libraries do at small batches (many small CTAs). Measured
// (H100, 132 SMs, fp32 64 x 128): it wins at 32 and 64 items (super120b TP 4 batch 1: 4.88 -> 3.95 us,
// batch 2: 5.51 -> 5.18 us) and loses from 96 items (nano4b batch 1: 6.50 -> 8.35 us; 128 items:
// 6.74 -> 8.2 us), where whole heads already keep most SMs streaming; hence up to half an item per SM.
bool mamba2_update_split(int64_t batch, int heads, int parts, int sm_count, const LaunchOverrides& overrides) {
  if (parts <= 1 || overrides.update_split == 0) return false;
  if (overrides.update_split == 1) return true;
  return 2 * batch * heads <= sm_count;
}

namespace {

// The update's items: (row, head) tiles, or with the split their one-pass parts (the stage and claims
// rules count the same items).
int64_t update_items(const Mamba2UpdateProblem& problem) {
  return problem.batch * problem.heads * std::max(problem.parts, 1);
}

}  // namespace

// Ring stages of the update: as many tiles (up to 4) as let two CTAs share an SM (a CTA's start hides
// behind the other's), else as many (up to 4) as one CTA holds. Where each CTA of that two-an-SM wave
// has 5.5 items or more, 2 stages: two CTAs an SM already stream at copy rate with two tiles each in
// flight, and a deeper ring only lengthens the queue in front of every load (as for the GDN step's tile);
// with fewer items a CTA's whole share goes out at its start. H100, 3 / 2 stages: super120b@tp4 b64 53.00
// / 51.68 us (fp32), 32.50 / 29.74 (bf16, from 4); below the threshold 2 stages lost on full-width heads
// (super120b b8 26.62 / 27.69). Every measurement behind it: docs/TUNING.md, ring stages.
int plan_mamba2_update_stages(const Mamba2UpdateProblem& problem, const DeviceInfo& device,
                              const LaunchOverrides& overrides) {
  const int fit = (device.smem_per_block_optin - problem.static_bytes) / problem.tile_bytes;
  if (overrides.update_stages >= 1) return std::min({overrides.update_stages, fit, problem.max_stages});
  constexpr int kPerCtaReserve = 2048;  // the runtime's 1 KB per CTA and the static barriers, rounded up
  const int two = (device.smem_per_sm / 2 - kPerCtaReserve) / problem.tile_bytes;
  if (two < 2) return std::max(1, std::min({fit, 4, problem.max_stages}));
  const int64_t items = update_items(problem);
  constexpr int64_t kShallowHalfItems = 11;  // 5.5 items a CTA of two an SM, in half items
  const int64_t two_wave = 2 * static_cast<int64_t>(device.sm_count);
  return 2 * items >= kShallowHalfItems * two_wave ? 2 : std::min(two, 4);
}

// One wave of persistent CTAs. Past the first `stages` rounds, items are claimed from a counter by
// whichever CTA is ready (CTAs stream at different rates; with fixed shares the last SMs finished far
// behind the median), where at least 2.25 rounds of items are left to claim past the ring's first
// `stages`: the counter's zeroing costs a memset node (~2 us), which loses below that. H100, fixed shares
// / claims, rounds of items (stages): won at super120b@tp4 b64 7.8 (3) 52.79 / 51.97 us, nano4b@tp2 b32
// 5.8 (2) 49.80 / 48.30, super120b b11 5.3 (3) 38.35 / 37.41, nano4b b12 4.4 (2) 38.32 / 37.44; even at
// super120b@tp4 b44 5.3 (3) 38.23 / 38.43; lost at nano4b b11 4.0 (2) 34.30 / 35.14, super120b b10 4.8
// (3) 33.97 / 34.51, super120b@tp4 b32 3.9 (3) 26.86 / 28.99. With fixed shares the grid is trimmed so
// that shares differ by at most one item (a CTA with one more would run its last item alone).
Mamba2UpdatePlan plan_mamba2_update(const Mamba2UpdateProblem& problem, int stages, int ctas_per_sm,
                                    const DeviceInfo& device, const LaunchOverrides& overrides) {
  Mamba2UpdatePlan plan;
  plan.stages = stages;
  int64_t wave = static_cast<int64_t>(device.sm_count) * ctas_per_sm;
  if (overrides.update_ctas >= 1 && overrides.update_ctas < wave) wave = overrides.update_ctas;
  const int64_t items = update_items(problem);
  constexpr int64_t kClaimedQuarterRounds = 9;  // 2.25 rounds
  plan.claims = problem.work_counter && overrides.update_claims != 0 && items > stages * wave &&
                (overrides.update_claims == 1 || 4 * items >= (4 * stages + kClaimedQuarterRounds) * wave) &&
                items < (int64_t{1} << 30);
  if (plan.claims) {
    plan.grid = wave;
  } else {
    const int64_t rounds = (items + wave - 1) / wave;
    plan.grid = (items + rounds - 1) / rounds;
  }
  return plan;
}

// Under the staggered-flush hint a step lasts as long as its folding CTAs, which larger CTAs make
// longer: the base rule at four waves and none of the refinements, whatever the replay.
// step_staggered_heads_per_cta: the hint's block chosen by hand, the lock-step launches left to the rules.
int mamba2_staggered_heads_per_cta(int64_t batch, int heads, int groups, int ctas_per_sm, int sm_count,
                                   const LaunchOverrides& overrides) {
  if (overrides.step_staggered_heads_per_cta > 0 && overrides.step_heads_per_cta <= 0) {
    return largest_divisor_at_most(heads / groups, overrides.step_staggered_heads_per_cta);
  }
  return mamba2_heads_per_cta(batch, heads, groups, ctas_per_sm, sm_count, HeadsRules{}, overrides.step_heads_per_cta);
}

// The step: the heads-per-CTA rules that fit its kernel, then two-group CTAs, the order pass and the
// fold split. Waves in lock-step: the tensor-core replay's set-up is the larger part of a CTA at batch
// 32-128, so two waves of larger CTAs beat four of smaller ones (four on CUDA cores).
Mamba2StepPlan plan_mamba2_step(const Mamba2StepProblem& problem, int ctas_per_sm, const DeviceInfo& device,
                                const LaunchOverrides& overrides) {
  const bool hint = problem.staggered_flush;
  const bool copy = problem.read_copy != ReadCopyKind::kNone;
  const bool tf32_replay = problem.fp32_checkpoint && !copy;  // the fp32 checkpoint's tensor-core replay
  const bool copy16 = problem.read_copy == ReadCopyKind::k16Bit && problem.tensor_replay && problem.fp32_checkpoint;
  Mamba2StepPlan plan;
  if (hint) {
    plan.heads_per_cta = mamba2_staggered_heads_per_cta(problem.batch, problem.heads, problem.groups, ctas_per_sm,
                                                        device.sm_count, overrides);
  } else {
    HeadsRules rules;
    rules.waves = problem.tensor_replay ? 2 : 4;
    rules.one_wave = true;
    rules.full_waves = !problem.tensor_replay;
    rules.fill_last_wave = tf32_replay;
    rules.half_below_four_waves = copy16;
    plan.heads_per_cta = mamba2_heads_per_cta(problem.batch, problem.heads, problem.groups, ctas_per_sm,
                                              device.sm_count, rules, overrides.step_heads_per_cta);
  }
  if (copy && problem.tensor_replay && !hint &&
      mamba2_two_group_ctas(problem.batch, problem.groups, ctas_per_sm, device.sm_count,
                            /*by_rule=*/problem.read_copy == ReadCopyKind::kFp8, overrides)) {
    plan.kernel = StepKernel::kTwoGroups;
    plan.heads_per_cta = 2 * (problem.heads / problem.groups);
    plan.grid_x = problem.groups / 2;
    plan.grid_y = problem.batch;
    return plan;
  }
  plan.grid_x = problem.heads / plan.heads_per_cta;
  plan.grid_y = problem.batch;
  // The order pass (staggered flush): the folding rows' CTAs first, where a fold costs several replays
  // (4-8 with a copy, ~2 without). Not in one wave (every CTA starts at once) nor for small CTAs (short
  // folds: the pass's launch cost more than it won). A 16-bit checkpoint without a copy too: H100, bf16
  // checkpoint, staggered cycle without / with the pass (lock-step beside), super120b b64 78.4 / 67.3 us
  // (63.0), b256 280.8 / 220.0 (229.5); super120b@tp4 b64 28.7 / 21.6 (20.2); nano4b@tp2 b64 42.5 / 35.9
  // (33.8); and its one loss, one-head CTAs at super120b@tp8 b32 13.0 / 13.7, is a launch the rule
  // leaves plain (docs/TUNING.md).
  const bool order = hint && problem.order_workspace && overrides.step_order != 0;
  if (!order) return plan;
  const FoldSplit split = mamba2_fold_split(problem.batch, problem.heads, problem.groups, problem.buffer_len,
                                            ctas_per_sm, device.sm_count, plan.heads_per_cta, overrides);
  if (split.split > 1) {
    plan.kernel = StepKernel::kOrdered;
    plan.heads_per_cta = split.heads_per_cta;
    plan.fold_split = split.split;
    plan.fold_split_rows = split.rows;
    plan.grid_x = problem.heads / plan.heads_per_cta;
    plan.grid_y = problem.batch + static_cast<int64_t>(split.rows) * (split.split - 1);
    return plan;
  }
  const int min_ordered_heads = copy ? 2 : 3;
  const bool more_than_one_wave = plan.grid_x * plan.grid_y > resident_ctas(device.sm_count, ctas_per_sm);
  if (overrides.step_order == 1 || (plan.heads_per_cta >= min_ordered_heads && more_than_one_wave)) {
    plan.kernel = StepKernel::kOrdered;
  }
  return plan;
}

// Verify's ring: the compiled depth, fewer stages where a long buffer and many drafts need the room:
// first down to 2 to keep the CTAs per SM the launch bounds assume, then as far as the opt-in limit
// demands.
int plan_mamba2_verify_stages(const RingBytes& ring, const DeviceInfo& device) {
  auto bytes = [&](int stages) { return ring.dynamic_bytes[stages] + ring.static_bytes; };
  const size_t optin = static_cast<size_t>(device.smem_per_block_optin);
  const int ctas = ring.compiled_ctas_per_sm > 0 ? ring.compiled_ctas_per_sm : 1;
  const size_t per_cta = static_cast<size_t>(device.smem_per_sm / ctas - 1024);
  int stages = ring.compiled_stages;
  while (stages > 2 && bytes(stages) > per_cta) --stages;
  while (stages > 1 && bytes(stages) > optin) --stages;
  return bytes(stages) <= optin ? stages : 0;
}

// Verify's heads per CTA: the base rule at four waves (not tuned for verify beyond it).
Mamba2VerifyPlan plan_mamba2_verify(const Mamba2VerifyProblem& problem, int stages, int ctas_per_sm,
                                    const DeviceInfo& device, const LaunchOverrides& overrides) {
  Mamba2VerifyPlan plan;
  plan.heads_per_cta = mamba2_heads_per_cta(problem.batch, problem.heads, problem.groups, ctas_per_sm,
                                            device.sm_count, HeadsRules{}, overrides.verify_heads_per_cta);
  plan.ring_stages = stages;
  plan.grid_x = problem.heads / plan.heads_per_cta;
  plan.grid_y = problem.batch;
  return plan;
}

// The fold's ring: the compiled depth (3 where it keeps the CTAs per SM), 2 where a long buffer leaves
// no room for it.
int plan_mamba2_fold_stages(const RingBytes& ring, const DeviceInfo& device) {
  auto fits = [&](int stages) {
    return ring.dynamic_bytes[stages] + ring.static_bytes <= static_cast<size_t>(device.smem_per_block_optin);
  };
  if (fits(ring.compiled_stages)) return ring.compiled_stages;
  return fits(2) ? 2 : 0;
}

// One wave of persistent CTAs, never more than there are (row, head) items.
Mamba2FoldPlan plan_mamba2_fold(const Mamba2FoldProblem& problem, int stages, int ctas_per_sm,
                                const DeviceInfo& device) {
  Mamba2FoldPlan plan;
  plan.ring_stages = stages;
  const int64_t items = problem.batch * problem.heads;
  // The layers of a layered launch share the resident CTAs: each layer's CTAs walk its items as one
  // layer's persistent grid does (at least one CTA per layer; more layers than resident CTAs queue).
  const int64_t layers = std::max(problem.layers, 1);
  plan.grid = std::min(items, std::max<int64_t>(resident_ctas(device.sm_count, ctas_per_sm) / layers, 1));
  return plan;
}

}  // namespace launch
}  // namespace replayssm
