// torch.ops.replayssm.gdn_verify / gdn_commit / gdn_flush / gdn_materialize: validate, fill GdnParams,
// launch on the current stream. Tensor tables and math: families/gdn/params.h and the kernels'
// headers (verify_kernel.cuh, fold_kernel.cuh). No allocation and no host synchronisation, so all are
// safe under CUDA-graph capture.
#include <cmath>
#include <string>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "api/checks.h"
#include "api/ops.h"
#include "api/tensor_args.h"
#include "families/gdn/params.h"
#include "families/gdn/spec_variants.h"

namespace replayssm {
namespace {

bool shape_supported(int64_t K, int64_t V) {
#define REPLAYSSM_GDN_SHAPE_OK(KD, VD) if (K == KD && V == VD) return true;
  REPLAYSSM_GDN_SHAPES(REPLAYSSM_GDN_SHAPE_OK)
#undef REPLAYSSM_GDN_SHAPE_OK
  return false;
}

// The checkpoint and its read copy, the buffers and cursors of one layer's cache into p.cache; returns
// the number of q/k heads H (k_buf.size(1)). `written`: the op writes the checkpoint and read copy
// (commit, flush); `buffers_written`: it appends to the buffers (verify).
int64_t fill_cache(GdnParams& p, const Expect& expect, const char* op, const at::Tensor& checkpoint,
                   const std::optional<at::Tensor>& read_copy, const std::optional<at::Tensor>& read_scale,
                   const at::Tensor& k_buf, const at::Tensor& v_buf, const at::Tensor& g_buf,
                   const at::Tensor& beta_buf, const at::Tensor& u_buf, const at::Tensor& num_committed, bool written,
                   bool buffers_written) {
  expect("checkpoint", checkpoint, {-1, -1, -1, -1}, {at::kFloat, at::kBFloat16, at::kHalf}, 16);
  if (written) checks::writable(op, "checkpoint", checkpoint);
  const int64_t S = checkpoint.size(0), HV = checkpoint.size(1), V = checkpoint.size(2), K = checkpoint.size(3);
  TORCH_CHECK(shape_supported(K, V), checks::cat(op, ": checkpoint (head_k_dim K, head_v_dim V) must be one of " REPLAYSSM_GDN_SHAPES_TEXT ", got (", K, ", ", V, ")"));
  TORCH_CHECK(HV >= 1 && HV <= 65535, checks::cat(op, ": the number of v-heads (checkpoint.size(1)) must be in [1, 65535], got ", HV));

  const std::vector<at::ScalarType> acts{at::kBFloat16, at::kHalf};
  expect("k_buf", k_buf, {S, -1, -1, K}, acts, 16);
  const auto act = k_buf.scalar_type();
  const int64_t H = k_buf.size(1), L = k_buf.size(2);
  TORCH_CHECK(H >= 1 && HV % H == 0, checks::cat(op, ": the number of v-heads (", HV, ") must be a multiple of the number of q/k heads (k_buf.size(1) = ", H, ")"));
  TORCH_CHECK(L >= 1 && L <= kGdnMaxBufferLen, checks::cat(op, ": the buffer length (k_buf.size(2)) must be in [1, ", static_cast<int64_t>(kGdnMaxBufferLen), "], got ", L));
  const auto ck = checkpoint.scalar_type();
  TORCH_CHECK(ck == at::kFloat || ck == act, checks::cat(op, ": a ", checks::dtype_str(ck), " checkpoint pairs with ", checks::dtype_str(ck), " activations, but k_buf holds ", checks::dtype_str(act), " (a float32 checkpoint takes either)"));
  expect("v_buf", v_buf, {S, HV, L, V}, {act}, 16);
  expect("g_buf", g_buf, {S, HV, L}, {at::kFloat});
  expect("beta_buf", beta_buf, {S, HV, L}, {at::kFloat});
  expect("u_buf", u_buf, {S, HV, L, V}, {at::kFloat}, 16);
  expect("num_committed", num_committed, {S}, {at::kInt});
  if (written) checks::writable(op, "num_committed", num_committed);
  if (buffers_written) {
    checks::writable(op, "k_buf", k_buf);
    checks::writable(op, "v_buf", v_buf);
    checks::writable(op, "g_buf", g_buf);
    checks::writable(op, "beta_buf", beta_buf);
    checks::writable(op, "u_buf", u_buf);
  }

  GdnCache& c = p.cache;
  c.checkpoint = checkpoint.data_ptr();
  c.checkpoint_dtype = kernel_dtype(ck);
  c.ck_slot_stride = checkpoint.stride(0);
  c.ck_head_stride = checkpoint.stride(1);
  c.ck_row_stride = checkpoint.stride(2);
  c.read_copy = nullptr;
  c.read_scale = nullptr;
  if (read_copy) {
    const std::vector<at::ScalarType> allowed = ck == at::kFloat
        ? std::vector<at::ScalarType>{at::kBFloat16, at::kHalf, at::kFloat8_e4m3fn}
        : std::vector<at::ScalarType>{at::kFloat8_e4m3fn};
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
      TORCH_CHECK(!read_scale.has_value(), checks::cat(op, ": read_scale must be None unless read_copy is float8_e4m3fn"));
    }
  } else {
    TORCH_CHECK(!read_scale.has_value(), checks::cat(op, ": read_scale is given but read_copy is None"));
  }
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
  c.max_draft_tokens = 0;

