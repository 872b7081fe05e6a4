// Gated DeltaNet verify: outputs and corrected values of T draft tokens per row from the read state (the
// read copy, or the checkpoint) and the buffer, the drafts' entries appended at positions w .. w+T-1
// (w = num_committed[slot]). One CTA of 256 threads per (batch row, block of v-heads); it takes its
// v-heads one after the other.
//
// Math (replayssm_cuda/reference.py, delta_verify). Window entries j < w + T: the committed history,
// then the drafts; kn_j the normalised keys, Lambda_j = g_0 + ... + g_j, and for draft i (t = w + i) with
// normalised, scaled query qn_i:
//     u_t = beta_t (v_t - e^{Lambda_t} S kn_t - sum_{j<t} e^{Lambda_t - Lambda_j} (kn_j . kn_t) u_j)
//     o_i = e^{Lambda_t} S qn_i + sum_{j<=t} e^{Lambda_t - Lambda_j} (kn_j . qn_i) u_j
// u_j for j < w are the stored corrected values; u_{w..t-1} are this call's, so the T new u per state
// row are a T x T lower-triangular system solved by forward substitution, its coefficients (like every
// coefficient above) shared by all rows of the v-head. The state is read once per v-head for all T
// drafts: 2T dot products per state row (S kn_t and S qn_i; the decays multiply the sums).
//
// Per v-head (three phases, one CTA barrier between them):
//   P1 (all warps): the staged keys and queries normalised (fold.cuh's normalize_key), the drafts'
//      gates g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) (appended to g_buf / beta_buf),
//      Lambda over the window, the draft values in fp32, the drafts' raw k and v appended to the
//      buffers (k by the CTA of the k-head's first v-head); then the coefficients (a warp per draft,
//      the lanes splitting K). The next v-head's keys, queries, values and log decays are then staged
//      by cp.async into the raw area, which P1 has emptied.
//   P2 (all threads): the v-head's tile from the ring into registers (fold.cuh's TileMap: a row over
//      8 lanes), the stage refilled with the tile `stages` v-heads on; the 2T row dot products
//      (rows_dot), written per row to shared memory. With a read copy the mma takes (rows_mma.cuh) the
//      dots run on tensor cores straight from the stage instead: a warp per 16 rows, the drafts' raw
//      keys and queries as B (written as B words in P1 with their l2 scales as multipliers), an n-tile
//      per 4 drafts. Their u then only make outputs (commit recomputes every u from the checkpoint), so
//      the different rounding never reaches the checkpoint; without a copy verify keeps the CUDA-core
//      dots, whose u commit folds.
//   P3 (a thread per state row): the forward substitution and the outputs, in fp32; u and the outputs
//      stored. The next v-head's stored u window is staged into shared memory after the barrier that
//      ends P3 (its own cp.async group, waited for only before the next P3).
// Bytes per (row, v-head): the tile once (V K source bytes), the window's k (w K act, k-head's), u
// (w V fp32) and g (w fp32), the drafts' q, k (T K act), v (T V act), a, b; written: out (T V act), the
// drafts' k, v, g, beta, u (T (K + V) act + T (V + 2) fp32).
//
// Verify never writes the checkpoint, the read copy or the cursor. A row whose slot is a pad or out of
// range, or whose cursor leaves no room for T entries, gets zero output and touches no buffer. The
// row's first CTA records in num_verified[slot] how many entries it appended (T, or 0 without room;
// nothing for a pad row): the most the commit after it may accept.
//
// KDA (kVectorGate: the log decay per key channel, g_buf entries of K): the window's g [L][K] staged,
// the drafts' computed per channel. Stable and with no exponent positive, pivoting at the cursor: a
// thread per channel overwrites the window keys with kd_j = kn_j o e^{Lambda_{w-1} - Lambda_j} (suffix
// sums) and writes e^{Lambda_t} per draft and channel (over the dots area, free in P1); draft i's warp
// takes the drafts j in w .. t with exp(g_{j+1} + .. + g_t) per channel (suffix sums from t down) and
// the window with one pivot e^{Lambda_t - Lambda_{w-1}} = exp(g_w + .. + g_t) on kn_t and qn_i:
//     c_tj = kd_j . (pivot o kn_t)   (j < w), and likewise with qn_i
// Then kn_t and qn_i of the drafts are scaled by e^{Lambda_t} in place, and P2's dots are the decayed
// ones (alpha = 1 in P3).
#pragma once

