// Mamba-2 speculative decoding kernels: verify (T draft tokens), commit (cursor move + fold where the
// next verify would not fit), flush (fold everything committed) and materialize (the state at the
// committed position into a caller tensor). Host-safe header: the API layer fills Mamba2SpecParams and
// calls the launchers. Semantics: replayssm_cuda/reference.py (mamba2_verify, mamba2_commit,
// mamba2_flush, mamba2_materialize).
//
//   tensor          shape                   dtype                      meaning
//   checkpoint      (slots, H, P, N)        fp32 / bf16 / fp16         state after the last fold
//   read_copy       (slots, H, P, N)        bf16 / fp16 / fp8-e4m3     what verify reads, or null
//   read_scale      (slots, H, P)           fp32                       fp8 read copy only
//   x_buf           (slots, H, L, P)        activation                 buffered inputs since the checkpoint
//   B_buf           (slots, G, L, N)        activation
//   dt_buf          (slots, H, L)           fp32                       buffered dt after bias and softplus
//   num_committed   (slots,)                int32                      committed buffer entries per slot
//   num_verified    (slots,)                int32                      entries the slot's last verify appended
//   x, z, out       (batch, T, H, P)        activation                 verify; z optional
//   dt              (batch, T, H)           activation or fp32         verify
//   B, C            (batch, T, G, N)        activation                 verify
//   A, D, dt_bias   (H,)                    fp32                       D, dt_bias optional
//   num_accepted    (batch,)                int32 / int64              commit
//   state_out       (batch, H, P, N)        fp32                       materialize
//   rounding_seed   (2,)                    int64                      commit / flush, optional: [seed, offset]
//   error_word      (4,)                    int32                      verify / commit, optional: the first misuse
//
// Cursors: verify reads num_committed and never writes it; it sets num_verified[slot] to the entries it
// appended (T, or 0 for a row whose cursor leaves no room). Commit and flush are two launches: the
// fold kernel (one CTA per (row, head)) reads the cursors as they were, then a one-thread-per-row
// kernel (cache/fold_cursor.h) writes the new ones; stream order does what the step kernel's head
// tickets do, with no atomics, and both launches are captured by a CUDA graph like one. Commit accepts
// num_accepted clamped to [0, num_verified[slot]] and zeroes num_verified[slot] (cache/fold_rows.cuh).
//
// Exactness: fp32 arithmetic, no fast math. The fold is the step kernel's fold (plain fp32 FFMA in the
// same order) and refreshes the read copy in the same launch exactly like make_read_copy.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cache/layer_table.h"
#include "common/dtype.h"

namespace replayssm {

constexpr int kMamba2SpecMaxDraftTokens = 16;
constexpr int kMamba2SpecMaxBufferLen = 64;

enum class Mamba2FoldMode : int32_t {
  kCommit = 0,       // fold the rows whose accepted count leaves no room for the next verify
  kFlush = 1,        // fold every row with committed entries
  kMaterialize = 2,  // write the folded state to state_out; the cache is not changed
};

struct Mamba2SpecParams {
  // ---- cache (strides in elements; slot strides may be anything: strided pools) ----
  void* checkpoint;
  DType checkpoint_dtype;
  int64_t ck_slot_stride, ck_head_stride, ck_row_stride;
  void* read_copy;  // nullptr: verify reads the checkpoint; commit/flush refresh nothing
  DType read_copy_dtype;
  int64_t rc_slot_stride, rc_head_stride, rc_row_stride;
  float* read_scale;  // fp8 read copy only
  int64_t rs_slot_stride, rs_head_stride;
  void* x_buf;
  int64_t xb_slot_stride, xb_head_stride, xb_entry_stride;
  void* B_buf;
  int64_t Bb_slot_stride, Bb_group_stride, Bb_entry_stride;
  float* dt_buf;
  int64_t dtb_slot_stride, dtb_head_stride;
  int32_t* num_committed;
  int32_t* num_verified;  // verify (written), commit (read, then zeroed by the cursor kernel)
  int32_t buffer_len;
  int32_t max_draft_tokens;  // commit
  DType act_dtype;           // x_buf, B_buf; verify's x, B, C, z, out

  // ---- verify: T draft tokens per row ----
  int32_t num_tokens;
  const void* x;
  int64_t x_row_stride, x_token_stride, x_head_stride;
  const void* dt;
  DType dt_dtype;
  int64_t dt_row_stride, dt_token_stride, dt_head_stride;
  const void* B;
  int64_t B_row_stride, B_token_stride, B_group_stride;
  const void* C;
  int64_t C_row_stride, C_token_stride, C_group_stride;
  const void* z;  // nullptr: no gate
  int64_t z_row_stride, z_token_stride, z_head_stride;
  void* out;
  int64_t out_row_stride, out_token_stride, out_head_stride;
  const float* D;        // nullptr: no skip term
  const float* dt_bias;  // nullptr: no bias
  bool dt_softplus;

  // ---- per-head decay ----
  const float* A;

  // ---- commit / flush / materialize ----
  Mamba2FoldMode mode;
  const void* num_accepted;  // commit
  DType num_accepted_dtype;
  int64_t num_accepted_stride;
  float* state_out;  // materialize
  int64_t so_row_stride, so_head_stride, so_p_stride;

  // ---- rows -> slots ----
  const void* slots;  // nullptr: row r uses slot r
  DType slots_dtype;
  int64_t slots_stride;
  int64_t pad_slot_id;

  int64_t num_slots;
  int32_t batch, heads, groups, head_dim, state_dim;

  // commit / flush: [seed, offset] (int64, device) for stochastic rounding of a bf16 / fp16
  // checkpoint's stores (stochastic_rounding.cuh); nullptr: round to nearest even. The cursor kernel
  // advances the offset.
  int64_t* rounding_seed;

  // verify / commit: (4,) int32 [code, row, value, limit], the first misuse (cache/error_word.cuh), or
  // nullptr: record nothing.
  int32_t* error_word;
};

// What the launcher chose (launch/mamba2_policy.h): the kernels' second argument.
struct Mamba2VerifyLaunch {
  int32_t heads_per_cta;  // the heads of one group a CTA pipelines
  int32_t ring_stages;    // stages of the tile ring (fewer than compiled where L and T are large)
};

struct Mamba2FoldLaunch {
  int32_t ring_stages;  // stages of the tile ring (2 where a long buffer leaves no room for more)
};

// Outputs of T draft tokens per row; appends their entries at positions w .. w+T-1. One launch.
cudaError_t launch_mamba2_verify(const Mamba2SpecParams& params, cudaStream_t stream);

// params.mode selects commit, flush or materialize. Commit and flush: fold launch + cursor launch.
cudaError_t launch_mamba2_fold(const Mamba2SpecParams& params, cudaStream_t stream);

// launch_mamba2_fold for every layer of a layer table (cache/layer_table.h): params filled from layer 0
// (every layer shares its shapes, strides and dtypes; the table gives each layer's pointers), the rows,
// slots and num_accepted shared by all layers; materialize writes layer l at state_out +
// l * layers.out_layer_stride. One fold launch and, for commit and flush, one cursor launch in all.
cudaError_t launch_mamba2_fold_layers(const Mamba2SpecParams& params, const LayerTableArgs& layers,
                                      cudaStream_t stream);

}  // namespace replayssm