  p.act_dtype = kernel_dtype(act);
  p.num_slots = S;
  p.heads = static_cast<int32_t>(H);
  p.v_heads = static_cast<int32_t>(HV);
  p.head_k_dim = static_cast<int32_t>(K);
  p.head_v_dim = static_cast<int32_t>(V);
  return H;
}

void fill_slots(GdnParams& p, const Expect& expect, const char* op, const std::optional<at::Tensor>& slots, int64_t batch,
                int64_t pad_slot_id) {
  if (slots) {
    expect("slots", *slots, {batch}, {at::kInt, at::kLong});
  } else {
    TORCH_CHECK(batch <= p.num_slots, checks::cat(op, ": without slots, row r uses slot r, so batch (", batch, ") must be <= num_slots (", p.num_slots, ")"));
  }
  p.slots = slots ? slots->data_ptr() : nullptr;
  p.slots_dtype = slots ? kernel_dtype(slots->scalar_type()) : DType::kInt64;
  p.slots_stride = slots ? slots->stride(0) : 1;
  p.pad_slot_id = pad_slot_id;
}

void launch_checked(const char* op, const at::Tensor& on, cudaError_t (*launcher)(const GdnParams&, cudaStream_t),
                    const GdnParams& p) {
  const c10::cuda::CUDAGuard device_guard(on.device());
  const cudaError_t err = launcher(p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, checks::cat(op, ": CUDA kernel launch failed: ", cudaGetErrorString(err)));
}

// What commit, flush and materialize share: the cache (the read copy only where it is refreshed), the
// rows and their slots. `batch` rows; the caller fills the mode and its own tensors.
GdnParams fold_params(const char* op, const Expect& expect, const at::Tensor& checkpoint, bool written,
                      const std::optional<at::Tensor>& read_copy, const std::optional<at::Tensor>& read_scale,
                      const at::Tensor& k_buf, const at::Tensor& v_buf, const at::Tensor& g_buf,
                      const at::Tensor& beta_buf, const at::Tensor& u_buf, const at::Tensor& num_committed,
                      bool use_qk_l2norm, const std::optional<at::Tensor>& slots, int64_t batch, int64_t pad_slot_id) {
  GdnParams p{};
  fill_cache(p, expect, op, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf, num_committed,
             written, /*buffers_written=*/false);
  TORCH_CHECK(batch * p.v_heads <= INT32_MAX, checks::cat(op, ": the number of rows times v-heads must be < 2^31, got ", batch, " x ", static_cast<int64_t>(p.v_heads)));
  fill_slots(p, expect, op, slots, batch, pad_slot_id);
  p.batch = static_cast<int32_t>(batch);
  p.tokens.use_qk_l2norm = use_qk_l2norm;
  return p;
}

}  // namespace