#include "cache/error_word.cuh"
#include "cache/slot_map.cuh"
#include "common/math.cuh"
#include "families/gdn/fold.cuh"
#include "families/gdn/gates.cuh"
#include "families/gdn/rows_mma.cuh"

namespace replayssm {
namespace gdn {

// Shared memory of a verify CTA: the ring's barriers, the ring of source tiles, the raw area (cp.async:
// keys [L][K] (the window's, then the drafts' at w ..), queries [T][K], draft values [T][V], g [L] (the
// window's by cp.async, the drafts' at w .. from P1)), the fp32 area (kn [L][K], qn [T][K], u window
// [L][V], the dot products A (kn) and B (qn) [T][V], draft values [T][V], coefficients [T][L] as (u,
// output) pairs, e^{Lambda_t} and beta of the drafts [T]).
template <int kK, int kV, DType kSrc, bool kVectorGate = false>
struct VerifyLayout {
  static constexpr size_t kTileBytes = static_cast<size_t>(kV) * kK * dtype_size(kSrc);
  static constexpr size_t kRingOffset = 128;  // barriers (8 at most), then the row's context at byte 64
  static constexpr int kMaxStages = 8;
  static_assert(kTileBytes % 128 == 0, "tiles keep the ring 128-byte aligned");
  __host__ __device__ static constexpr size_t a16(size_t b) { return (b + 15) / 16 * 16; }
  __host__ __device__ static constexpr size_t k_raw(int S) { return kRingOffset + static_cast<size_t>(S) * kTileBytes; }
  __host__ __device__ static constexpr size_t q_raw(int S, int L, int) { return k_raw(S) + 2 * static_cast<size_t>(L) * kK; }
  __host__ __device__ static constexpr size_t v_raw(int S, int L, int T) { return q_raw(S, L, T) + 2 * static_cast<size_t>(T) * kK; }
  __host__ __device__ static constexpr size_t g_raw(int S, int L, int T) { return v_raw(S, L, T) + 2 * static_cast<size_t>(T) * kV; }
  // KDA: g [L][K].
  __host__ __device__ static constexpr size_t g_bytes(int L) {
    return kVectorGate ? 4 * static_cast<size_t>(L) * kK : a16(4 * static_cast<size_t>(L));
  }
  __host__ __device__ static constexpr size_t kn(int S, int L, int T) { return g_raw(S, L, T) + g_bytes(L); }
  __host__ __device__ static constexpr size_t qn(int S, int L, int T) { return kn(S, L, T) + 4 * static_cast<size_t>(L) * kK; }
  __host__ __device__ static constexpr size_t uw(int S, int L, int T) { return qn(S, L, T) + 4 * static_cast<size_t>(T) * kK; }
  __host__ __device__ static constexpr size_t dots(int S, int L, int T) { return uw(S, L, T) + 4 * static_cast<size_t>(L) * kV; }
  __host__ __device__ static constexpr size_t vd(int S, int L, int T) { return dots(S, L, T) + 8 * static_cast<size_t>(T) * kV; }
  __host__ __device__ static constexpr size_t coef(int S, int L, int T) { return vd(S, L, T) + 4 * static_cast<size_t>(T) * kV; }
  __host__ __device__ static constexpr size_t draft_scalars(int S, int L, int T) { return coef(S, L, T) + 8 * static_cast<size_t>(T) * L; }
  // Tensor-core rows (a read copy the mma takes, rows_mma.cuh): the drafts' raw keys and queries as B
  // words, vector 2 i (draft i's key) and 2 i + 1 (its query), kMmaVecWords each, T rounded up to whole
  // n-tiles of 4 drafts (an n-tile's 8 columns are 8 consecutive vectors); then their multipliers.
  // A stride of 4 kMmaStride words (= 8 mod 32) puts the 16 lanes of a half-warp's 8-byte reads of a
  // k-step (4 vectors x 4 quad lanes) on different banks.
  static constexpr bool kMmaArea = !kVectorGate && kSrc != DType::kFloat32;
  static constexpr int kMmaStride = kK / 8 + 2;
  static constexpr int kMmaVecWords = 4 * kMmaStride;
  __host__ __device__ static constexpr int padded_drafts(int T) { return (T + 3) / 4 * 4; }
  __host__ __device__ static constexpr size_t rows_b(int S, int L, int T) { return draft_scalars(S, L, T) + 2 * a16(4 * static_cast<size_t>(T)); }
  __host__ __device__ static constexpr size_t rows_mul(int S, int L, int T) {
    return rows_b(S, L, T) + 4 * static_cast<size_t>(2 * padded_drafts(T)) * kMmaVecWords;
  }
  __host__ __device__ static constexpr size_t bytes(int S, int L, int T) {
    return kMmaArea ? rows_mul(S, L, T) + 8 * static_cast<size_t>(padded_drafts(T)) : rows_b(S, L, T);
  }
};

template <int kK, int kV, DType kSrc, DType kAct, bool kVectorGate = false>
struct VerifySmem {
  using Layout = VerifyLayout<kK, kV, kSrc, kVectorGate>;
  using Act = typename Storage<kAct>::type;
  unsigned char* base;
  int S, L, T;
  __device__ VerifySmem(unsigned char* b, int stages, int buffer_len, int tokens) : base(b), S(stages), L(buffer_len), T(tokens) {}
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base) + s; }
  // The row's slot, row and cursor, read again (volatile) at every v-head: addresses formed from
  // registers held since the CTA's start were kept live across P2 by the compiler, where the
  // 128-register budget goes to the tile (the fp32 tile spilled 96-132 bytes).
  __device__ volatile int64_t* context() const { return reinterpret_cast<volatile int64_t*>(base + 64); }
  __device__ unsigned char* tile(int s) const { return base + Layout::kRingOffset + static_cast<size_t>(s) * Layout::kTileBytes; }
  __device__ Act* k_raw() const { return reinterpret_cast<Act*>(base + Layout::k_raw(S)); }
  __device__ Act* q_raw() const { return reinterpret_cast<Act*>(base + Layout::q_raw(S, L, T)); }
  __device__ Act* v_raw() const { return reinterpret_cast<Act*>(base + Layout::v_raw(S, L, T)); }
  __device__ float* g_raw() const { return reinterpret_cast<float*>(base + Layout::g_raw(S, L, T)); }
  __device__ float* kn() const { return reinterpret_cast<float*>(base + Layout::kn(S, L, T)); }
  __device__ float* qn() const { return reinterpret_cast<float*>(base + Layout::qn(S, L, T)); }
  __device__ float* uw() const { return reinterpret_cast<float*>(base + Layout::uw(S, L, T)); }
  __device__ float* A() const { return reinterpret_cast<float*>(base + Layout::dots(S, L, T)); }   // [T][V]: S kn_t
  __device__ float* B() const { return A() + T * kV; }                                            // [T][V]: S qn_i
  __device__ float* vd() const { return reinterpret_cast<float*>(base + Layout::vd(S, L, T)); }
  __device__ float2* coef() const { return reinterpret_cast<float2*>(base + Layout::coef(S, L, T)); }  // [T][L]
  // KDA, in P1 only: e^{Lambda_t} [T][K] over the dots (4 T K <= 8 T V bytes).
  __device__ float* elam() const { return A(); }
  __device__ float* draft(int k) const {  // 0: e^{Lambda_t}, 1: beta
    return reinterpret_cast<float*>(base + Layout::draft_scalars(S, L, T) + k * Layout::a16(4 * static_cast<size_t>(T)));
  }
  __device__ uint32_t* rows_b() const { return reinterpret_cast<uint32_t*>(base + Layout::rows_b(S, L, T)); }
  __device__ float* rows_mul() const { return reinterpret_cast<float*>(base + Layout::rows_mul(S, L, T)); }
};

