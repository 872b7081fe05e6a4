// Conventional speculative Mamba-2 step with per-token state snapshots: the baseline the ReplaySSM
// verify/commit is measured against (engines run this for speculative decoding today).
// Host-safe header: the API layer fills Mamba2SnapshotsParams and calls the launcher.
//
//   tensor      shape                    dtype                  meaning
//   state       (slots, H, P, N)         fp32 / bf16 / fp16     read only: the state before the T tokens
//   snapshots   (batch, T, H, P, N)      state dtype            out: state after token t, per row
//   x, z, out   (batch, T, H, P)         activation             z optional; out written
//   dt          (batch, T, H)            activation or fp32
//   B, C        (batch, T, G, N)         activation
//   A, D, dt_bias (H,)                   fp32                   D, dt_bias optional
//
// Token by token it is mamba2_update: S_t = exp(dt_t A) S_{t-1} + dt_t x_t (outer) B_t, y_t = S_t C_t
// from the fp32 state, then S_t is rounded to the state dtype (the snapshot) and the next token starts
// from that rounded value, exactly as T calls of mamba2_update would. Pad rows (pad_slot_id, out of
// range) read nothing and get zero snapshots and zero output.
//
// Byte model per (row, head): P N s read once + T P N s written (s = state bytes), so the kernel
// should run near copy bandwidth; every state element lives in registers for the T tokens.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/dtype.h"

namespace replayssm {

constexpr int kMamba2SnapshotsMaxTokens = 16;

struct Mamba2SnapshotsParams {
  // ---- state (read only) and snapshots; strides in elements, slot stride arbitrary ----
  const void* state;
  DType state_dtype;  // also the snapshots dtype
  int64_t st_slot_stride, st_head_stride, st_row_stride;
  void* snapshots;
  int64_t sn_row_stride, sn_token_stride, sn_head_stride, sn_prow_stride;

  // ---- per-(row, token) inputs and output ----
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
  DType act_dtype;  // x, B, C, z, out

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

  int32_t batch, tokens, heads, groups, head_dim, state_dim;
};

// One launch, grid (heads, batch), one CTA per (row, head). cudaErrorInvalidValue for params outside
// the contract (shapes of REPLAYSSM_MAMBA2_SHAPES, 1 <= tokens <= 16, batch and heads <= 65535).
cudaError_t launch_mamba2_update_snapshots(const Mamba2SnapshotsParams& params, cudaStream_t stream);

}  // namespace replayssm
