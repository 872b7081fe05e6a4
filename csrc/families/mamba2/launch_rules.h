// Launch rules of the Mamba-2 step and verify kernels (host code): how many of a group's heads a CTA
// pipelines, where a CTA takes two groups, and the staggered step's fold split, with the environment
// knobs that override them.
#pragma once

#include <cstdint>
#include <cstdlib>

#include <cuda_runtime_api.h>

namespace replayssm {
namespace mamba2 {

// Whether the on/off knob `name` is set to exactly "0" (read at every launch; any other value, or none,
// leaves the launcher's default).
inline bool knob_is_off(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] == '0' && value[1] == '\0';
}

// Whether the step under the staggered_flush hint may run its order pass (mamba2_step_order.cu) and
// with it the fold split: REPLAYSSM_STEP_ORDER=0 turns both off (read at every launch: a tuning and
// testing knob; other values leave the launcher's rule).
inline bool step_order_pass() { return !knob_is_off("REPLAYSSM_STEP_ORDER"); }

// SMs of the current device (132 on the H200 if the query fails).
inline int multiprocessor_count() {
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms;
}

// Heads per CTA of the kernels that pipeline a group's heads through a ring (step, verify): as many of
// a group's heads as keep at least `waves` waves of CTAs on the GPU (small batches need more, smaller
// CTAs to fill the SMs; each CTA pays a set-up of a few DRAM round trips, so fewer waves of larger CTAs
// trade that set-up against the last wave's tail). The environment variable `knob`
// (REPLAYSSM_STEP_HEADS_PER_CTA, REPLAYSSM_SPEC_HEADS_PER_CTA) = k overrides it with the largest divisor
// of the group size <= k (read at every launch: tests and benchmarks use it to exercise and compare both
// ends).
//
// one_wave: CTAs that all start at once, in a single wave. Where one CTA per (row, group) fills every SM
// that way (batch x groups between the SMs and the CTAs they hold at once), the whole group: splitting
// a group there only adds CTAs, each paying its own set-up, and a second, partial wave (session 21, run
// 5: at batch 32 whole-group CTAs made every lock-step replay step 13-20% faster, no copy, bf16 and fp8
// copies, both dims sets; the fp8 fold step within +1.2%). Below that (batch x groups < SMs: batch <= 16
// at 8 groups), the smallest part of a group whose CTAs the SMs still hold at once: the most CTAs
// without a second wave. The `waves` rule gives one head per CTA there, a second wave wherever
// batch x heads passes the resident CTAs (session 23's sweep, lock-step cycles: 16-62% slower at
// super120b batch 4-16, 6-41% at nano4b batch 8-16). The step takes it without the staggered-flush
// hint. Not with the hint, where a folding CTA must stay short: there the same rule made the staggered
// mean step 19-43% slower at batch 16 (both dims sets, every copy but nano4b's no-copy one) for at most
// 10% gained at batch 8 (session 23, run 5).
//
// full_waves (the step's CUDA-core kernels without the hint), where at most two CTAs share an SM: past
// the `waves` rule's choice, the largest part of a group whose CTAs fill their last wave to >= 95%
// (CTAs / resident over its ceiling). With two CTAs an SM, a CTA's start (its slot -> cursor chain and
// the ring's first fill) has one other CTA to hide behind, so fewer, larger CTAs win wherever the last
// wave stays full (session 26's sweep, no-copy step at w = 8, nano4b: batch 48 64.2 -> 60.0 us with 6
// heads (2.91 waves), 64 80.5 -> 74.9 with 12 (1.94), 96 109.1 -> 106.9, 128 141.0 -> 139.2; whole groups
// at 1.45 waves lost 10%). Not at three CTAs an SM, where the same CTAs gained nothing or lost (super120b,
// batch 96-192: whole groups 1.0-2.3% slower at 1.94-3.88 waves, 16% at batch 64, 1.29). Measured on the fp32
// checkpoint's kernels; the 16-bit checkpoints' CUDA-core kernels at two CTAs an SM take it unmeasured.
//
// fill_last_wave (the fp32 checkpoint's tensor-core replay without a copy, without the hint): where the
// `waves` rule's CTAs leave more than 5% of the slots of their waves (rounded up) empty, CTAs of at least
// half its heads that leave fewer empty, if at most 10% (the largest such divisor). The `waves` rule
// counts whole waves only: at nano4b batch 80 its whole groups make 2.42 waves at two CTAs an SM (81% of
// the slots of three), and the step lost 3.8% to 6-head CTAs (4.85 waves, 97%). Not smaller than half:
// smaller CTAs pay their set-up more often, and were not measured past half. Session 38's sweeps
// (scripts/step_knob_sweep.py, b40-512, every batch it changes against the `waves` rule's CTAs in the
// same process): nano4b 12 -> 6 heads at b80 / 112 / 144 / 176 / 208 / 240, the step 2.2-3.8% faster,
// 6 -> 4 at b40 / 50 (-3.3 / -2.8%), 6 -> 3 at b56 (-0.5%); super120b (three CTAs an SM) 8 -> 4 at
// b56 / 60 / 80 (-1.4..-2.9%), 16 -> 8 at b112 / 160 / 208 / 320 (-0.6..-3.9%) and b256 / 448 / 512
// (-0.1..-0.2%, the cycle -0.3..-0.5%). Where half-size CTAs leave as many slots empty (super120b b64,
// b128, b176, b224) it keeps the larger ones.
//
// half_below_four_waves (the bf16 / fp16 copies' tensor-core step, without the hint): where the `waves`
// rule takes whole groups whose CTAs make fewer than four waves (batch 99-197 at 8 groups, 3 CTAs an
// SM), CTAs of half a group (the largest divisor of at most half, if one is 2 or more; else whole
// groups). Session 39, bf16 copy, half-size
// against whole-group CTAs in one process (scripts/step_knob_sweep.py): run 1, cycle at nano4b batch
// 112 84.1 -> 82.3 us, 160 -1.2%, 176 -0.6%, 208 -0.3%, super120b 112 89.9 -> 86.8, 160 -1.1%, 176 / 208
// -0.3%, but at 256-512 (5.2-10.3 waves) +0.3..+0.6% (their folds +1.8..+2.6%); run 5, this rule: nano4b
// 112 84.7 -> 82.8 us (-2.2%), 160 -1.3%, 176 -0.9%, super120b 112 90.6 -> 87.3 (-3.6%), 160 -1.2%, 176
// -0.5%, the other batches of 99-197 within 0.3% (where whole groups fill their waves as well: 99, 128,
// 144, 192). Not with an fp8 copy, whose half-size CTAs were 10-16% slower steps at every batch.
inline int choose_heads_per_cta(int64_t batch, int heads, int groups, int ctas_per_sm, const char* knob, int waves = 4,
                                bool one_wave = false, bool full_waves = false, bool fill_last_wave = false,
                                bool half_below_four_waves = false) {
  const int heads_per_group = heads / groups;
  if (const char* forced = std::getenv(knob)) {
    const int k = std::atoi(forced);
    if (k >= 1) {
      for (int d = k < heads_per_group ? k : heads_per_group; d > 1; --d) {
        if (heads_per_group % d == 0) return d;
      }
      return 1;
    }
  }
  const int sms = multiprocessor_count();
  const int64_t resident = static_cast<int64_t>(sms) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  const int64_t group_ctas = batch * groups;
  if (one_wave && group_ctas >= sms && group_ctas <= resident) return heads_per_group;
  if (one_wave && group_ctas < sms) {   // the smallest part of a group that keeps every CTA in one wave
    for (int d = 1; d < heads_per_group; ++d) {
      if (heads_per_group % d == 0 && batch * (heads / d) <= resident) return d;
    }
    return heads_per_group;
  }
  const int64_t target = waves * resident;
  int chosen = 1;
  for (int d = heads_per_group; d > 1; --d) {
    if (heads_per_group % d == 0 && batch * (heads / d) >= target) {
      chosen = d;
      break;
    }
  }
  // The share of the slots of its waves (rounded up) that a launch of d-head CTAs uses, in percent.
  auto slots_used = [&](int d) {
    const int64_t ctas = batch * (heads / d);
    return 100 * ctas / (((ctas + resident - 1) / resident) * resident);
  };
  if (full_waves && ctas_per_sm <= 2) {
    for (int d = heads_per_group; d > chosen; --d) {
      if (heads_per_group % d == 0 && batch * (heads / d) >= resident && slots_used(d) >= 95) return d;
    }
  }
  if (half_below_four_waves && chosen == heads_per_group && batch * groups < 4 * resident) {
    for (int d = heads_per_group / 2; d > 1; --d) {
      if (heads_per_group % d == 0) return d;
    }
  }
  if (fill_last_wave && chosen > 1) {
    const int64_t used = slots_used(chosen);
    if (used < 95) {
      for (int d = chosen - 1; 2 * d >= chosen; --d) {
        if (heads_per_group % d == 0 && slots_used(d) >= 90 && slots_used(d) > used) return d;
      }
    }
  }
  return chosen;
}

// The tensor-core replay step's CTAs of two whole groups of one row, with a read copy (heads_per_cta =
// 2 x the group's heads; the CTA switches B's window, the window dots and C's fragments at the second
// group's first head; a kernel of its own, kTwoGroups). By rule (`by_rule`: an fp8 copy) where
// whole-group CTAs would not fit in one wave of resident CTAs and two-group ones do (batch 50-99 at 8
// groups, three CTAs an SM, 132 SMs). There the `waves` rule takes half groups (2.6 waves at batch 64),
// and each CTA pays a set-up (barriers, the cursor, the first tile's DRAM round trip) that is a third of
// a whole-group fp8-copy CTA's life (session 28's time lines: ~5.7 us against ~0.8 us a head, 12
// heads); a quarter as many CTAs, in one wave, pay it once (session 30, run 4, nano4b / super120b, the
// fp8-copy step at batch 64 37.1 -> 32.8 / 41.1 -> 35.8 us, at batch 96 49.7 -> 42.0 / 55.4 -> 44.8).
// Past one wave, where two-group CTAs fill at least 95% of the CTA slots of their waves (rounded up):
// there the fewer set-ups win too (session 39, run 3, both dims sets, fp8 step / cycle: batch 192
// nano4b 73.7 -> 70.8 / 99.4 -> 96.6 us, super120b 79.1 -> 78.0 / 106.5 -> 104.5; 1.94 waves, 97% of
// their slots), but not where a partly empty last wave costs more than the set-ups save (128 / 160 /
// 224 / 256 / 320 / 448 / 512: 65-91% of the slots, the step 0.7-18% slower; session 29 at batch 128:
// 59.9 -> 65.4 us). Run 4, this rule against whole groups in one process: the cycle 1.8-2.4% faster at
// batch 189 / 192 / 198, 1.4-1.5% at 288 / 296, 0.4-1.1% at 380 / 384 / 396 / 480 / 495 (there the
// step moves -1.1..+1.6%, the fold -1.4..+1.5%: within about 1% there), both dims sets; 188 / 256 /
// 282 / 448 unchanged.
// Not with a bf16 copy, whose cycle lost 2.6% at batch 96 in session 30 (its step is at 78-85% of copy
// already; at batch 192 / 384 its cycle 1.3-2.8% slower in session 39), nor below one wave (super120b
// batch 32: 22.3 -> 30.0 us, fewer CTAs than SMs, session 30's run 3). REPLAYSSM_STEP_GROUPS_PER_CTA=1
// turns it off, =2 forces it wherever the groups pair up (an even count; bf16 / fp16 copies too); read
// at every launch.
inline bool choose_two_group_ctas(int64_t batch, int groups, int ctas_per_sm, bool by_rule) {
  if (groups % 2 != 0) return false;
  if (const char* forced = std::getenv("REPLAYSSM_STEP_GROUPS_PER_CTA")) return std::atoi(forced) == 2;
  if (!by_rule || std::getenv("REPLAYSSM_STEP_HEADS_PER_CTA") != nullptr) return false;
  const int64_t resident = static_cast<int64_t>(multiprocessor_count()) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  if (batch * groups <= resident) return false;  // whole groups in one wave
  const int64_t pair_ctas = batch * (groups / 2);
  if (pair_ctas <= resident) return true;  // one wave of two-group CTAs
  const int64_t slots = (pair_ctas + resident - 1) / resident * resident;  // of their waves, rounded up
  return 100 * pair_ctas >= 95 * slots;
}

// The step's fold split (staggered-flush hint, with a read copy): CTAs of `heads_per_cta` heads for the
// replaying rows, and for the first `rows` folding rows (the order pass lists them first) `split` times
// smaller CTAs, so that a step whose few folding slots each cost several replays lasts about as long as
// its replaying CTAs. split = 1: no split (the step keeps choose_heads_per_cta's launch, `hint_heads`
// heads per CTA).
//
// Why: under the hint a step folds about batch / L slots, and a folding CTA of d heads folds them one
// after the other, so with one CTA size for all rows either the replay pays for small CTAs (each with
// its own set-up, in several waves) or the folds are long. The hint's launch (one or two heads per CTA
// below batch 50 at 8 groups) made staggered mean steps 14-61% above lock-step's at batch 4-32
// (session 24, run 1).
//
// Rule, from session 24's sweep (run 3, batch 4-48, bf16 and fp8 copies, same process with and
// without): only where
//   - whole-group CTAs of every row fit in one wave (batch x groups <= resident CTAs);
//   - the hint's launch makes at least 3 waves of CTAs. Below that the split lost 2-18% (super120b
//     batch 4-8, nano4b 6-8): its order pass (~3 us of GPU time ahead of the step) costs more than the
//     larger replay CTAs save; from 3.9 waves on it won 3-24% (batch 12-32);
//   - folding CTAs of at most 2 heads (4-head folds lost 5-9% with a bf16 copy at batch 40).
// rows = ceil(batch / L), the folds per step of an even stagger (a step with more folds than that folds
// the rest in replay-sized CTAs). Then the smallest replay CTAs whose CTAs fit in one wave (the one-wave
// rule: the most CTAs that start at once) with the smallest fold CTAs that still keep every CTA in that
// wave, else the next larger replay CTAs. REPLAYSSM_STEP_FOLD_SPLIT=0 in the environment turns it off,
// as does REPLAYSSM_STEP_HEADS_PER_CTA.
struct FoldSplit {
  int heads_per_cta = 0;  // the replaying rows' CTAs (0: no split)
  int split = 1;          // a folding row's CTAs have heads_per_cta / split heads
  int rows = 0;           // folding rows served so (the first ones in the order pass's list)
};
inline FoldSplit choose_fold_split(int64_t batch, int heads, int groups, int buffer_len, int ctas_per_sm,
                                   int hint_heads) {
  FoldSplit none;
  if (const char* off = std::getenv("REPLAYSSM_STEP_FOLD_SPLIT")) {
    if (std::atoi(off) == 0) return none;
  }
  if (std::getenv("REPLAYSSM_STEP_HEADS_PER_CTA") != nullptr || batch < 1 || buffer_len < 1 || hint_heads < 1) {
    return none;
  }
  const int heads_per_group = heads / groups;
  const int64_t resident = static_cast<int64_t>(multiprocessor_count()) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  if (batch * groups > resident || batch * (heads / hint_heads) < 3 * resident) return none;
  const int64_t rows = (batch + buffer_len - 1) / buffer_len;
  constexpr int kMaxFoldHeads = 2;
  for (int replay = 2; replay <= heads_per_group; ++replay) {
    if (heads_per_group % replay != 0 || batch * (heads / replay) > resident) continue;
    for (int fold = 1; fold < replay && fold <= kMaxFoldHeads; ++fold) {
      if (replay % fold != 0) continue;
      if (batch * (heads / replay) + rows * (heads / fold - heads / replay) <= resident) {
        return FoldSplit{replay, replay / fold, static_cast<int>(rows)};
      }
    }
  }
  return none;
}

}  // namespace mamba2
}  // namespace replayssm