template <DType kAct>
__device__ __forceinline__ void write_zero_outputs(const GdnParams& p, int64_t row, int head0, int heads, int V) {
  const GdnTokens& tk = p.tokens;
  const int T = tk.num_tokens;
  for (int i = static_cast<int>(threadIdx.x); i < heads * T * V; i += kFoldThreads) {
    const int h = i / (T * V), t = (i / V) % T, v = i % V;
    store_act<kAct>(tk.out, row * tk.out_row_stride + t * tk.out_token_stride + (head0 + h) * tk.out_head_stride + v, 0.0f);
  }
}

// kSrc: the dtype verify reads (the read copy's, or the checkpoint's without one); stages: tiles in the
// ring; heads_per_cta: v-heads per CTA (the last CTA of a row may take fewer).
template <int kK, int kV, DType kSrc, DType kAct, bool kVectorGate>
__global__ void __launch_bounds__(kFoldThreads, 2) verify_kernel(const GdnParams p, const int stages, const int heads_per_cta) {
  using M = TileMap<kK, kV>;
  using Act = typename Storage<kAct>::type;
  using Layout = VerifyLayout<kK, kV, kSrc, kVectorGate>;
  constexpr int kSrcBytes = dtype_size(kSrc);
  constexpr int kWarps = kFoldThreads / 32;
  extern __shared__ __align__(128) unsigned char smem_base[];
  const GdnCache& c = p.cache;
  const GdnTokens& tk = p.tokens;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid & 31;
  const bool producer = tid == 0;
  const int HV = p.v_heads, group = HV / p.heads;
  const int L = c.buffer_len, T = tk.num_tokens;
  const int64_t row = blockIdx.y;
  const int head0 = static_cast<int>(blockIdx.x) * heads_per_cta;
  const int nh = min(heads_per_cta, HV - head0);
  const int S = stages;
  const VerifySmem<kK, kV, kSrc, kAct, kVectorGate> sm(smem_base, S, L, T);

  const int64_t slot = resolve_slot(p, row);
  if (slot < 0 && blockIdx.x == 0 && producer && slot_out_of_range(p, named_slot(p, row))) {
    record_error(p.error_word, kErrorVerifySlot, row, named_slot(p, row), p.num_slots);
  }
  if (slot < 0) {
    write_zero_outputs<kAct>(p, row, head0, nh, kV);
    return;
  }
  const bool from_copy = c.read_copy != nullptr;
  // P2's row dots on tensor cores (rows_mma.cuh) where the source is a read copy the mma takes with
  // these activations: the drafts' u then only make outputs (commit recomputes them from the checkpoint),
  // so a 16-bit checkpoint read without a copy keeps the CUDA-core dots whose u commit folds.
  constexpr bool kMmaRows = !kVectorGate && tile_on_tensor_cores(kSrc, kAct);
  using Mma = RowsMma<kK, kMmaRows ? kSrc : DType::kFloat8E4M3, kMmaRows ? kAct : DType::kBFloat16>;
  const bool use_mma = kMmaRows && from_copy;
  const unsigned char* src = static_cast<const unsigned char*>(from_copy ? c.read_copy : c.checkpoint);
  const int64_t src_slot = from_copy ? c.rc_slot_stride : c.ck_slot_stride;
  const int64_t src_head = from_copy ? c.rc_head_stride : c.ck_head_stride;
  const int64_t src_row = from_copy ? c.rc_row_stride : c.ck_row_stride;
  auto issue_tile = [&](int64_t slot, int hv, int s) {
    fence_proxy_async();  // the stage was last read by ordinary loads, before a CTA barrier
    bulk_copy_tile_to_shared<kV, kK * kSrcBytes>(sm.tile(s), src + (slot * src_slot + hv * src_head) * kSrcBytes,
                                                 src_row * kSrcBytes, sm.full(s));
  };
  const int first_tiles = nh < S ? nh : S;
  if (producer) {  // the first tiles go out before the cursor is known
    for (int s = 0; s < S; ++s) mbarrier_init(sm.full(s), 1);
    fence_barrier_init();
    for (int s = 0; s < first_tiles; ++s) issue_tile(slot, head0 + s, s);
  }
  __syncthreads();  // the barriers are initialised
  const int w = c.num_committed[slot];
  // What this verify appends to the slot, the most its commit may accept (cache/fold_rows.cuh).
  if (blockIdx.x == 0 && producer) c.num_verified[slot] = (w < 0 || w + T > L) ? 0 : T;
  if (w < 0 || w + T > L) {
    write_zero_outputs<kAct>(p, row, head0, nh, kV);
    if (producer) {
      for (int s = 0; s < first_tiles; ++s) mbarrier_wait(sm.full(s), 0);  // no copy may outlive the CTA
    }
    return;
  }
  if (tid == 0) {
    sm.context()[0] = slot;
    sm.context()[1] = row;
    sm.context()[2] = w;
  }

  // ---- staging (cp.async groups): raw(h) = keys, queries, draft values, window g; u(h) = u window ----
  // Each thread copies one 16-byte chunk column of every row (chunk tid % chunks of rows tid / chunks,
  // + threads / chunks, ...): no per-thread index tables that the compiler would keep across v-heads.
  auto stage_raw = [&](int hv, int64_t slot, int64_t row, int w) {
    const int kh = hv / group;
    constexpr int kKC = kK / 8, kVC = kV / 8;  // 16-byte chunks of a key / value row
    const int kc = tid % kKC, vc = tid % kVC;
    const Act* kb = static_cast<const Act*>(c.k_buf) + slot * c.kb_slot_stride + kh * c.kb_head_stride + kc * 8;
    for (int j = tid / kKC; j < w; j += kFoldThreads / kKC) cp_async16(sm.k_raw() + j * kK + kc * 8, kb + j * c.kb_entry_stride);
    const Act* kin = static_cast<const Act*>(tk.k) + row * tk.k_row_stride + kh * tk.k_head_stride + kc * 8;
    const Act* qin = static_cast<const Act*>(tk.q) + row * tk.q_row_stride + kh * tk.q_head_stride + kc * 8;
    for (int d = tid / kKC; d < T; d += kFoldThreads / kKC) {
      cp_async16(sm.k_raw() + (w + d) * kK + kc * 8, kin + d * tk.k_token_stride);
      cp_async16(sm.q_raw() + d * kK + kc * 8, qin + d * tk.q_token_stride);
    }
    const Act* vin = static_cast<const Act*>(tk.v) + row * tk.v_row_stride + hv * tk.v_head_stride + vc * 8;
    for (int d = tid / kVC; d < T; d += kFoldThreads / kVC) cp_async16(sm.v_raw() + d * kV + vc * 8, vin + d * tk.v_token_stride);
    if constexpr (kVectorGate) {
      constexpr int kGC = kK / 4;
      const int gc = tid % kGC;
      const float* gb = c.g_buf + slot * c.gb_slot_stride + hv * c.gb_head_stride + gc * 4;
      for (int j = tid / kGC; j < w; j += kFoldThreads / kGC) cp_async16(sm.g_raw() + j * kK + gc * 4, gb + j * p.kda.gb_entry_stride);
    } else {
      if (tid < w) cp_async4(sm.g_raw() + tid, c.g_buf + slot * c.gb_slot_stride + hv * c.gb_head_stride + tid);
    }
    cp_async_commit();
  };
  auto stage_u = [&](int hv, int64_t slot, int w) {
    constexpr int kUC = kV / 4;
    const int uc = tid % kUC;
    const float* ub = c.u_buf + slot * c.ub_slot_stride + hv * c.ub_head_stride + uc * 4;
    for (int j = tid / kUC; j < w; j += kFoldThreads / kUC) cp_async16(sm.uw() + j * kV + uc * 4, ub + j * c.ub_entry_stride);
    cp_async_commit();
  };
  __syncthreads();  // the context is written
  stage_raw(head0, slot, row, w);
  stage_u(head0, slot, w);

  int stage = 0;
  uint32_t phase = 0;
  for (int hi = 0; hi < nh; ++hi) {
    const int hv = head0 + hi, kh = hv / group;
    const int64_t slot = sm.context()[0], row = sm.context()[1];
    const int w = static_cast<int>(sm.context()[2]), E = w + T;  // E: window entries
    if (hi > 0) {
      __syncthreads();  // the last v-head's P3 is done with the u window
      stage_u(hv, slot, w);
    }

    // ---- P1: keys, queries, gates, Lambda, appends; then the coefficients ----
    cp_async_wait<1>();  // raw(hv); u(hv) may still be in flight
    __syncthreads();
    if constexpr (kVectorGate) {  // the drafts' K log decays and beta (appended)
      const float A_log = __ldg(tk.A_log + hv);
      const float* dt_bias = tk.dt_bias + hv * p.kda.dt_bias_head_stride;
      for (int idx = tid; idx < T * kK; idx += kFoldThreads) {
        const int d = idx / kK, ch = idx % kK;
        const int64_t ai = row * tk.a_row_stride + d * tk.a_token_stride + hv * tk.a_head_stride + ch * p.kda.a_channel_stride;
        const float g = log_decay(load_gate_input(tk.a, tk.a_dtype, ai), A_log, __ldg(dt_bias + ch));
        sm.g_raw()[(w + d) * kK + ch] = g;
        c.g_buf[slot * c.gb_slot_stride + hv * c.gb_head_stride + (w + d) * p.kda.gb_entry_stride + ch] = g;
      }
      if (warp == kWarps - 1 && lane < T) {
        const int64_t bi = row * tk.b_row_stride + lane * tk.b_token_stride + hv * tk.b_head_stride;
        const float beta = beta_gate(load_gate_input(tk.b, tk.b_dtype, bi));
        sm.draft(1)[lane] = beta;
        c.beta_buf[slot * c.bb_slot_stride + hv * c.bb_head_stride + w + lane] = beta;
      }
    } else if (warp == kWarps - 1) {  // the drafts' gates (appended), then e^{Lambda_t} from prefix sums of g
      if (lane < T) {
        const int64_t ai = row * tk.a_row_stride + lane * tk.a_token_stride + hv * tk.a_head_stride;
        const int64_t bi = row * tk.b_row_stride + lane * tk.b_token_stride + hv * tk.b_head_stride;
        const float g = log_decay(load_gate_input(tk.a, tk.a_dtype, ai), __ldg(tk.A_log + hv), __ldg(tk.dt_bias + hv));
        const float beta = beta_gate(load_gate_input(tk.b, tk.b_dtype, bi));
        sm.g_raw()[w + lane] = g;
        sm.draft(1)[lane] = beta;
        c.g_buf[slot * c.gb_slot_stride + hv * c.gb_head_stride + w + lane] = g;
        c.beta_buf[slot * c.bb_slot_stride + hv * c.bb_head_stride + w + lane] = beta;
      }
      __syncwarp();
      const float p0 = warp_inclusive_sum(lane < E ? sm.g_raw()[lane] : 0.0f);
      const float p1 = warp_inclusive_sum(lane + 32 < E ? sm.g_raw()[lane + 32] : 0.0f) + __shfl_sync(kFullMask, p0, 31);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = lane + 32 * h;
        if (j >= w && j < E) sm.draft(0)[j - w] = expf(h == 0 ? p0 : p1);
      }
    }
    const float scale = static_cast<float>(tk.scale);
    for (int e = warp; e < E + T; e += kWarps) {
      if (e < E) {
        normalize_key<kK, kAct>(sm.k_raw() + e * kK, sm.kn() + e * kK, tk.use_qk_l2norm);
      } else {
        normalize_key<kK, kAct>(sm.q_raw() + (e - E) * kK, sm.qn() + (e - E) * kK, tk.use_qk_l2norm, scale);
      }
    }
    for (int i = tid; i < T * kV; i += kFoldThreads) sm.vd()[i] = to_float(sm.v_raw()[i]);
    if constexpr (kMmaRows) {
      if (use_mma) {  // the drafts' raw keys and queries as B words, and what turns their dots into S kn, S qn
        constexpr int kPer = kK / 32;
        for (int vi = warp; vi < 2 * Layout::padded_drafts(T); vi += kWarps) {
          const int i = vi / 2;
          const bool query = (vi & 1) != 0;
          float x[kPer];
          if (i < T) {
            const Act* raw = query ? sm.q_raw() + i * kK : sm.k_raw() + (w + i) * kK;
#pragma unroll
            for (int e = 0; e < kPer; ++e) x[e] = to_float(raw[lane * kPer + e]);
          } else {
#pragma unroll
            for (int e = 0; e < kPer; ++e) x[e] = 0.0f;  // the n-tile's unused columns
          }
          float ss = 0.0f, amax = 0.0f;
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            ss = fmaf(x[e], x[e], ss);
            amax = fmaxf(amax, fabsf(x[e]));
          }
          const float inv = key_scale(row_sum<32>(ss), tk.use_qk_l2norm);  // normalize_key's
          float b_scale = 1.0f, b_unscale = 1.0f;
          if constexpr (Mma::kScaleB) {
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
            const F16RangeScale range(amax);
            b_scale = range.scale, b_unscale = range.unscale;
          }
          uint32_t* words = sm.rows_b() + vi * Layout::kMmaVecWords;
#pragma unroll
          for (int e = 0; e < kPer; e += 2) words[Mma::word_of(lane * kPer + e)] = Mma::pack(x[e] * b_scale, x[e + 1] * b_scale);
          if (lane == 0) sm.rows_mul()[vi] = (query ? inv * scale : inv) * b_unscale;
        }
      }
    }
    {  // the drafts' raw k (the k-head's first v-head) and v into the buffers at w ..
      constexpr int kKC = kK / 8, kVC = kV / 8;
      if (hv % group == 0) {
        const int kc = tid % kKC;
        Act* kb = static_cast<Act*>(c.k_buf) + slot * c.kb_slot_stride + kh * c.kb_head_stride + kc * 8;
        for (int d = tid / kKC; d < T; d += kFoldThreads / kKC) {
          *reinterpret_cast<uint4*>(kb + (w + d) * c.kb_entry_stride) = *reinterpret_cast<const uint4*>(sm.k_raw() + (w + d) * kK + kc * 8);
        }
      }
      const int vc = tid % kVC;
      Act* vb = static_cast<Act*>(c.v_buf) + slot * c.vb_slot_stride + hv * c.vb_head_stride + vc * 8;
      for (int d = tid / kVC; d < T; d += kFoldThreads / kVC) {
        *reinterpret_cast<uint4*>(vb + (w + d) * c.vb_entry_stride) = *reinterpret_cast<const uint4*>(sm.v_raw() + d * kV + vc * 8);
      }
    }
    float row_scale = 1.0f;  // fp8: the read copy's scale of row tid
    if constexpr (kSrc == DType::kFloat8E4M3) {
      if (tid < kV) row_scale = __ldg(c.read_scale + slot * c.rs_slot_stride + hv * c.rs_head_stride + tid);
    }
    __syncthreads();
    if constexpr (kVectorGate) {
      // A thread per channel: the window keys kd_j = kn_j o e^{Lambda_{w-1} - Lambda_j} (in place), and
      // e^{Lambda_t} of every draft.
      for (int ch = tid; ch < kK; ch += kFoldThreads) {
        float after = 0.0f;  // g_{j+1} + .. + g_{w-1}
        for (int j = w - 1; j >= 0; --j) {
          sm.kn()[j * kK + ch] *= expf(after);
          after += sm.g_raw()[j * kK + ch];
        }
        for (int i = 0; i < T; ++i) {
          after += sm.g_raw()[(w + i) * kK + ch];
          sm.elam()[i * kK + ch] = expf(after);
        }
      }
      __syncthreads();
      constexpr int kPer = kK / 32;
      for (int i = warp; i < T; i += kWarps) {
        const int t = w + i;
        float kt[kPer], qi[kPer], acc[kPer];
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          kt[e] = sm.kn()[t * kK + lane * kPer + e];
          qi[e] = sm.qn()[i * kK + lane * kPer + e];
          acc[e] = 0.0f;
        }
        for (int j = t; j >= w; --j) {  // the drafts: exp(g_{j+1} + .. + g_t) per channel
          float du = 0.0f, dq = 0.0f;
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            if (j < t) acc[e] += sm.g_raw()[(j + 1) * kK + lane * kPer + e];
            const float kj = sm.kn()[j * kK + lane * kPer + e] * expf(acc[e]);
            du = fmaf(kj, kt[e], du);
            dq = fmaf(kj, qi[e], dq);
          }
          du = row_sum<32>(du);
          dq = row_sum<32>(dq);
          if (lane == (j & 31)) sm.coef()[i * L + j] = make_float2(j < t ? du : 0.0f, dq);
        }
