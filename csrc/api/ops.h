// The compiled ops: one line each. registration.cpp registers their CUDA kernels and reports the names
// (replayssm_cuda._C.compiled_ops()) from this one list. The schemas are defined in Python
// (replayssm_cuda/_schemas.py, for every install); the schema text here must equal it, character for
// character (tests/test_library.py checks it).
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

// X(name, schema). rounding_seed (int64 (2,) [seed, offset], optional, last so existing calls stay
// valid): stochastic rounding of a bf16 / fp16 checkpoint's stores; the op advances the offset.
// staggered_flush (mamba2_step and gdn_step, last for the same reason): a launch hint that the slots
// fold at different steps; it may size the CTAs and changes no result (replayssm_cuda.ops.mamba2_step).
#define REPLAYSSM_CUDA_OPS(X)                                                                      \
  X(make_read_copy,                                                                                \
    "make_read_copy(Tensor checkpoint, Tensor(a!) read_copy, Tensor(b!)? read_scale, Tensor? slots, " \
    "int pad_slot_id) -> ()")                                                                     \
  X(mamba2_update,                                                                                 \
    "mamba2_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor(b!) out, " \
    "Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, Tensor? slots, int pad_slot_id, "     \
    "Tensor(c!)? rounding_seed=None) -> ()")                                                     \
  X(mamba2_step,                                                                                   \
    "mamba2_step(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor(d!) x_buf, " \
    "Tensor(e!) B_buf, Tensor(f!) dt_buf, Tensor(g!) num_committed, Tensor x, Tensor dt, Tensor A, Tensor B, " \
    "Tensor C, Tensor(h!) out, Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, int max_draft_tokens, " \
    "Tensor? slots, int pad_slot_id, Tensor(i!)? rounding_seed=None, bool staggered_flush=False) -> ()")                          \
  X(mamba2_verify,                                                                                 \
    "mamba2_verify(Tensor checkpoint, Tensor? read_copy, Tensor? read_scale, Tensor(a!) x_buf, "   \
    "Tensor(b!) B_buf, Tensor(c!) dt_buf, Tensor num_committed, Tensor(d!) num_verified, Tensor x, Tensor dt, " \
    "Tensor A, Tensor B, Tensor C, Tensor(e!) out, Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, Tensor? slots, " \
    "int pad_slot_id, Tensor(f!)? error_word=None) -> ()")                                        \
  X(mamba2_commit,                                                                                 \
    "mamba2_commit(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor x_buf, " \
    "Tensor B_buf, Tensor dt_buf, Tensor(d!) num_committed, Tensor(e!) num_verified, Tensor num_accepted, " \
    "Tensor A, int max_draft_tokens, Tensor? slots, int pad_slot_id, Tensor(f!)? rounding_seed=None, " \
    "Tensor(g!)? error_word=None) -> ()")                                                         \
  X(mamba2_flush,                                                                                  \
    "mamba2_flush(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor x_buf, " \
    "Tensor B_buf, Tensor dt_buf, Tensor(d!) num_committed, Tensor A, Tensor? slots, int pad_slot_id, "  \
    "Tensor(e!)? rounding_seed=None) -> ()")                                                     \
  X(mamba2_materialize,                                                                            \
    "mamba2_materialize(Tensor checkpoint, Tensor x_buf, Tensor B_buf, Tensor dt_buf, Tensor num_committed, " \
    "Tensor A, Tensor(a!) out, Tensor? slots, int pad_slot_id) -> ()")                             \
  X(mamba2_commit_layers,                                                                          \
    "mamba2_commit_layers(Tensor layer_table, Tensor(a!)[] checkpoints, Tensor(b!)[] read_copies, Tensor(c!)[] read_scales, " \
    "Tensor(d!)[] x_bufs, Tensor(e!)[] B_bufs, Tensor(f!)[] dt_bufs, Tensor(g!)[] num_committed, " \
    "Tensor(h!)[] num_verified, Tensor[] A, Tensor(i!)[] rounding_seeds, Tensor(j!)[] error_words, " \
    "Tensor num_accepted, int max_draft_tokens, Tensor? slots, int pad_slot_id) -> ()")             \
  X(mamba2_flush_layers,                                                                           \
    "mamba2_flush_layers(Tensor layer_table, Tensor(a!)[] checkpoints, Tensor(b!)[] read_copies, Tensor(c!)[] read_scales, " \
    "Tensor(d!)[] x_bufs, Tensor(e!)[] B_bufs, Tensor(f!)[] dt_bufs, Tensor(g!)[] num_committed, " \
    "Tensor(h!)[] num_verified, Tensor[] A, Tensor(i!)[] rounding_seeds, Tensor(j!)[] error_words, " \
    "Tensor? slots, int pad_slot_id) -> ()")                                                      \
  X(mamba2_materialize_layers,                                                                     \
    "mamba2_materialize_layers(Tensor layer_table, Tensor(a!)[] checkpoints, Tensor(b!)[] read_copies, Tensor(c!)[] read_scales, " \
    "Tensor(d!)[] x_bufs, Tensor(e!)[] B_bufs, Tensor(f!)[] dt_bufs, Tensor(g!)[] num_committed, " \
    "Tensor(h!)[] num_verified, Tensor[] A, Tensor(i!)[] rounding_seeds, Tensor(j!)[] error_words, " \
    "Tensor(k!) out, Tensor? slots, int pad_slot_id) -> ()")                                      \
  X(mamba2_update_snapshots,                                                                       \
    "mamba2_update_snapshots(Tensor state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor(a!) out, " \
    "Tensor(b!) snapshots, Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, Tensor? slots, "  \
    "int pad_slot_id) -> ()")                                                                     \
  X(gdn_update,                                                                                    \
    "gdn_update(Tensor(a!) state, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, "  \
    "Tensor dt_bias, Tensor(b!) out, float? scale, bool use_qk_l2norm, Tensor? slots, int pad_slot_id) -> ()") \
  X(gdn_update_snapshots,                                                                          \
    "gdn_update_snapshots(Tensor state, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, " \
    "Tensor dt_bias, Tensor(a!) out, Tensor(b!) snapshots, float? scale, bool use_qk_l2norm, Tensor? slots, " \
    "int pad_slot_id) -> ()")                                                                     \
  X(gdn_step,                                                                                      \
    "gdn_step(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor(d!) k_buf, " \
    "Tensor(e!) v_buf, Tensor(f!) g_buf, Tensor(g!) beta_buf, Tensor(h!) u_buf, Tensor(i!) num_committed, " \
    "Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias, Tensor(j!) out, "  \
    "float? scale, bool use_qk_l2norm, int max_draft_tokens, Tensor? slots, int pad_slot_id, "       \
    "bool staggered_flush=False) -> ()")                                                          \
  X(load,                                                                                          \
    "load(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor(d!) num_committed, " \
    "Tensor states, Tensor? slots, int pad_slot_id) -> ()")                                       \
  X(reset,                                                                                         \
    "reset(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor(d!)[] buffers, " \
    "Tensor(e!) num_committed, Tensor? slots, int pad_slot_id) -> ()")                            \
  X(stagger_cursors,                                                                               \
    "stagger_cursors(Tensor(a!)[] buffers, Tensor(b!) num_committed, Tensor? slots, int pad_slot_id, " \
    "int period) -> ()")                                                                          \
  X(copy_slots,                                                                                    \
    "copy_slots(Tensor(a!)[] cache_tensors, Tensor src_slots, Tensor dst_slots, int pad_slot_id) -> ()") \
  X(fill_slots_table,                                                                              \
    "fill_slots_table(Tensor(a!)[] cache_tensors, Tensor slot_table, float[] fill_values, int[] fill_periods, " \
    "Tensor? slots, int pad_slot_id) -> ()")                                                      \
  X(copy_slots_table,                                                                              \
    "copy_slots_table(Tensor(a!)[] cache_tensors, Tensor slot_table, Tensor src_slots, Tensor dst_slots, " \
    "int pad_slot_id) -> ()")                                                                     \
  X(gdn_verify,                                                                                    \
    "gdn_verify(Tensor checkpoint, Tensor? read_copy, Tensor? read_scale, Tensor(a!) k_buf, "      \
    "Tensor(b!) v_buf, Tensor(c!) g_buf, Tensor(d!) beta_buf, Tensor(e!) u_buf, "                  \
    "Tensor num_committed, Tensor(f!) num_verified, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, " \
    "Tensor A_log, Tensor dt_bias, Tensor(g!) out, float? scale, bool use_qk_l2norm, Tensor? slots, int pad_slot_id, " \
    "Tensor(h!)? error_word=None) -> ()")                                                         \
  X(gdn_commit,                                                                                    \
    "gdn_commit(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor k_buf, " \
    "Tensor v_buf, Tensor g_buf, Tensor beta_buf, Tensor u_buf, Tensor(d!) num_committed, "         \
    "Tensor(e!) num_verified, Tensor num_accepted, int max_draft_tokens, bool use_qk_l2norm, Tensor? slots, " \
    "int pad_slot_id, Tensor(f!)? error_word=None) -> ()")                                        \
  X(gdn_flush,                                                                                     \
    "gdn_flush(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor k_buf, " \
    "Tensor v_buf, Tensor g_buf, Tensor beta_buf, Tensor u_buf, Tensor(d!) num_committed, "         \
    "bool use_qk_l2norm, Tensor? slots, int pad_slot_id) -> ()")                                  \
  X(gdn_materialize,                                                                               \
    "gdn_materialize(Tensor checkpoint, Tensor k_buf, Tensor v_buf, Tensor g_buf, Tensor beta_buf, " \
    "Tensor u_buf, Tensor num_committed, Tensor(a!) out, bool use_qk_l2norm, Tensor? slots, "       \
    "int pad_slot_id) -> ()")                                                                     \
  X(gdn_commit_layers, \
    "gdn_commit_layers(" \
    "Tensor layer_table, Tensor(a!)[] checkpoints, Tensor(b!)[] read_copies, Tensor(c!)[] read_scales, " \
    "Tensor(d!)[] k_bufs, Tensor(e!)[] v_bufs, Tensor(f!)[] g_bufs, Tensor(g!)[] beta_bufs, Tensor(h!)[] u_bufs, " \
    "Tensor(i!)[] num_committed, Tensor(j!)[] num_verified, Tensor(k!)[] error_words, " \
    "Tensor num_accepted, int max_draft_tokens, bool use_qk_l2norm, Tensor? slots, int pad_slot_id) -> ()") \
  X(gdn_flush_layers, \
    "gdn_flush_layers(" \
    "Tensor layer_table, Tensor(a!)[] checkpoints, Tensor(b!)[] read_copies, Tensor(c!)[] read_scales, " \
    "Tensor(d!)[] k_bufs, Tensor(e!)[] v_bufs, Tensor(f!)[] g_bufs, Tensor(g!)[] beta_bufs, Tensor(h!)[] u_bufs, " \
    "Tensor(i!)[] num_committed, Tensor(j!)[] num_verified, Tensor(k!)[] error_words, " \
    "bool use_qk_l2norm, Tensor? slots, int pad_slot_id) -> ()") \
  X(gdn_materialize_layers, \
    "gdn_materialize_layers(" \
    "Tensor layer_table, Tensor(a!)[] checkpoints, Tensor(b!)[] read_copies, Tensor(c!)[] read_scales, " \
    "Tensor(d!)[] k_bufs, Tensor(e!)[] v_bufs, Tensor(f!)[] g_bufs, Tensor(g!)[] beta_bufs, Tensor(h!)[] u_bufs, " \
    "Tensor(i!)[] num_committed, Tensor(j!)[] num_verified, Tensor(k!)[] error_words, " \
    "Tensor(l!) out, bool use_qk_l2norm, Tensor? slots, int pad_slot_id) -> ()") \
  X(kda_update,                                                                                    \
    "kda_update(Tensor(a!) state, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, "  \
    "Tensor dt_bias, Tensor(b!) out, float? scale, bool use_qk_l2norm, Tensor? slots, int pad_slot_id) -> ()") \
  X(kda_update_snapshots,                                                                          \
    "kda_update_snapshots(Tensor state, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, " \
    "Tensor dt_bias, Tensor(a!) out, Tensor(b!) snapshots, float? scale, bool use_qk_l2norm, Tensor? slots, " \
    "int pad_slot_id) -> ()")                                                                     \
  X(kda_step,                                                                                      \
    "kda_step(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor(d!) k_buf, " \
    "Tensor(e!) v_buf, Tensor(f!) g_buf, Tensor(g!) beta_buf, Tensor(h!) u_buf, Tensor(i!) num_committed, " \
    "Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias, Tensor(j!) out, "  \
    "float? scale, bool use_qk_l2norm, int max_draft_tokens, Tensor? slots, int pad_slot_id, "       \
    "bool staggered_flush=False) -> ()")                                                          \
  X(kda_verify,                                                                                    \
    "kda_verify(Tensor checkpoint, Tensor? read_copy, Tensor? read_scale, Tensor(a!) k_buf, "      \
    "Tensor(b!) v_buf, Tensor(c!) g_buf, Tensor(d!) beta_buf, Tensor(e!) u_buf, "                  \
    "Tensor num_committed, Tensor(f!) num_verified, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, " \
    "Tensor A_log, Tensor dt_bias, Tensor(g!) out, float? scale, bool use_qk_l2norm, Tensor? slots, int pad_slot_id, " \
    "Tensor(h!)? error_word=None) -> ()")                                                         \
  X(kda_commit,                                                                                    \
    "kda_commit(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor k_buf, " \
    "Tensor v_buf, Tensor g_buf, Tensor beta_buf, Tensor u_buf, Tensor(d!) num_committed, "         \
    "Tensor(e!) num_verified, Tensor num_accepted, int max_draft_tokens, bool use_qk_l2norm, Tensor? slots, " \
    "int pad_slot_id, Tensor(f!)? error_word=None) -> ()")                                        \
  X(kda_flush,                                                                                     \
    "kda_flush(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor k_buf, " \
    "Tensor v_buf, Tensor g_buf, Tensor beta_buf, Tensor u_buf, Tensor(d!) num_committed, "         \
    "bool use_qk_l2norm, Tensor? slots, int pad_slot_id) -> ()")                                  \
  X(kda_materialize,                                                                               \
    "kda_materialize(Tensor checkpoint, Tensor k_buf, Tensor v_buf, Tensor g_buf, Tensor beta_buf, " \
    "Tensor u_buf, Tensor num_committed, Tensor(a!) out, bool use_qk_l2norm, Tensor? slots, "       \
    "int pad_slot_id) -> ()")

