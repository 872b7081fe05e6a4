// Mamba-2 decode kernels: the conventional update (our baseline and the L=1 path) and the ReplaySSM
// step (replay-read + append, with the fold fused into the step that fills the buffer).
// Host-safe header: the API layer fills Mamba2Params and calls the launchers.
//
//   tensor          shape                   dtype                      meaning
//   checkpoint      (slots, H, P, N)        fp32 / bf16 / fp16         state after the last fold (update: the state)
//   read_copy       (slots, H, P, N)        bf16 / fp16 / fp8-e4m3     low-precision copy the reads use, or null
//   read_scale      (slots, H, P)           fp32                       fp8 read copy only
//   x_buf           (slots, H, L, P)        activation                 buffered inputs since the checkpoint
//   B_buf           (slots, G, L, N)        activation
//   dt_buf          (slots, H, L)           fp32                       buffered dt after bias and softplus
//   num_committed   (slots,)                int32                      committed buffer entries per slot
//   x, z, out       (batch, H, P)           activation                 z optional
//   dt              (batch, H)              activation or fp32
//   B, C            (batch, G, N)           activation
//   A, D, dt_bias   (H,)                    fp32                       D, dt_bias optional
//   rounding_seed   (2,)                    int64                      [seed, offset]; optional, 16-bit checkpoint
//
// Exactness: fp32 arithmetic throughout, no fast math; the fold is plain FFMA in fp32, so an fp32
// checkpoint stays at fp32 rounding level however many folds it sees.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/dtype.h"

namespace replayssm {

// The compiled (head_dim, state_dim) shapes and dtypes: variants.h.
constexpr int kMamba2MaxBufferLen = 64;

struct Mamba2Params {
  // ---- cache (strides in elements; slot strides may be anything: strided pools) ----
  void* checkpoint;
  DType checkpoint_dtype;
  int64_t ck_slot_stride, ck_head_stride, ck_row_stride;
  void* read_copy;  // nullptr: reads use the checkpoint
  DType read_copy_dtype;
  int64_t rc_slot_stride, rc_head_stride, rc_row_stride;
  float* read_scale;  // fp8 read copy only
  int64_t rs_slot_stride, rs_head_stride;
  void* x_buf;  // step only
  int64_t xb_slot_stride, xb_head_stride, xb_entry_stride;
  void* B_buf;
  int64_t Bb_slot_stride, Bb_group_stride, Bb_entry_stride;
  float* dt_buf;
  int64_t dtb_slot_stride, dtb_head_stride;
  int32_t* num_committed;  // step only; also carries the per-launch head tickets in bits 16..30
  int32_t buffer_len;
  int32_t max_draft_tokens;

  // ---- per-row inputs and output ----
  const void* x;
  int64_t x_row_stride, x_head_stride;
  const void* dt;
  DType dt_dtype;
  int64_t dt_row_stride, dt_head_stride;
  const void* B;
  int64_t B_row_stride, B_group_stride;
  const void* C;
  int64_t C_row_stride, C_group_stride;
  const void* z;  // nullptr: no gate
  int64_t z_row_stride, z_head_stride;
  void* out;
  int64_t out_row_stride, out_head_stride;
  DType act_dtype;  // x, B, C, z, out, x_buf, B_buf

  // ---- per-head weights ----
  const float* A;
  const float* D;        // nullptr: no skip term
  const float* dt_bias;  // nullptr: no bias
  bool dt_softplus;

  // ---- rows -> slots ----
  const void* slots;  // nullptr: row r uses slot r
  DType slots_dtype;
  int64_t slots_stride;
  int64_t pad_slot_id;

  int64_t num_slots;
  int32_t batch, heads, groups, head_dim, state_dim;
  // step: the caller's slots fold at different steps (staggered flush, continuous batching), so the
  // launcher keeps CTAs small (a folding CTA must not outlast the step) and, with a read copy, may start
  // the folding rows first (row_order below); false: folds come together
  bool staggered_flush;

