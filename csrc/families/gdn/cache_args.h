// The GDN API's checks and params filling that several ops share: the cache tensors (GdnCache), the
// per-token inputs (GdnTokens), the slots. Host-only (torch); kernels never see it. Every message has
// the form "<op>: <argument> must <expectation>, got <what was given>" (api/checks.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "api/checks.h"
#include "api/tensor_args.h"
#include "families/gdn/params.h"
#include "families/gdn/variants.h"

namespace replayssm {
namespace gdn_api {

inline void check_shape(const char* op, const char* name, int64_t K, int64_t V) {
  TORCH_CHECK(gdn::kVariants.shape_compiled(K, V),
              checks::cat(op, ": ", name, " (head_k_dim K = size(3), head_v_dim V = size(2)) must have (K, V) in {",
                          gdn::kVariants.shapes_text(), "}, got (", K, ", ", V, ")"));
}

// The variants table's dtypes (variants.h), as torch dtypes: the activations, the state of the
// conventional ops, the checkpoint of the replay ops and the read copies a checkpoint dtype takes.
inline std::vector<at::ScalarType> activation_dtypes() { return torch_dtypes(gdn::kVariants.activation_dtypes()); }
inline std::vector<at::ScalarType> state_dtypes() { return torch_dtypes(gdn::kVariants.state_dtypes()); }
inline std::vector<at::ScalarType> checkpoint_dtypes() { return torch_dtypes(gdn::kVariants.checkpoint_dtypes()); }
inline std::vector<at::ScalarType> read_copy_dtypes(DType checkpoint) {
  return torch_dtypes(gdn::kVariants.read_copy_dtypes(checkpoint));
}

// The cache of one layer: checkpoint (S, HV, V, K), the optional read copy (and its fp8 scales), the
// buffers (k (S, H, L, K), v (S, HV, L, V): the activation dtype; g, beta (S, HV, L), u (S, HV, L, V):
// fp32) and the cursors (S,) int32. `written`: the op writes the checkpoint, read copy and cursors;
// `buffers_written`: it appends to the buffers. `gate` GdnGate::kVector (KDA): g_buf (S, HV, L, K), its
// channels contiguous and its entries 16-byte aligned, the entry stride into *gb_entry_stride. Returns H.
inline int64_t fill_cache(GdnCache& c, const Expect& expect, const char* op, const at::Tensor& checkpoint,
                          const std::optional<at::Tensor>& read_copy, const std::optional<at::Tensor>& read_scale,
                          const at::Tensor& k_buf, const at::Tensor& v_buf, const at::Tensor& g_buf,
                          const at::Tensor& beta_buf, const at::Tensor& u_buf, const at::Tensor& num_committed,
                          bool written, bool buffers_written, GdnGate gate = GdnGate::kScalar,
                          int64_t* gb_entry_stride = nullptr) {
  expect("checkpoint", checkpoint, {-1, -1, -1, -1}, checkpoint_dtypes(), 16);
  const int64_t S = checkpoint.size(0), HV = checkpoint.size(1), V = checkpoint.size(2), K = checkpoint.size(3);
  check_shape(op, "checkpoint", K, V);
  if (written) checks::writable(op, "checkpoint", checkpoint);
  c.checkpoint = checkpoint.data_ptr();
  c.checkpoint_dtype = kernel_dtype(checkpoint.scalar_type());
  c.ck_slot_stride = checkpoint.stride(0);
  c.ck_head_stride = checkpoint.stride(1);
  c.ck_row_stride = checkpoint.stride(2);

  c.read_copy = nullptr;
  c.read_copy_dtype = c.checkpoint_dtype;
  c.read_scale = nullptr;
  if (read_copy) {
    const auto allowed = read_copy_dtypes(c.checkpoint_dtype);
    TORCH_CHECK(!allowed.empty(), checks::cat(op, ": read_copy must be None with a ", checks::dtype_str(checkpoint.scalar_type()), " checkpoint, got a tensor"));
    expect("read_copy", *read_copy, {S, HV, V, K}, allowed, 16);
    if (written) checks::writable(op, "read_copy", *read_copy);
    c.read_copy = read_copy->data_ptr();
    c.read_copy_dtype = kernel_dtype(read_copy->scalar_type());
    c.rc_slot_stride = read_copy->stride(0);
    c.rc_head_stride = read_copy->stride(1);
    c.rc_row_stride = read_copy->stride(2);
    if (read_copy->scalar_type() == at::kFloat8_e4m3fn) {
      TORCH_CHECK(read_scale.has_value(), checks::cat(op, ": read_scale is required with a float8_e4m3fn read_copy (float32, shape (", S, ", ", HV, ", ", V, ")), got None"));
      expect("read_scale", *read_scale, {S, HV, V}, {at::kFloat});
      if (written) checks::writable(op, "read_scale", *read_scale);
      c.read_scale = read_scale->data_ptr<float>();
      c.rs_slot_stride = read_scale->stride(0);
      c.rs_head_stride = read_scale->stride(1);
    } else {
      TORCH_CHECK(!read_scale.has_value(), checks::cat(op, ": read_scale must be None unless read_copy is float8_e4m3fn, got a tensor"));
    }
  } else {
    TORCH_CHECK(!read_scale.has_value(), checks::cat(op, ": read_scale must be None when read_copy is None, got a tensor"));
  }

  expect("k_buf", k_buf, {S, -1, -1, K}, activation_dtypes(), 16);
  const int64_t H = k_buf.size(1), L = k_buf.size(2);
  TORCH_CHECK(H >= 1 && HV % H == 0, checks::cat(op, ": the number of v-heads (checkpoint.size(1) = ", HV, ") must be a multiple of the number of q/k heads (k_buf.size(1)), got ", H));
  TORCH_CHECK(L >= 1 && L <= kGdnMaxBufferLen, checks::cat(op, ": the buffer length L (k_buf.size(2)) must be in [1, ", kGdnMaxBufferLen, "], got ", L));
  const auto act = k_buf.scalar_type();
  expect("v_buf", v_buf, {S, HV, L, V}, {act}, 16);
  if (gate == GdnGate::kVector) {
    expect("g_buf", g_buf, {S, HV, L, K}, {at::kFloat}, 16);
    if (gb_entry_stride != nullptr) *gb_entry_stride = g_buf.stride(2);
  } else {
    expect("g_buf", g_buf, {S, HV, L}, {at::kFloat});
  }
  expect("beta_buf", beta_buf, {S, HV, L}, {at::kFloat});
  expect("u_buf", u_buf, {S, HV, L, V}, {at::kFloat}, 16);
  expect("num_committed", num_committed, {S}, {at::kInt});
  if (buffers_written) {
    checks::writable(op, "k_buf", k_buf);
    checks::writable(op, "v_buf", v_buf);
    checks::writable(op, "g_buf", g_buf);
    checks::writable(op, "beta_buf", beta_buf);
    checks::writable(op, "u_buf", u_buf);
  }
  if (written) checks::writable(op, "num_committed", num_committed);
  c.k_buf = k_buf.data_ptr();
  c.kb_slot_stride = k_buf.stride(0);
  c.kb_head_stride = k_buf.stride(1);
  c.kb_entry_stride = k_buf.stride(2);
  c.v_buf = v_buf.data_ptr();
  c.vb_slot_stride = v_buf.stride(0);
  c.vb_head_stride = v_buf.stride(1);
  c.vb_entry_stride = v_buf.stride(2);
  c.g_buf = g_buf.data_ptr<float>();
  c.gb_slot_stride = g_buf.stride(0);
  c.gb_head_stride = g_buf.stride(1);
  c.beta_buf = beta_buf.data_ptr<float>();
  c.bb_slot_stride = beta_buf.stride(0);
  c.bb_head_stride = beta_buf.stride(1);
  c.u_buf = u_buf.data_ptr<float>();
  c.ub_slot_stride = u_buf.stride(0);
  c.ub_head_stride = u_buf.stride(1);
  c.ub_entry_stride = u_buf.stride(2);
  c.num_committed = num_committed.data_ptr<int32_t>();
  c.buffer_len = static_cast<int32_t>(L);
  return H;
}

// num_verified (verify writes it, commit reads and zeroes it): int32 (num_slots,), apart from the cursors.
inline void fill_num_verified(GdnCache& c, const Expect& expect, const char* op, const at::Tensor& num_verified,
                              const at::Tensor& num_committed) {
  expect("num_verified", num_verified, {num_committed.size(0)}, {at::kInt});
  checks::writable(op, "num_verified", num_verified);
  checks::no_overlap(op, "num_verified", num_verified, "num_committed", num_committed);
  c.num_verified = num_verified.data_ptr<int32_t>();
}

// A gate input (a or b): shape `shape` exactly, the activation dtype or fp32, any strides.
inline void expect_gate(const char* op, const char* name, const at::Tensor& t, const at::Tensor& device_ref,
                        const std::vector<int64_t>& shape, const char* layout, at::ScalarType act) {
  checks::cuda(op, name, t);
  checks::same_device(op, name, t, "the first tensor argument", device_ref);
  checks::shape_is(op, name, t, layout, shape);
  TORCH_CHECK(t.scalar_type() == act || t.scalar_type() == at::kFloat,
              checks::cat(op, ": ", name, " must have dtype in {", checks::dtype_str(act), ", float32}, got ", checks::dtype_str(t.scalar_type())));
}

// The inputs of one call: q, k (batch, [T,] H, K), v, out (batch, [T,] HV, V) of the activation dtype
// `act`, a, b (batch, [T,] HV), A_log, dt_bias (HV,) fp32, the scale and the normalisation flag.
// `has_tokens`: the inputs have a token dimension (batch, T, ...). `act_from_cache`: act is the cache's
// (k_buf's), and q, k, v, out are checked against it first, each by name. `gate` GdnGate::kVector
// (KDA): a (batch, [T,] HV, K) and dt_bias (HV, K), per key channel. Returns the batch size.
inline int64_t fill_tokens(GdnParams& p, const Expect& expect, const char* op, int64_t H, int64_t HV, int64_t K,
                           int64_t V, at::ScalarType act, bool act_from_cache, bool has_tokens, const at::Tensor& q,
                           const at::Tensor& k, const at::Tensor& v, const at::Tensor& a, const at::Tensor& b,
                           const at::Tensor& A_log, const at::Tensor& dt_bias, const at::Tensor& out,
                           std::optional<double> scale, bool use_qk_l2norm, GdnGate gate = GdnGate::kScalar) {
  const bool vector_gate = gate == GdnGate::kVector;
  if (act_from_cache) {
    checks::cache_activation(op, "q", q, "k_buf", act);
    checks::cache_activation(op, "k", k, "k_buf", act);
    checks::cache_activation(op, "v", v, "k_buf", act);
    checks::cache_activation(op, "out", out, "k_buf", act);
  }
  const int lead = has_tokens ? 2 : 1;
  std::vector<int64_t> q_shape(lead, -1);
  q_shape.push_back(H);
  q_shape.push_back(K);
  expect("q", q, q_shape, {act}, 16);
  const int64_t batch = q.size(0), T = has_tokens ? q.size(1) : 1;
  TORCH_CHECK(batch <= 65535, checks::cat(op, ": batch (q.size(0)) must be <= 65535, got ", batch));
  std::vector<int64_t> rows{batch};
  if (has_tokens) rows.push_back(T);
  auto with = [&](std::vector<int64_t> tail) {
    std::vector<int64_t> s = rows;
    s.insert(s.end(), tail.begin(), tail.end());
    return s;
  };
  expect("k", k, with({H, K}), {act}, 16);
  expect("v", v, with({HV, V}), {act}, 16);  // the step's fold reads the token's value in 16-byte vectors
  expect("out", out, with({HV, V}), {act});
  checks::writable(op, "out", out);
  const char* gate_layout = has_tokens ? "(batch, T, v_heads)" : "(batch, v_heads)";
  if (vector_gate) {
    expect_gate(op, "a", a, q, with({HV, K}), has_tokens ? "(batch, T, v_heads, head_k_dim)" : "(batch, v_heads, head_k_dim)", act);
  } else {
    expect_gate(op, "a", a, q, with({HV}), gate_layout, act);
  }
  expect_gate(op, "b", b, q, with({HV}), gate_layout, act);
  expect("A_log", A_log, {HV}, {at::kFloat});
  if (vector_gate) {
    expect("dt_bias", dt_bias, {HV, K}, {at::kFloat});
  } else {
    expect("dt_bias", dt_bias, {HV}, {at::kFloat});
  }

  GdnTokens& t = p.tokens;
  const int d = has_tokens ? 1 : 0;  // the dims after the row (and token) index
  t.num_tokens = static_cast<int32_t>(T);
  t.q = q.data_ptr();
  t.q_row_stride = q.stride(0);
  t.q_token_stride = has_tokens ? q.stride(1) : 0;
  t.q_head_stride = q.stride(1 + d);
  t.k = k.data_ptr();
  t.k_row_stride = k.stride(0);
  t.k_token_stride = has_tokens ? k.stride(1) : 0;
  t.k_head_stride = k.stride(1 + d);
  t.v = v.data_ptr();
  t.v_row_stride = v.stride(0);
  t.v_token_stride = has_tokens ? v.stride(1) : 0;
  t.v_head_stride = v.stride(1 + d);
  t.a = a.data_ptr();
  t.a_dtype = kernel_dtype(a.scalar_type());
  t.a_row_stride = a.stride(0);
  t.a_token_stride = has_tokens ? a.stride(1) : 0;
  t.a_head_stride = a.stride(1 + d);
  t.b = b.data_ptr();
  t.b_dtype = kernel_dtype(b.scalar_type());
  t.b_row_stride = b.stride(0);
  t.b_token_stride = has_tokens ? b.stride(1) : 0;
  t.b_head_stride = b.stride(1 + d);
  t.out = out.data_ptr();
  t.out_row_stride = out.stride(0);
  t.out_token_stride = has_tokens ? out.stride(1) : 0;
  t.out_head_stride = out.stride(1 + d);
  t.A_log = A_log.data_ptr<float>();
  t.dt_bias = dt_bias.data_ptr<float>();
  t.scale = static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(K)));
  t.use_qk_l2norm = use_qk_l2norm;
  p.act_dtype = kernel_dtype(act);
  p.batch = static_cast<int32_t>(batch);
  p.heads = static_cast<int32_t>(H);
  p.v_heads = static_cast<int32_t>(HV);
  p.head_k_dim = static_cast<int32_t>(K);
  p.head_v_dim = static_cast<int32_t>(V);
  p.gate = gate;
  if (vector_gate) {
    p.kda.a_channel_stride = a.stride(2 + d);
    p.kda.dt_bias_head_stride = dt_bias.stride(0);
  }
  return batch;
}

// Rows -> slots: slots (batch,) int32 / int64, or none (row r uses slot r, so batch <= num_slots).
inline void fill_slots(GdnParams& p, const Expect& expect, const char* op, const std::optional<at::Tensor>& slots,
                       int64_t batch, int64_t pad_slot_id, int64_t num_slots) {
  if (slots) {
    expect("slots", *slots, {batch}, {at::kInt, at::kLong});
  } else {
    TORCH_CHECK(batch <= num_slots, checks::cat(op, ": without slots, row r uses slot r, so batch (", batch, ") must be <= num_slots (", num_slots, ")"));
  }
  p.slots = slots ? slots->data_ptr() : nullptr;
  p.slots_dtype = slots ? kernel_dtype(slots->scalar_type()) : DType::kInt64;
  p.slots_stride = slots ? slots->stride(0) : 1;
  p.pad_slot_id = pad_slot_id;
  p.num_slots = num_slots;
}

}  // namespace gdn_api
}  // namespace replayssm