namespace replayssm {

void make_read_copy(const at::Tensor& checkpoint, const at::Tensor& read_copy,
                    const std::optional<at::Tensor>& read_scale, const std::optional<at::Tensor>& slots,
                    int64_t pad_slot_id);

void mamba2_update(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                   const at::Tensor& B, const at::Tensor& C, const at::Tensor& out, const std::optional<at::Tensor>& D,
                   const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias, bool dt_softplus,
                   const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                   const std::optional<at::Tensor>& rounding_seed);

void mamba2_step(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                 const std::optional<at::Tensor>& read_scale, const at::Tensor& x_buf, const at::Tensor& B_buf,
                 const at::Tensor& dt_buf, const at::Tensor& num_committed, const at::Tensor& x, const at::Tensor& dt,
                 const at::Tensor& A, const at::Tensor& B, const at::Tensor& C, const at::Tensor& out,
                 const std::optional<at::Tensor>& D, const std::optional<at::Tensor>& z,
                 const std::optional<at::Tensor>& dt_bias, bool dt_softplus, int64_t max_draft_tokens,
                 const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                 const std::optional<at::Tensor>& rounding_seed, bool staggered_flush);

void mamba2_verify(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                   const std::optional<at::Tensor>& read_scale, const at::Tensor& x_buf, const at::Tensor& B_buf,
                   const at::Tensor& dt_buf, const at::Tensor& num_committed, const at::Tensor& num_verified,
                   const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                   const at::Tensor& C, const at::Tensor& out, const std::optional<at::Tensor>& D,
                   const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias, bool dt_softplus,
                   const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                   const std::optional<at::Tensor>& error_word);

void mamba2_commit(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                   const std::optional<at::Tensor>& read_scale, const at::Tensor& x_buf, const at::Tensor& B_buf,
                   const at::Tensor& dt_buf, const at::Tensor& num_committed, const at::Tensor& num_verified,
                   const at::Tensor& num_accepted, const at::Tensor& A, int64_t max_draft_tokens,
                   const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                   const std::optional<at::Tensor>& rounding_seed, const std::optional<at::Tensor>& error_word);

void mamba2_flush(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                  const std::optional<at::Tensor>& read_scale, const at::Tensor& x_buf, const at::Tensor& B_buf,
                  const at::Tensor& dt_buf, const at::Tensor& num_committed, const at::Tensor& A,
                  const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                  const std::optional<at::Tensor>& rounding_seed);

void mamba2_materialize(const at::Tensor& checkpoint, const at::Tensor& x_buf, const at::Tensor& B_buf,
                        const at::Tensor& dt_buf, const at::Tensor& num_committed, const at::Tensor& A,
                        const at::Tensor& out, const std::optional<at::Tensor>& slots, int64_t pad_slot_id);

// Every Mamba-2 layer of a model in one launch each (families/mamba2/ops_api.cpp; replayssm_cuda.LayerCaches):
// mamba2_layer_table (not an op; _C.mamba2_layer_table) builds, once, the device table of the layers'
// pointers that the *_layers ops take with the same lists.
at::Tensor mamba2_layer_table(at::TensorList checkpoints, at::TensorList read_copies, at::TensorList read_scales,
                              at::TensorList x_bufs, at::TensorList B_bufs, at::TensorList dt_bufs,
                              at::TensorList num_committed, at::TensorList num_verified, at::TensorList A,
                              at::TensorList rounding_seeds, at::TensorList error_words);

#define REPLAYSSM_LAYER_ARGS                                                                                        \
  const at::Tensor &layer_table, at::TensorList checkpoints, at::TensorList read_copies, at::TensorList read_scales, \
      at::TensorList x_bufs, at::TensorList B_bufs, at::TensorList dt_bufs, at::TensorList num_committed,          \
      at::TensorList num_verified, at::TensorList A, at::TensorList rounding_seeds, at::TensorList error_words
void mamba2_commit_layers(REPLAYSSM_LAYER_ARGS, const at::Tensor& num_accepted, int64_t max_draft_tokens,
                          const std::optional<at::Tensor>& slots, int64_t pad_slot_id);
void mamba2_flush_layers(REPLAYSSM_LAYER_ARGS, const std::optional<at::Tensor>& slots, int64_t pad_slot_id);
void mamba2_materialize_layers(REPLAYSSM_LAYER_ARGS, const at::Tensor& out, const std::optional<at::Tensor>& slots,
                               int64_t pad_slot_id);
#undef REPLAYSSM_LAYER_ARGS

void mamba2_update_snapshots(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                             const at::Tensor& B, const at::Tensor& C, const at::Tensor& out,
                             const at::Tensor& snapshots, const std::optional<at::Tensor>& D,
                             const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias,
                             bool dt_softplus, const std::optional<at::Tensor>& slots, int64_t pad_slot_id);

void load(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
          const std::optional<at::Tensor>& read_scale, const at::Tensor& num_committed, const at::Tensor& states,
          const std::optional<at::Tensor>& slots, int64_t pad_slot_id);

void reset(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
           const std::optional<at::Tensor>& read_scale, at::TensorList buffers, const at::Tensor& num_committed,
           const std::optional<at::Tensor>& slots, int64_t pad_slot_id);

void stagger_cursors(at::TensorList buffers, const at::Tensor& num_committed, const std::optional<at::Tensor>& slots,
                     int64_t pad_slot_id, int64_t period);

void copy_slots(at::TensorList cache_tensors, const at::Tensor& src_slots, const at::Tensor& dst_slots,
                int64_t pad_slot_id);

// The slot ops of many layers in one launch (api/slot_ops_api.cpp): slot_table (not an op; _C.slot_table)
// builds, once, the device table of the tensors that fill_slots_table and copy_slots_table then take.
at::Tensor slot_table(at::TensorList cache_tensors, at::ArrayRef<double> fill_values, at::IntArrayRef fill_periods);

void fill_slots_table(at::TensorList cache_tensors, const at::Tensor& slot_table, at::ArrayRef<double> fill_values,
                      at::IntArrayRef fill_periods, const std::optional<at::Tensor>& slots, int64_t pad_slot_id);

void copy_slots_table(at::TensorList cache_tensors, const at::Tensor& slot_table, const at::Tensor& src_slots,
                      const at::Tensor& dst_slots, int64_t pad_slot_id);

// Gated DeltaNet (gdn_*) and KDA (kda_*): one set of ops per family, with the same signatures
// (families/gdn/ops_api.cpp: update, update_snapshots, step; families/gdn/spec_api.cpp: verify, commit,
// flush, materialize). KDA runs GDN's kernels with the decay per key channel (GdnGate::kVector): its a is
// (batch, [T,] HV, K), dt_bias (HV, K) and g_buf (slots, HV, L, K). commit and flush read the buffers (the
// fold recomputes u in registers and shared memory, never into u_buf) and write the checkpoint, the read
// copy and the cursors.
#define REPLAYSSM_DELTA_OPS_DECLARE(family)                                                                           \
  void family##_update(const at::Tensor& state, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,        \
                       const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log, const at::Tensor& dt_bias,   \
                       const at::Tensor& out, std::optional<double> scale, bool use_qk_l2norm,                         \
                       const std::optional<at::Tensor>& slots, int64_t pad_slot_id);                                   \
  void family##_update_snapshots(const at::Tensor& state, const at::Tensor& q, const at::Tensor& k,                   \
                                 const at::Tensor& v, const at::Tensor& a, const at::Tensor& b,                       \
                                 const at::Tensor& A_log, const at::Tensor& dt_bias, const at::Tensor& out,           \
                                 const at::Tensor& snapshots, std::optional<double> scale, bool use_qk_l2norm,        \
                                 const std::optional<at::Tensor>& slots, int64_t pad_slot_id);                        \
  void family##_step(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,                        \
                     const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,   \
                     const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,                    \
                     const at::Tensor& num_committed, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,  \
                     const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log, const at::Tensor& dt_bias,    \
                     const at::Tensor& out, std::optional<double> scale, bool use_qk_l2norm,                          \
                     int64_t max_draft_tokens, const std::optional<at::Tensor>& slots, int64_t pad_slot_id,           \
                     bool staggered_flush);                                                                           \
  void family##_verify(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,                      \
                       const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf, \
                       const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,                  \
                       const at::Tensor& num_committed, const at::Tensor& num_verified, const at::Tensor& q,          \
                       const at::Tensor& k, const at::Tensor& v, const at::Tensor& a, const at::Tensor& b,            \
                       const at::Tensor& A_log, const at::Tensor& dt_bias, const at::Tensor& out,                     \
                       std::optional<double> scale, bool use_qk_l2norm, const std::optional<at::Tensor>& slots,       \
                       int64_t pad_slot_id, const std::optional<at::Tensor>& error_word);                             \
  void family##_commit(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,                      \
                       const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf, \
                       const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,                  \
                       const at::Tensor& num_committed, const at::Tensor& num_verified,                               \
                       const at::Tensor& num_accepted, int64_t max_draft_tokens, bool use_qk_l2norm,                  \
                       const std::optional<at::Tensor>& slots, int64_t pad_slot_id,                                   \
                       const std::optional<at::Tensor>& error_word);                                                  \
  void family##_flush(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,                       \
                      const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,  \
                      const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,                   \
                      const at::Tensor& num_committed, bool use_qk_l2norm, const std::optional<at::Tensor>& slots,    \
                      int64_t pad_slot_id);                                                                           \
  void family##_materialize(const at::Tensor& checkpoint, const at::Tensor& k_buf, const at::Tensor& v_buf,           \
                            const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,             \
                            const at::Tensor& num_committed, const at::Tensor& out, bool use_qk_l2norm,               \
                            const std::optional<at::Tensor>& slots, int64_t pad_slot_id);