void gdn_verify(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,
                const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
                const at::Tensor& num_committed, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log, const at::Tensor& dt_bias,
                const at::Tensor& out, std::optional<double> scale, bool use_qk_l2norm,
                const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "gdn_verify";
  const Expect expect{op, checkpoint, "checkpoint"};
  GdnParams p{};
  const int64_t H = fill_cache(p, expect, op, checkpoint, read_copy, read_scale, k_buf, v_buf, g_buf, beta_buf, u_buf,
                               num_committed, /*written=*/false, /*buffers_written=*/true);
  const int64_t HV = p.v_heads, K = p.head_k_dim, V = p.head_v_dim, L = p.cache.buffer_len;
  const auto act = k_buf.scalar_type();
  expect("q", q, {-1, -1, H, K}, {act}, 16);
  const int64_t batch = q.size(0), T = q.size(1);
  const int64_t max_T = L < kGdnMaxDraftTokens ? L : kGdnMaxDraftTokens;
  TORCH_CHECK(T >= 1 && T <= max_T, checks::cat(op, ": the number of draft tokens T (q.size(1)) must be in [1, min(L = ", L, ", ", static_cast<int64_t>(kGdnMaxDraftTokens), ")], got ", T));
  TORCH_CHECK(batch <= 65535, checks::cat(op, ": batch (q.size(0)) must be <= 65535, got ", batch));
  expect("k", k, {batch, T, H, K}, {act}, 16);
  expect("v", v, {batch, T, HV, V}, {act}, 16);
  expect("a", a, {batch, T, HV}, {act, at::kFloat});
  expect("b", b, {batch, T, HV}, {act, at::kFloat});
  expect("A_log", A_log, {HV}, {at::kFloat});
  expect("dt_bias", dt_bias, {HV}, {at::kFloat});
  expect("out", out, {batch, T, HV, V}, {act});
  checks::writable(op, "out", out);
  fill_slots(p, expect, op, slots, batch, pad_slot_id);

  GdnTokens& tk = p.tokens;
  tk.num_tokens = static_cast<int32_t>(T);
  tk.q = q.data_ptr();
  tk.q_row_stride = q.stride(0);
  tk.q_token_stride = q.stride(1);
  tk.q_head_stride = q.stride(2);
  tk.k = k.data_ptr();
  tk.k_row_stride = k.stride(0);
  tk.k_token_stride = k.stride(1);
  tk.k_head_stride = k.stride(2);
  tk.v = v.data_ptr();
  tk.v_row_stride = v.stride(0);
  tk.v_token_stride = v.stride(1);
  tk.v_head_stride = v.stride(2);
  tk.a = a.data_ptr();
  tk.a_dtype = kernel_dtype(a.scalar_type());
  tk.a_row_stride = a.stride(0);
  tk.a_token_stride = a.stride(1);
  tk.a_head_stride = a.stride(2);
  tk.b = b.data_ptr();
  tk.b_dtype = kernel_dtype(b.scalar_type());
  tk.b_row_stride = b.stride(0);
  tk.b_token_stride = b.stride(1);
  tk.b_head_stride = b.stride(2);
  tk.out = out.data_ptr();
  tk.out_row_stride = out.stride(0);
  tk.out_token_stride = out.stride(1);
  tk.out_head_stride = out.stride(2);
  tk.A_log = A_log.data_ptr<float>();
  tk.dt_bias = dt_bias.data_ptr<float>();
  tk.scale = scale.has_value() ? static_cast<float>(*scale) : static_cast<float>(1.0 / std::sqrt(static_cast<double>(K)));
  tk.use_qk_l2norm = use_qk_l2norm;
  p.batch = static_cast<int32_t>(batch);
  launch_checked(op, checkpoint, launch_gdn_verify, p);
}

