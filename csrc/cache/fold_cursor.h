// The cursor move of commit and flush, for every family: one thread per row, launched after the fold
// kernel (which read the cursors as they were), so it is the only writer of the cursors in the op.
// Stream order does what a step's cursor tickets do, with no atomics, and a CUDA graph captures both
// launches like one. Host-safe header.
//
// Commit: num_committed[slot] = n, or 0 where the row folded (fold_rows.cuh's rule, n = the cursor
// after accepting), and num_verified[slot] = 0 (the verify is consumed: a second commit without a
// verify accepts nothing). Flush: 0 where the slot folded (w > 0). Pad rows and out-of-range slots are
// left alone; cursors outside [0, L] too (commit still zeroes num_verified). A given rounding seed's
// offset ([seed, offset], int64) advances by one (every fold CTA has read it by then), so stochastic
// rounding costs no launch of its own. With an error word, commit records the first row whose slot id
// is out of range and not the pad id, or whose num_accepted lies outside [0, num_verified[slot]]
// (cache/error_word.cuh).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cache/layer_table.h"
#include "common/dtype.h"

namespace replayssm {

struct CursorMoveParams {
  int32_t* num_committed;  // (num_slots,)
  int32_t* num_verified;   // commit: (num_slots,), entries the slot's last verify appended
  int32_t mode;            // kFoldCommit or kFoldFlush (fold_rows.cuh)
  const void* num_accepted;  // commit: (batch,) int32 / int64
  DType num_accepted_dtype;
  int64_t num_accepted_stride;
  const void* slots;  // nullptr: row r uses slot r
  DType slots_dtype;
  int64_t slots_stride;
  int64_t pad_slot_id;
  int64_t num_slots;
  int32_t batch;
  int32_t buffer_len;
  int32_t max_draft_tokens;  // commit
  int64_t* rounding_seed;    // nullptr: none
  int32_t* error_word;       // commit: (4,) [code, row, value, limit] (cache/error_word.cuh), or nullptr
};

// The fields every family's fold params name alike (mode, the accepted counts, the rows' slots, batch);
// the caller sets the cursors, buffer geometry, seed and error word, which each family keeps its own way.
template <class FoldParams>
CursorMoveParams cursor_move_rows(const FoldParams& p) {
  CursorMoveParams cm{};
  cm.mode = static_cast<int32_t>(p.mode);
  cm.num_accepted = p.num_accepted;
  cm.num_accepted_dtype = p.num_accepted_dtype;
  cm.num_accepted_stride = p.num_accepted_stride;
  cm.slots = p.slots;
  cm.slots_dtype = p.slots_dtype;
  cm.slots_stride = p.slots_stride;
  cm.pad_slot_id = p.pad_slot_id;
  cm.num_slots = p.num_slots;
  cm.batch = p.batch;
  return cm;
}

// Launches on `stream` (nothing for batch 0 without a seed); returns the launch status.
cudaError_t launch_move_cursors(const CursorMoveParams& params, cudaStream_t stream);

// The cursor move of every layer of a layer table in one launch (blockIdx.y the layer): params as for
// one layer, with each layer's num_committed, num_verified, rounding_seed and error_word from the table.
cudaError_t launch_move_cursors_layers(const CursorMoveParams& params, const LayerTableArgs& layers,
                                       cudaStream_t stream);

}  // namespace replayssm