#pragma unroll
        for (int e = 0; e < kPer; ++e) {  // the pivot exp(g_w + .. + g_t)
          const float pivot = expf(acc[e] + sm.g_raw()[w * kK + lane * kPer + e]);
          kt[e] *= pivot;
          qi[e] *= pivot;
        }
        for (int j = 0; j < w; ++j) {  // the window, kd_j
          float du = 0.0f, dq = 0.0f;
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            const float kj = sm.kn()[j * kK + lane * kPer + e];
            du = fmaf(kj, kt[e], du);
            dq = fmaf(kj, qi[e], dq);
          }
          du = row_sum<32>(du);
          dq = row_sum<32>(dq);
          if (lane == (j & 31)) sm.coef()[i * L + j] = make_float2(du, dq);
        }
      }
    } else {  // coefficients of draft i (t = w + i): decay_tj (kn_j . kn_t) for j < t (0 at j = t), decay_tj
       // (kn_j . qn_i) for j <= t; decay_tj = e^{Lambda_t - Lambda_j} = exp(g_{j+1} + ... + g_t) from
       // suffix sums (fold.cuh's suffix_after), lane j & 31 storing entry j
      constexpr int kPer = kK / 32;
      for (int i = warp; i < T; i += kWarps) {
        const int t = w + i;
        float kt[kPer], qi[kPer];
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          kt[e] = sm.kn()[t * kK + lane * kPer + e];
          qi[e] = sm.qn()[i * kK + lane * kPer + e];
        }
        float after0, after1, total;
        suffix_after(lane <= t ? sm.g_raw()[lane] : 0.0f, lane + 32 <= t ? sm.g_raw()[lane + 32] : 0.0f, after0, after1, total);
        const float e0 = expf(after0), e1 = expf(after1);
        for (int j = 0; j <= t; ++j) {
          float du = 0.0f, dq = 0.0f;
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            const float kj = sm.kn()[j * kK + lane * kPer + e];
            du = fmaf(kj, kt[e], du);
            dq = fmaf(kj, qi[e], dq);
          }
          du = row_sum<32>(du);
          dq = row_sum<32>(dq);
          if (lane == (j & 31)) {
            const float decay = j < 32 ? e0 : e1;
            sm.coef()[i * L + j] = make_float2(j < t ? decay * du : 0.0f, decay * dq);
          }
        }
      }
    }
    __syncthreads();  // the raw area is free: the next v-head's keys, queries and values go out
    if constexpr (kVectorGate) {  // the drafts' keys and queries decayed by e^{Lambda_t} for P2's dots
      for (int idx = tid; idx < T * kK; idx += kFoldThreads) {
        const float e = sm.elam()[idx];
        sm.kn()[w * kK + idx] *= e;
        sm.qn()[idx] *= e;
      }
    }
    if (hi + 1 < nh) {
      stage_raw(hv + 1, slot, row, w);
    } else {
      cp_async_commit();  // an empty group keeps the wait counts uniform
    }

    // ---- P2: the tile, and 2T dot products per state row ----
    if (use_mma) {
      // On tensor cores straight from the stage: a warp per 16 rows, an n-tile per 4 drafts (column
      // 2c of lane c's quad: draft 4 j + c's key, 2c + 1 its query).
      mbarrier_wait(sm.full(stage), phase);
      if (warp < kV / 16) {
        const int g = lane >> 2, quad_lane = lane & 3;
        const int v = 16 * warp + g;
#pragma unroll 1
        for (int j = 0; j < Layout::padded_drafts(T) / 4; ++j) {
          float acc[4];
          Mma::dot_words(sm.tile(stage) + 16 * warp * Mma::kRowBytes,
                         sm.rows_b() + (8 * j + g) * Layout::kMmaVecWords + quad_lane * Mma::kStride, acc);
          const int i = 4 * j + quad_lane;
          if (i < T) {
            const float km = sm.rows_mul()[2 * i], qm = sm.rows_mul()[2 * i + 1];
            sm.A()[i * kV + v] = acc[0] * km;
            sm.B()[i * kV + v] = acc[1] * qm;
            sm.A()[i * kV + v + 8] = acc[2] * km;
            sm.B()[i * kV + v + 8] = acc[3] * qm;
          }
        }
      }
      __syncthreads();  // every warp is done with the stage: it may be refilled
      if (producer && hi + S < nh) issue_tile(slot, hv + S, stage);
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }
    } else {
      TileFrag<kK, kV> f;
      mbarrier_wait(sm.full(stage), phase);
      load_tile_shared<kK, kV, kSrc>(f, sm.tile(stage));
      __syncthreads();  // every thread has its part of the tile: the stage may be refilled
      if (producer && hi + S < nh) issue_tile(slot, hv + S, stage);
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }
      const int dot_row = M::row(M::dot_row());