void gdn_commit(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
                const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,
                const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
                const at::Tensor& num_committed, const at::Tensor& num_accepted, int64_t max_draft_tokens,
                bool use_qk_l2norm, const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "gdn_commit";
  const Expect expect{op, checkpoint, "checkpoint"};
  expect("num_accepted", num_accepted, {-1}, {at::kInt, at::kLong});
  GdnParams p = fold_params(op, expect, checkpoint, /*written=*/true, read_copy, read_scale, k_buf, v_buf, g_buf,
                            beta_buf, u_buf, num_committed, use_qk_l2norm, slots, num_accepted.size(0), pad_slot_id);
  const int64_t L = p.cache.buffer_len;
  TORCH_CHECK(max_draft_tokens >= 1 && max_draft_tokens <= L, checks::cat(op, ": max_draft_tokens must be in [1, L = ", L, "], got ", max_draft_tokens));
  p.mode = GdnFoldMode::kCommit;
  p.cache.max_draft_tokens = static_cast<int32_t>(max_draft_tokens);
  p.num_accepted = num_accepted.data_ptr();
  p.num_accepted_dtype = kernel_dtype(num_accepted.scalar_type());
  p.num_accepted_stride = num_accepted.stride(0);
  launch_checked(op, checkpoint, launch_gdn_fold, p);
}

void gdn_flush(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
               const std::optional<at::Tensor>& read_scale, const at::Tensor& k_buf, const at::Tensor& v_buf,
               const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
               const at::Tensor& num_committed, bool use_qk_l2norm, const std::optional<at::Tensor>& slots,
               int64_t pad_slot_id) {
  constexpr const char* op = "gdn_flush";
  const Expect expect{op, checkpoint, "checkpoint"};
  if (slots) expect("slots", *slots, {-1}, {at::kInt, at::kLong});
  const int64_t batch = slots ? slots->size(0) : checkpoint.size(0);
  GdnParams p = fold_params(op, expect, checkpoint, /*written=*/true, read_copy, read_scale, k_buf, v_buf, g_buf,
                            beta_buf, u_buf, num_committed, use_qk_l2norm, slots, batch, pad_slot_id);
  p.mode = GdnFoldMode::kFlush;
  launch_checked(op, checkpoint, launch_gdn_fold, p);
}

void gdn_materialize(const at::Tensor& checkpoint, const at::Tensor& k_buf, const at::Tensor& v_buf,
                     const at::Tensor& g_buf, const at::Tensor& beta_buf, const at::Tensor& u_buf,
                     const at::Tensor& num_committed, const at::Tensor& out, bool use_qk_l2norm,
                     const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "gdn_materialize";
  const Expect expect{op, checkpoint, "checkpoint"};
  expect("checkpoint", checkpoint, {-1, -1, -1, -1}, {at::kFloat, at::kBFloat16, at::kHalf}, 16);
  expect("out", out, {-1, checkpoint.size(1), checkpoint.size(2), checkpoint.size(3)}, {at::kFloat}, 16);
  checks::writable(op, "out", out);
  GdnParams p = fold_params(op, expect, checkpoint, /*written=*/false, std::nullopt, std::nullopt, k_buf, v_buf, g_buf,
                            beta_buf, u_buf, num_committed, use_qk_l2norm, slots, out.size(0), pad_slot_id);
  p.mode = GdnFoldMode::kMaterialize;
  p.state_out = out.data_ptr<float>();
  p.so_row_stride = out.stride(0);
  p.so_head_stride = out.stride(1);
  p.so_v_stride = out.stride(2);
  launch_checked(op, checkpoint, launch_gdn_fold, p);
}

}  // namespace replayssm
