// Gated DeltaNet decode kernels: params of the conventional update, the ReplaySSM step, verify and the
// fold (commit / flush / materialize). Host-safe header: the API layer fills them and calls the
// launchers. Semantics: replayssm_cuda/reference.py (delta_update, delta_step, delta_verify,
// delta_commit, delta_flush, delta_materialize) and docs/DESIGN.md.
//
//   tensor          shape                   dtype                      meaning
//   checkpoint      (slots, HV, V, K)       fp32 / bf16 / fp16         state after the last fold (update: the state)
//   read_copy       (slots, HV, V, K)       bf16 / fp16 / fp8-e4m3     low-precision copy the reads use, or null
//   read_scale      (slots, HV, V)          fp32                       fp8 read copy only
//   k_buf           (slots, H, L, K)        activation                 raw keys since the checkpoint
//   v_buf           (slots, HV, L, V)       activation                 raw values
//   g_buf           (slots, HV, L)          fp32                       log decays g = -exp(A_log) softplus(a + dt_bias)
//   beta_buf        (slots, HV, L)          fp32                       sigmoid(b)
//   u_buf           (slots, HV, L, V)       fp32                       corrected values u = beta (v - S' k)
//   num_committed   (slots,)                int32                      committed buffer entries per slot
//   num_verified    (slots,)                int32                      entries the slot's last verify appended
//   error_word      (4,)                    int32                      verify / commit, optional: the first misuse
//   q, k            (batch, [T,] H, K)      activation                 L2-normalised in the kernel when use_qk_l2norm
//   snapshots       (batch, T, HV, V, K)    state dtype                update_snapshots: the state after token t
//   v, out          (batch, [T,] HV, V)     activation
//   a, b            (batch, [T,] HV)        activation or fp32
//   A_log, dt_bias  (HV,)                   fp32
//
// KDA (gate = GdnGate::kVector) is the same delta rule with the log decay per v-head AND key channel,
// g = -exp(A_log)[hv] softplus(a + dt_bias) a K-vector, and the state decayed column by column
// (S diag(exp(g))). Its gate tensors have a key-channel dim (the `kda` fields below):
//   a               (batch, [T,] HV, K)     activation or fp32
//   dt_bias         (HV, K)                 fp32
//   g_buf           (slots, HV, L, K)       fp32
//
// v-head hv uses k-head hv / (HV / H). The state is [V, K] per v-head, K contiguous: a row of the state
// is one value channel. Exactness: fp32 arithmetic, no fast math; with a read copy the fold recomputes
// every u_j from the full-precision checkpoint, so read-copy rounding never reaches the checkpoint.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cache/layer_table.h"
#include "common/dtype.h"

namespace replayssm {

constexpr int kGdnMaxBufferLen = 64;
constexpr int kGdnMaxDraftTokens = 16;

// The cache of one GDN layer (every op but the conventional update reads it).
struct GdnCache {
  void* checkpoint;
  DType checkpoint_dtype;
  int64_t ck_slot_stride, ck_head_stride, ck_row_stride;
  void* read_copy;  // nullptr: reads use the checkpoint
  DType read_copy_dtype;
  int64_t rc_slot_stride, rc_head_stride, rc_row_stride;
  float* read_scale;  // fp8 read copy only
  int64_t rs_slot_stride, rs_head_stride;
  void* k_buf;
  int64_t kb_slot_stride, kb_head_stride, kb_entry_stride;
  void* v_buf;
  int64_t vb_slot_stride, vb_head_stride, vb_entry_stride;
  float* g_buf;
  int64_t gb_slot_stride, gb_head_stride;
  float* beta_buf;
  int64_t bb_slot_stride, bb_head_stride;
  float* u_buf;
  int64_t ub_slot_stride, ub_head_stride, ub_entry_stride;
  int32_t* num_committed;
  int32_t* num_verified;  // verify (written), commit (read, then zeroed by the cursor kernel); else unused
  int32_t buffer_len;
  int32_t max_draft_tokens;
};

// Per-token inputs of one call: T = 1 for the update and the step, the draft count for verify.
struct GdnTokens {
  int32_t num_tokens;
  const void* q;
  int64_t q_row_stride, q_token_stride, q_head_stride;
  const void* k;
  int64_t k_row_stride, k_token_stride, k_head_stride;
  const void* v;
  int64_t v_row_stride, v_token_stride, v_head_stride;
  const void* a;
  DType a_dtype;
  int64_t a_row_stride, a_token_stride, a_head_stride;
  const void* b;
  DType b_dtype;
  int64_t b_row_stride, b_token_stride, b_head_stride;
  void* out;
  int64_t out_row_stride, out_token_stride, out_head_stride;
  const float* A_log;    // (HV,)
  const float* dt_bias;  // (HV,)
  float scale;           // q's scale (K^-0.5 by default)
  bool use_qk_l2norm;
};

// The decay's shape: one per v-head (Gated DeltaNet) or one per v-head and key channel (KDA). The
// kernels take it as a compile-time trait (kVectorGate): the same kernels, with the gate loads and the
// decay applied column by column.
enum class GdnGate : int32_t {
  kScalar = 0,  // GDN (a zero-initialised GdnParams)
  kVector = 1,  // KDA
};

// KDA's fold (commit, flush, materialize: fold_kernel.cuh) keeps the window's per-channel log decays,
// [L][K] fp32, in shared memory beside a ring stage of checkpoint tiles: with a float32 128 x 128
// checkpoint (a 64 KB tile) one stage and the workspace pass a CTA's 227 KB at L = 64. The step and
// verify keep no such tile beside their workspaces and take L = 64 there. fold_launch.cuh checks the
// number against the fold's shared-memory layout for every compiled variant.
constexpr int kKdaFloat32FoldMaxBufferLen = 63;

// The longest buffer the fold takes for a (K, V) checkpoint of this dtype and gate (the API checks it
// and _C.capabilities() lists the shapes where it is below kGdnMaxBufferLen).
constexpr int gdn_fold_max_buffer_len(GdnGate gate, int K, int V, DType checkpoint) {
  return gate == GdnGate::kVector && checkpoint == DType::kFloat32 && K == 128 && V == 128 ? kKdaFloat32FoldMaxBufferLen
                                                                                          : kGdnMaxBufferLen;
}

// KDA's gate strides (GdnGate::kVector only; unused by GDN): the key channel of a, dt_bias's v-head,
// g_buf's entry (its key channels are contiguous).
struct KdaGateArgs {
  int64_t a_channel_stride;
  int64_t dt_bias_head_stride;
  int64_t gb_entry_stride;
};

enum class GdnFoldMode : int32_t {
  kCommit = 0,       // fold the rows whose accepted count leaves no room for the next verify
  kFlush = 1,        // fold every row with committed entries
  kMaterialize = 2,  // write the folded state to state_out; the cache is not changed
};

struct GdnParams {
  GdnCache cache;    // update: only checkpoint (the state) and its strides
  GdnTokens tokens;
  DType act_dtype;   // q, k, v, out, k_buf, v_buf