#pragma unroll 1
      for (int i = 0; i < T; ++i) {
        const float a = rows_dot<kK, kV>(f, sm.kn() + (w + i) * kK);
        const float b = rows_dot<kK, kV>(f, sm.qn() + i * kK);
        if (M::dot_writer()) {
          sm.A()[i * kV + dot_row] = a;
          sm.B()[i * kV + dot_row] = b;
        }
      }
    }
    cp_async_wait<1>();  // u(hv); raw(hv + 1) may still be in flight
    __syncthreads();

    // ---- P3: forward substitution and outputs, a thread per state row ----
    if (tid < kV) {
      const int v = tid;
      float* uw = sm.uw();
      float* u_out = c.u_buf + slot * c.ub_slot_stride + hv * c.ub_head_stride + v;
      for (int i = 0; i < T; ++i) {
        const int t = w + i;
        const float alpha = kVectorGate ? 1.0f : sm.draft(0)[i];  // KDA: in P2's dots
        const float2* cf = sm.coef() + i * L;
        float acc_u = fmaf(-alpha, sm.A()[i * kV + v] * row_scale, sm.vd()[i * kV + v]);
        float acc_o = alpha * (sm.B()[i * kV + v] * row_scale);
        for (int j = 0; j < t; ++j) {
          const float uj = uw[j * kV + v];
          const float2 cj = cf[j];
          acc_u = fmaf(-cj.x, uj, acc_u);
          acc_o = fmaf(cj.y, uj, acc_o);
        }
        const float u = sm.draft(1)[i] * acc_u;
        uw[t * kV + v] = u;
        u_out[t * c.ub_entry_stride] = u;
        acc_o = fmaf(cf[t].y, u, acc_o);
        store_act<kAct>(tk.out, row * tk.out_row_stride + i * tk.out_token_stride + hv * tk.out_head_stride + v, acc_o);
      }
    }
  }
}

}  // namespace gdn
}  // namespace replayssm