  // [seed, offset] (int64, device): stochastic rounding of a bf16 / fp16 checkpoint's stores
  // (stochastic_rounding.cuh); nullptr: round to nearest even. The launch advances the offset.
  int64_t* rounding_seed;

  // Workspaces the API layer allocates per call; the launch plan decides whether they are used.
  // step, staggered_flush: int32[2 * batch] of device memory for the order pass, or nullptr. Where the
  // launcher runs the pass (step_order.cu), CTA row y of the step takes batch row
  // row_order[y] & ~kFineFoldRow, whose slot is row_order[batch + y] (-1: the row touches nothing).
  int32_t* row_order;
  // update: 4 bytes of device memory (int32) that the launcher may zero and hand the CTAs to claim items
  // from, in stream order (update.cu); nullptr: every CTA takes a fixed share.
  int32_t* work_counter;

#if REPLAYSSM_CTA_TIMELINE
  // Diagnostic builds only (cta_timeline.cuh): int64[cta_timeline_ctas][kCtaTimelineWords] of device
  // memory for this launch's per-CTA time line, or nullptr.
  int64_t* cta_timeline;
  int64_t cta_timeline_ctas;
#endif
};

// What the launcher chose (launch/mamba2_policy.h): the kernels' second argument, beside the caller's
// Mamba2Params.
struct Mamba2StepLaunch {
  int32_t heads_per_cta;  // the heads of one group a CTA pipelines (two whole groups: kTwoGroups)
  // The ordered step's fold split: the first fold_split_rows folding rows take CTAs of heads_per_cta /
  // fold_split heads, the order pass marks them with kFineFoldRow, and the grid has fold_split_rows *
  // (fold_split - 1) helper rows first for their other CTAs. 1: no split.
  int32_t fold_split;
  int32_t fold_split_rows;
  // Programmatic dependent launch (launch/pdl.h): launched with the attribute (each CTA waits for the
  // kernel ahead before any global access), and each CTA lets the next kernel start early.
  bool pdl_wait;
  bool pdl_trigger;
  // Launched with PDL behind the order pass (launch/pdl.h, step_starts_during_order_pass): each CTA waits
  // for the pass (and through it for every kernel before) but lets nothing start early unless pdl_trigger.
  bool after_order_pass;
  // With pdl_wait, not ordered: before the wait each CTA asks L2 for its cursor, first tiles and windows
  // (step_cta.cuh, step_warm_l2; launch/pdl.h, warm_l2).
  bool warm_l2;
};

struct Mamba2UpdateLaunch {
  int32_t stages;  // state tiles in each CTA's ring
  bool claims;     // items past the first `stages` rounds are claimed from p.work_counter (zeroed first)
  bool pdl_wait;     // launched with programmatic dependent launch (launch/pdl.h): wait for the kernel ahead
  bool pdl_trigger;  // and let the next kernel start early
};

// The order pass's mark on a folding row that the fold split serves (row indices stay below 2^16).
constexpr int32_t kFineFoldRow = 1 << 30;

// Conventional T=1 update of `checkpoint` (the state), one launch.
cudaError_t launch_mamba2_update(const Mamba2Params& params, cudaStream_t stream);

// ReplaySSM T=1 step, one launch: output, append, and the fold where the buffer fills. With
// staggered_flush and row_order, a small launch before it may order the rows (folds first).
cudaError_t launch_mamba2_step(const Mamba2Params& params, cudaStream_t stream);

namespace mamba2 {
// The order pass: fills p.row_order with the rows whose slot folds in this step first, then
// the others, each part in batch order, and the rows' slots (step_order.cu).
cudaError_t launch_step_row_order(const Mamba2Params& p, const Mamba2StepLaunch& launch, cudaStream_t stream);
}  // namespace mamba2

}  // namespace replayssm