  // ---- commit / flush / materialize ----
  GdnFoldMode mode;
  const void* num_accepted;  // commit
  DType num_accepted_dtype;
  int64_t num_accepted_stride;
  float* state_out;  // materialize: (batch, HV, V, K) fp32
  int64_t so_row_stride, so_head_stride, so_v_stride;

  // ---- update_snapshots: the state after each of the T tokens, (batch, T, HV, V, K), the state dtype ----
  void* snapshots;
  int64_t sn_row_stride, sn_token_stride, sn_head_stride, sn_v_stride;

  // ---- rows -> slots (cache/slot_map.cuh) ----
  const void* slots;  // nullptr: row r uses slot r
  DType slots_dtype;
  int64_t slots_stride;
  int64_t pad_slot_id;

  int64_t num_slots;
  int32_t batch, heads, v_heads, head_k_dim, head_v_dim;
  // step: the caller's slots fold at different steps (continuous batching); a launch hint only
  bool staggered_flush;
  // verify / commit: (4,) int32 [code, row, value, limit], the first misuse (cache/error_word.cuh), or
  // nullptr: record nothing.
  int32_t* error_word;

  // ---- KDA (last, so that GDN's fields keep their offsets) ----
  GdnGate gate;
  KdaGateArgs kda;

  // step, staggered_flush: int32[2 batch] of device memory the API layer allocates per call for the
  // order pass (cache/row_order.cuh), or nullptr; the launch plan decides whether the pass runs.
  int32_t* row_order;

#if REPLAYSSM_CTA_TIMELINE
  // Diagnostic builds only (diag/cta_timeline.cuh): int64[cta_timeline_ctas][kCtaTimelineWords] of device
  // memory for this launch's per-CTA time line (gdn_step / kda_step), or nullptr.
  int64_t* cta_timeline;
  int64_t cta_timeline_ctas;
#endif
};

// The order pass's mark on the folding rows whose v-heads the fold split cuts into fold_parts CTAs
// (step_kernel.cuh); batch rows stay below 2^16.
constexpr int32_t kFoldPartsRow = 1 << 30;

// Every launcher takes params.gate: GdnGate::kScalar runs Gated DeltaNet, kVector KDA.

// Conventional T=1 update of cache.checkpoint (the state), one launch.
cudaError_t launch_gdn_update(const GdnParams& params, cudaStream_t stream);

// Conventional speculative baseline, one launch: T tokens per row from cache.checkpoint (read only),
// the state after every token written to snapshots; token by token it is launch_gdn_update.
cudaError_t launch_gdn_update_snapshots(const GdnParams& params, cudaStream_t stream);

// ReplaySSM T=1 step, one launch: output, append, and the fold where the buffer fills.
cudaError_t launch_gdn_step(const GdnParams& params, cudaStream_t stream);

// Outputs of T draft tokens per row; appends their entries at w .. w+T-1; writes no state or cursor,
// and sets num_verified[slot] to the entries appended (T, or 0 where the cursor leaves no room).
cudaError_t launch_gdn_verify(const GdnParams& params, cudaStream_t stream);

// params.mode selects commit, flush or materialize. Commit accepts num_accepted clamped to
// [0, num_verified[slot]] and zeroes num_verified[slot] (cache/fold_rows.cuh, cache/fold_cursor.h).
cudaError_t launch_gdn_fold(const GdnParams& params, cudaStream_t stream);

// launch_gdn_fold for every layer of a layer table (cache/layer_table.h): params filled from layer 0
// (every layer shares its shapes, strides and dtypes; the table gives each layer's pointers: buffers
// k_buf, v_buf, g_buf, beta_buf, u_buf), the rows, slots and num_accepted shared by all layers;
// materialize writes layer l at state_out + l * layers.out_layer_stride. One fold launch and, for
// commit and flush, one cursor launch in all.
cudaError_t launch_gdn_fold_layers(const GdnParams& params, const LayerTableArgs& layers, cudaStream_t stream);

}  // namespace replayssm
