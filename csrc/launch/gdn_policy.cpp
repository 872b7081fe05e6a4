// Launch plans of the Gated DeltaNet kernels (gdn_policy.h). Each rule carries its reason in a line;
// docs/TUNING.md ("Gated DeltaNet") lists them with their overrides.
#include "launch/gdn_policy.h"

#include <algorithm>

#include "launch/waves.h"

namespace replayssm {
namespace launch {

// The update's rows are independent, so each (row, v-head) tile is cut into CTAs of a few value rows
// with no barrier: many small CTAs interleave the reads and writes of different tiles, which is how a
// [V, K] state streams at copy bandwidth (flash-linear-attention's fused_recurrent does the same).
// 16 KB CTAs (128 bytes of state in flight a thread) at every batch but the smallest. The split: where
// the tiles are few (4 x batch x HV <= SMs: at most a quarter of a tile an SM), CTAs of 4 KB (32 bytes a
// thread), so the same bytes spread over four times the CTAs and each CTA's chain of round trips is
// shorter. H100, one run, 16 KB / 4 KB CTAs: qwen4b b1 4.88 / 4.62 us, qwen122b@tp4 b1 4.19 / 3.83, b2
// 4.86 / 4.62, kimi48b b1 6.70 / 6.38, kimi48b@tp4 b1 5.83 / 5.21, b4 6.71 / 6.37; even at 64 tiles
// (qwen4b b2 6.12 / 6.18, qwen122b@tp4 b4 6.11 / 6.16, kimi48b b2 8.00 / 7.96, kimi48b@tp4 b8 8.01 /
// 7.97), lost from there (qwen4b b4 8.98 / 9.53, b8 14.89 / 17.24, kimi48b b4 10.96 / 13.91). Between,
// qwen122b@tp4 b3 (48 tiles) 5.54 / 5.43 is left to the 16 KB CTAs.
GdnUpdatePlan plan_gdn_update(const GdnUpdateProblem& problem, int sm_count, const LaunchOverrides& overrides) {
  GdnUpdatePlan plan;
  const bool can_split = problem.split_ctas_per_head > 0 && overrides.gdn_update_split != 0;
  plan.split = can_split && (overrides.gdn_update_split == 1 || 4 * problem.batch * problem.v_heads <= sm_count);
  plan.grid_x = static_cast<int64_t>(problem.v_heads) * (plan.split ? problem.split_ctas_per_head : problem.ctas_per_head);
  plan.grid_y = problem.batch;
  return plan;
}

// The most parts (1, 2, 4, up to V / 32: a part is whole fold passes of 32 rows) whose CTAs do not
// outnumber the SMs: a step CTA alone on its SM is a chain of dependent round trips (slot, tile and
// cursor, window, rows, and the fold's passes where it folds), which a part shortens (H200, qwen4b
// batch 1: lock-step cycle 8.29 -> 7.25 us at 4 parts, 128 CTAs). Once CTAs share SMs their tiles
// overlap anyway, and a part only repeats the head's set-up (token, window keys, slot and cursor)
// while keeping a whole tile's shared memory, so fewer bytes are in flight an SM: batch 8, 512 CTAs at
// 2 parts, 12.74 -> 17.63 us; batch 64 and 256 +16-45% at 2 parts. The staggered-flush hint changes
// nothing: 2 parts shortened the staggered copy cycles at some batches and lengthened them at others.
int gdn_step_parts(int64_t batch, int v_heads, int v_dim, int sm_count, int forced) {
  // A part is whole fold passes of 32 rows, and a slot's CTAs (v_heads parts) draw at most 32767 cursor
  // tickets (cache/cursor.cuh).
  int most = std::max(v_dim / 32, 1);
  while (most > 1 && static_cast<int64_t>(v_heads) * most > 32767) most /= 2;
  if (forced >= 1) {
    int parts = 1;
    while (parts * 2 <= std::min(forced, most) && most % (parts * 2) == 0) parts *= 2;
    return parts;
  }
  int parts = 1;
  while (parts * 2 <= most && batch * v_heads * parts * 2 <= sm_count) parts *= 2;
  return parts;
}

// The CTAs of a slot are its (v-head, part)s, which the cursor tickets count.
GdnStepPlan plan_gdn_step(const GdnStepProblem& problem, const DeviceInfo& device, const LaunchOverrides& overrides) {
  GdnStepPlan plan;
  plan.parts = gdn_step_parts(problem.batch, problem.v_heads, problem.v_dim, device.sm_count, overrides.gdn_step_parts);
  plan.grid_x = static_cast<int64_t>(problem.v_heads) * plan.parts;
  plan.grid_y = problem.batch;
  // The order pass under the staggered-flush hint where the CTAs take more than one wave: only then can
  // a folding row's CTAs (each a fold, several replays long) start late and outlast the step. H100, one
  // run, staggered cycles without / with it: qwen4b b64 bf16 copy 97.9 -> 73.9 us (lock-step 73.0), fp8
  // 87.4 -> 65.9 (63.3); qwen122b@tp4 b64 bf16 69.2 -> 53.5; the one loss, qwen4b b256 without a copy
  // (+2.4%), is kept for one rule (docs/TUNING.md).
  const bool more_than_one_wave = problem.batch * plan.grid_x > resident_ctas(device.sm_count, problem.ctas_per_sm);
  plan.ordered = problem.order_workspace && overrides.gdn_step_order != 0 &&
                 ((problem.staggered_flush && (overrides.gdn_step_order >= 1 || more_than_one_wave)) ||
                  overrides.gdn_step_order == 2);
  // An fp32 tile without a copy in chunks of 32 rows (16 KB at K = 128), one in flight: 3 CTAs an SM
  // then keep 48 KB in flight instead of 192 KB, so the small loads of the CTAs' set-up (slot, cursor,
  // window) do not queue behind whole tiles, and a folding CTA reads 16 KB of a tile it does not use
  // instead of 64 KB. H100, one run, lock-step cycles whole tile / 1 / 2 chunks in flight: qwen4b b8
  // 14.56 / 13.43 / 14.22 us, b64 83.41 / 67.51 / 74.66, b256 286.46 / 237.83 / 264.68; qwen122b@tp4 b256
  // 148.58 / 123.78 / 136.24; KDA kimi48b b256 360.74 / 303.24 (1). At batch 1 the parts are one chunk.
  if (problem.chunked_tile) plan.tile_stages = overrides.gdn_step_tile_stages >= 0 ? overrides.gdn_step_tile_stages : 1;
  // A 16-bit read copy on tensor cores (32 KB at K = V = 128) asked for a chunk at a time over the
  // set-up (the staged kernel; any tile_stages > 0), where the CTAs outnumber the SMs: H100, one run,
  // main's one copy against it, bf16 copy, lock-step cycles qwen4b b64 59.04 -> 53.54 us, b256 201.05 ->
  // 188.59; qwen122b@tp4 b64 31.78 -> 29.11, b256 107.30 -> 99.18; staggered -0.3..-2.0%; qwen4b b8 (256
  // CTAs) 12.54 -> 11.97 (both in the staged build). With a CTA an SM or fewer there is no queue to
  // shorten: qwen122b@tp4 b8 (128 CTAs) 9.53 -> 9.68.
  if (problem.staged_tile) {
    const bool over_sms = problem.batch * plan.grid_x > device.sm_count;
    plan.tile_stages = overrides.gdn_step_tile_stages >= 0 ? overrides.gdn_step_tile_stages : (over_sms ? 1 : 0);
  }
  // The fold split: under the hint, with the order workspace and one part a v-head, the first
  // ceil(batch / L) folding rows (a step's folds under an even stagger) in k CTAs a v-head (the largest of
  // 2, 4 <= k with V / k >= 32 and a slot's CTAs within the cursor's tickets), so that a folding row,
  // several replays long in one CTA, is not the step's longest path. It takes the order pass, which finds
  // and marks those rows (gdn_step_order 0: neither). The rule splits in 4 where the (row, v-head) tiles
  // are few enough that the folding CTAs, not the waves, make the step: at most 2 x SMs, 4 x SMs with a
  // read copy (whose replays are short beside a fold). H100, one run, staggered cycles with / without:
  // qwen4b b8 bf16 19.24 / 22.19 us, fp8 19.26 / 23.10; qwen122b@tp4 b32 bf16 35.21 / 43.32; it lost
  // where the tiles take waves (qwen4b b32 bf16 45.4 -> 50.9, b256 219.3 -> 254.3), at qwen122b@tp4
  // b32 without a copy (29.6 -> 31.4), and without a copy where most steps fold nothing (batch < L / 2:
  // qwen4b b4 12.60 -> 13.73, the order pass in every step; with a copy 15.58 -> 14.87).
  const int64_t tiles = problem.batch * problem.v_heads;
  const int64_t sms = device.sm_count;
  const bool few_tiles = problem.read_copy ? tiles <= 4 * sms
                                                   : tiles <= 2 * sms && 2 * problem.batch >= problem.buffer_len;
  const int fold_parts_wanted = overrides.gdn_step_fold_parts != 0 ? overrides.gdn_step_fold_parts
                                                                   : (few_tiles ? 4 : 1);
  if (fold_parts_wanted > 1 && overrides.gdn_step_order != 0 && problem.staggered_flush &&
      problem.order_workspace && plan.parts == 1) {
    int fold_parts = 1;
    for (int k = 2; k <= fold_parts_wanted && k <= 4; k *= 2) {
      if (problem.v_dim / k >= 32 && static_cast<int64_t>(problem.v_heads) * k <= 32767) fold_parts = k;
    }
    const int64_t fold_rows = std::min<int64_t>((problem.batch + problem.buffer_len - 1) / problem.buffer_len, problem.batch);
    const int64_t grid_y = problem.batch + fold_rows * (fold_parts - 1);
    if (fold_parts > 1 && grid_y <= 65535) {
      plan.ordered = true;
      plan.fold_parts = fold_parts;
      plan.fold_rows = static_cast<int>(fold_rows);
      plan.grid_y = grid_y;
    }
  }
  return plan;
}

// The most v-heads per CTA that still leave at least four waves of CTAs, among the divisors of HV: each
// CTA pays a set-up of two DRAM round trips (the slot, then the cursor) that its later v-heads do not,
// so fewer, larger CTAs win while the waves stay full (Mamba-2 verify's base rule, over all v-heads of
// a row: GDN's k-heads are not shared through shared memory).
int gdn_verify_heads_per_cta(int64_t batch, int v_heads, int ctas_per_sm, int sm_count, int forced) {
  if (forced >= 1) return largest_divisor_at_most(v_heads, forced);
  const int64_t target = 4 * resident_ctas(sm_count, ctas_per_sm);
  for (int d = v_heads; d > 1; --d) {
    if (v_heads % d == 0 && batch * (v_heads / d) >= target) return d;
  }
  return 1;
}

namespace {

// A ring's depth: the compiled one where the CTAs per SM the launch bounds assume keep room for it
// (1 KB a CTA is the runtime's), fewer down to one stage where a long buffer or many drafts need the
// room (then fewer CTAs an SM), and 0 where one stage does not fit the opt-in limit.
int ring_stages(const RingBytes& ring, const DeviceInfo& device) {
  auto bytes = [&](int stages) { return ring.dynamic_bytes[stages] + ring.static_bytes; };
  const int ctas = ring.compiled_ctas_per_sm > 0 ? ring.compiled_ctas_per_sm : 1;
  const size_t per_cta = static_cast<size_t>(device.smem_per_sm / ctas - 1024);
  int stages = std::min(ring.compiled_stages, kMaxRingStages);
  if (stages < 1) return 0;
  while (stages > 1 && bytes(stages) > per_cta) --stages;
  return bytes(stages) <= static_cast<size_t>(device.smem_per_block_optin) ? stages : 0;
}

}  // namespace

int plan_gdn_verify_stages(const RingBytes& ring, const DeviceInfo& device) { return ring_stages(ring, device); }

GdnVerifyPlan plan_gdn_verify(const GdnVerifyProblem& problem, int stages, int ctas_per_sm, const DeviceInfo& device,
                              const LaunchOverrides& overrides) {
  GdnVerifyPlan plan;
  plan.heads_per_cta = gdn_verify_heads_per_cta(problem.batch, problem.v_heads, ctas_per_sm, device.sm_count,
                                                overrides.verify_heads_per_cta);
  plan.ring_stages = stages;
  plan.grid_x = problem.v_heads / plan.heads_per_cta;
  plan.grid_y = problem.batch;
  return plan;
}

int plan_gdn_fold_stages(const RingBytes& ring, const DeviceInfo& device) { return ring_stages(ring, device); }

// One wave of persistent CTAs, never more than there are (row, v-head) items: every CTA finds the
// folding rows itself, so a grid over every row would spend its time on rows that do not fold.
GdnFoldPlan plan_gdn_fold(const GdnFoldProblem& problem, int stages, int ctas_per_sm, const DeviceInfo& device) {
  GdnFoldPlan plan;
  plan.ring_stages = stages;
  // The layers of a layered launch share the resident CTAs: each layer's CTAs walk its items as one
  // layer's persistent grid does (at least one CTA per layer; more layers than resident CTAs queue).
  const int64_t layers = std::max(problem.layers, 1);
  plan.grid = std::min(problem.batch * problem.v_heads,
                       std::max<int64_t>(resident_ctas(device.sm_count, ctas_per_sm) / layers, 1));
  return plan;
}

}  // namespace launch
}  // namespace replayssm