REPLAYSSM_DELTA_OPS_DECLARE(gdn)
REPLAYSSM_DELTA_OPS_DECLARE(kda)
#undef REPLAYSSM_DELTA_OPS_DECLARE

// Every GDN layer of a model in one launch each (families/gdn/spec_api.cpp; replayssm_cuda.LayerCaches):
// gdn_layer_table (not an op; _C.gdn_layer_table) builds, once, the device table of the layers' pointers
// that the gdn_*_layers ops take with the same lists.
at::Tensor gdn_layer_table(at::TensorList checkpoints, at::TensorList read_copies, at::TensorList read_scales,
                           at::TensorList k_bufs, at::TensorList v_bufs, at::TensorList g_bufs,
                           at::TensorList beta_bufs, at::TensorList u_bufs, at::TensorList num_committed,
                           at::TensorList num_verified, at::TensorList error_words);

#define REPLAYSSM_GDN_LAYER_ARGS                                                                                    \
  const at::Tensor &layer_table, at::TensorList checkpoints, at::TensorList read_copies, at::TensorList read_scales, \
      at::TensorList k_bufs, at::TensorList v_bufs, at::TensorList g_bufs, at::TensorList beta_bufs,               \
      at::TensorList u_bufs, at::TensorList num_committed, at::TensorList num_verified, at::TensorList error_words
void gdn_commit_layers(REPLAYSSM_GDN_LAYER_ARGS, const at::Tensor& num_accepted, int64_t max_draft_tokens,
                       bool use_qk_l2norm, const std::optional<at::Tensor>& slots, int64_t pad_slot_id);
void gdn_flush_layers(REPLAYSSM_GDN_LAYER_ARGS, bool use_qk_l2norm, const std::optional<at::Tensor>& slots,
                      int64_t pad_slot_id);
void gdn_materialize_layers(REPLAYSSM_GDN_LAYER_ARGS, const at::Tensor& out, bool use_qk_l2norm,
                            const std::optional<at::Tensor>& slots, int64_t pad_slot_id);
#undef REPLAYSSM_GDN_LAYER_ARGS

}  // namespace replayssm
