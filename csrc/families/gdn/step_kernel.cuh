// The ReplaySSM Gated DeltaNet step (T = 1): output from the checkpoint (or read copy) + buffer +
// token, append, and the fold where the buffer fills, in one launch. Semantics: reference.delta_step.
//
// With the buffer holding entries 0 .. w-1 since the checkpoint S_c and the token at position t = w,
// Lambda_j the cumulative log decay up to entry j, k_hat / q_hat the normalised key / query:
//   S' k_t = e^{Lambda_t} (S_c k_hat_t) + sum_{j<t} u_j e^{Lambda_t - Lambda_j} (k_hat_j . k_hat_t)
//   u_t    = beta_t (v_t - S' k_t)
//   o_t    = e^{Lambda_t} (S_c q_hat_t) + sum_{j<t} u_j e^{Lambda_t - Lambda_j} (k_hat_j . q_hat_t)
//            + u_t (k_hat_t . q_hat_t)
// so one pass over S_c (two dot products a row: the decay is a scalar per v-head) and O(w (K + V))
// window work give u_t and o_t. The entry (raw k, v; g, beta; u_t in fp32) is appended at w.
// A step with w + 1 + max_draft_tokens > L folds instead (cache/cursor.cuh): every CTA of the slot
// folds its heads with the family's fold routine (fold.cuh's Fold::head), the token as the last entry,
// and takes the output from the folded full-precision state; the cursor goes to 0. The fold computes
// the token's u from the checkpoint itself (and, with a read copy, every u_j), so a folding CTA does
// not replay.
//
// Byte model per (row, v-head), s = source bytes (checkpoint or read copy), a = activation bytes,
// w = the cursor, G = HV / H:
//   replay: V K s read (+ 4 V fp8 scales) + w (4 V + 4 + K a / G) read (tile, u window, g, keys shared
//           by the k-head's G v-heads), V (4 + 2 a) + 8 + K a / G written (u, v, out, g, beta, key)
//   fold:   the tiles the CTA requested before it knew the cursor (with a read copy read and not used,
//           at most the ring's), the checkpoint read and written (2 V K s_ck), the window's k, v
//           (copy) or u (none), g, beta, and the copy written (V K s_rc, + 4 V scales for fp8)
// A cycle is L - max_draft_tokens replays and one fold; the conventional update moves 2 V K s_ck a
// step. qwen4b, fp32 checkpoint, L = 16: ~69 KB a replay, ~140 KB a fold, the cycle 1.74x under 16
// updates (bf16 copy ~2.7x, fp8 copy ~4.2x).
//
// The replay is latency-bound (a replay reads half the update's bytes or less), so a CTA of 256 threads
// takes a block of `heads` v-heads of one row (launch/gdn_policy.h chooses how many) and keeps its
// source tiles streaming:
//   - a ring of `stages` stages in dynamic shared memory, each a chunk of about 16 KB of a tile's rows
//     (whole passes of the row mapping, tile.cuh), filled by bulk copies (TMA) on one mbarrier each; the
//     first stages are requested before the cursor is known (they depend only on the slot), and a stage
//     is refilled with the chunk `stages` chunks on as soon as the CTA barrier after its use has passed;
//   - what only depends on the row and the block is taken once: the slot, the cursor and the ticket
//     (one per CTA), the normalised q and k of each k-head of the block and the gates of each v-head
//     (before the cursor, while thread 0 waits for it), then the window's decays of every v-head and
//     the window keys' dot products of every k-head (after the cursor, in one round trip);
//   - the next head's u window (in registers), value and fp8 row scales are loaded before this head's
//     rows, so they come in while the rows are reduced.
// Per head: 1. the window terms sum_j e^{Lambda_t - Lambda_j} (k_hat_j . x) u_j[v] (x = k_hat, q_hat), a
// value channel per thread, in slices; 2. the rows, chunk after chunk from the ring (8 lanes a row,
// tile.cuh): the two dots, then lane 0 of the row forms u_t and o_t; 3. coalesced stores of out and the
// entry. The last CTA of the slot (the last ticket) writes the cursor at its end.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cache/cursor.cuh"
#include "cache/slot_map.cuh"
#include "common/bulk_copy.cuh"
#include "common/reduce.cuh"
#include "families/gdn/fold.cuh"
#include "families/gdn/gates.cuh"
#include "families/gdn/params.h"
#include "families/gdn/tile.cuh"

namespace replayssm {
namespace gdn {

constexpr int kStepThreads = 256;

template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct>
struct StepTraits {
  static constexpr DType kSrc = kCopy ? kRead : kCkpt;  // what the replay reads
  using Lanes = RowLanes<kK, kSrc, kStepThreads>;
  using FoldHead = Fold<kK, kV, kCkpt, kCopy, kRead, kAct>;
  static constexpr int kPassRows = Lanes::kRowsPerPass;  // rows the CTA covers in one pass
  static constexpr int kRows = kV / kPassRows;            // passes over a whole tile (rows a thread)
  static constexpr int kRowBytes = kK * dtype_size(kSrc);
  // A ring stage: whole passes, about 16 KB (one pass of an fp32 row of 128, a whole fp8 tile of 128 x 128).
  static constexpr int kWantPasses = 16 * 1024 / (kPassRows * kRowBytes);
  static constexpr int kStagePasses = kWantPasses < 1 ? 1 : (kWantPasses > kRows ? kRows : kWantPasses);
  static constexpr int kStageRows = kStagePasses * kPassRows;
  static constexpr int kStageBytes = kStageRows * kRowBytes;
  static constexpr int kChunks = kV / kStageRows;  // stages a tile fills
  // About 64 KB of ring, as Mamba-2's step: with three CTAs an SM, 48 KB or more of each CTA's in flight
  // while it reduces a stage.
  static constexpr int kWantStages = 64 * 1024 / kStageBytes;
  static constexpr int kMaxStages = kWantStages < 1 ? 1 : (kWantStages > 8 ? 8 : kWantStages);
  // The window terms: thread t sums entries slice, slice + kSlices, ... of value channel t % V.
  static constexpr int kSlices = kStepThreads / kV;
  // u_j[v] loads a thread issues a head ahead: a window of up to 8 kSlices entries (16 at V = 128, 32
  // at V = 64) in one round trip; longer windows load the rest in batches when the head comes.
  static constexpr int kWindowBatch = 8;
  // The window keys' dots: 8 lanes a (k-head, entry) pair, 16-byte loads of the activation, two pairs a
  // group of lanes at once (one round trip for up to 64 pairs).
  static constexpr int kEntryLanes = 8;
  static constexpr int kKeyPerLane = kK / kEntryLanes;
  static constexpr int kKeyChunks = kKeyPerLane / 8;
  static constexpr int kPairsPerPass = kStepThreads / kEntryLanes;
  static_assert(kV % kPassRows == 0 && kV % kStageRows == 0, "a tile is whole stages of whole passes");
  static_assert(kStageBytes % 16 == 0, "stages keep the ring 16-byte aligned");
  static_assert(kStepThreads % kV == 0 && kV <= kStepThreads, "the window terms take whole value channels");
  static_assert(kKeyPerLane % 8 == 0, "window keys move in 16-byte chunks");
  static_assert(FoldHead::kThreads == kStepThreads, "the fold routine (fold.cuh) is written for the step's CTA");
  // Three CTAs an SM (80 registers): the ring (64 KB) and the block's arrays leave room for three, and
  // the replay fits 80 registers. The fused fold over the block's heads still spills a few of its
  // loop-invariant addresses at K = 128 (ptxas -v, sm_90a: 0 bytes at 64 x 64, up to 8 at 64 x 128, 28 at
  // 128 x 64, 84 at 128 x 128, mostly in the folding path).
  static constexpr int kMinCtasPerSm = 3;
};

// Dynamic shared memory of a step CTA: the ring's barriers; the block's arrays (q_hat, k_hat of each
// k-head, the window keys' dots per k-head, k_hat . q_hat per k-head; the window's decays, e^{Lambda_t},
// g and beta per v-head); then the ring, which a folding CTA's fold workspace (fold.cuh) reuses.
// k-heads: an upper bound of the k-heads a block of `heads` v-heads spans (step_k_heads).
template <int kK>
struct StepLayout {
  static constexpr size_t kBarrierBytes = 128;  // up to 16 barriers
  __host__ __device__ static constexpr size_t a16(size_t b) { return (b + 15) / 16 * 16; }
  __host__ __device__ static constexpr size_t qn(int) { return kBarrierBytes; }
  __host__ __device__ static constexpr size_t kn(int kh) { return qn(kh) + 4 * static_cast<size_t>(kh) * kK; }
  __host__ __device__ static constexpr size_t kdot(int kh) { return kn(kh) + 4 * static_cast<size_t>(kh) * kK; }
  __host__ __device__ static constexpr size_t qdot(int kh, int L) { return kdot(kh) + a16(4 * static_cast<size_t>(kh) * L); }
  __host__ __device__ static constexpr size_t kq(int kh, int L) { return qdot(kh, L) + a16(4 * static_cast<size_t>(kh) * L); }
  __host__ __device__ static constexpr size_t rel(int kh, int L) { return kq(kh, L) + a16(4 * static_cast<size_t>(kh)); }
  __host__ __device__ static constexpr size_t head_scalars(int heads, int kh, int L) {
    return rel(kh, L) + a16(4 * static_cast<size_t>(heads) * L);
  }
  // decay, g, beta: [heads] each
  __host__ __device__ static constexpr size_t ring(int heads, int kh, int L) {
    return (head_scalars(heads, kh, L) + 3 * a16(4 * static_cast<size_t>(heads)) + 127) / 128 * 128;
  }
  // The whole: the ring (stages x stage_bytes) or the fold's workspace over it, whichever is larger.
  __host__ __device__ static constexpr size_t bytes(int stages, size_t stage_bytes, size_t fold_bytes, int heads, int kh,
                                                    int L) {
    return ring(heads, kh, L) + (stages * stage_bytes > fold_bytes ? stages * stage_bytes : fold_bytes);
  }
};

// The k-heads a block of `heads` consecutive v-heads (starting at a multiple of `heads`) can span,
// `group` v-heads a k-head: heads / group where the blocks are whole k-heads, one where a k-head is
// whole blocks, else at most one more than heads / group rounded up (and at most `heads`).
__host__ __device__ constexpr int step_k_heads(int heads, int group) {
  if (heads % group == 0) return heads / group;
  if (group % heads == 0) return 1;
  const int span = (heads + group - 2) / group + 1;
  return span < heads ? span : heads;
}

template <int kV, int kSlices>
struct StepShared {
  float wk[kSlices][kV], wq[kSlices][kV];  // the window terms' partial sums
  float v[kV];         // the token's value
  float scale[kV];     // the fp8 read copy's row scales
  float u[kV], o[kV];  // u_t and the output, per value channel
  int64_t slot;        // -1: the row touches nothing
  int32_t w;           // the cursor
  // Read back by a folding CTA rather than held in registers across its fold (below).
  int32_t heads;       // v-heads of the CTA
  int32_t ticket;      // thread 0's ticket
};

template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct>
__global__ void __launch_bounds__(kStepThreads, (StepTraits<kK, kV, kCkpt, kCopy, kRead, kAct>::kMinCtasPerSm))
    step_kernel(const GdnParams p, const int heads, const int stages) {
  using Traits = StepTraits<kK, kV, kCkpt, kCopy, kRead, kAct>;
  using Lanes = typename Traits::Lanes;
  using Layout = StepLayout<kK>;
  using Act = typename Storage<kAct>::type;
  constexpr DType kSrc = Traits::kSrc;
  constexpr int kSlices = Traits::kSlices;
  constexpr int kChunks = Traits::kChunks;
  constexpr bool kScaled = kCopy && kRead == DType::kFloat8E4M3;
  extern __shared__ __align__(128) unsigned char dyn[];
  __shared__ StepShared<kV, kSlices> sh;

  const GdnCache& c = p.cache;
  const GdnTokens& tk = p.tokens;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row = blockIdx.y;
  const int head0 = blockIdx.x * heads;
  const int group = p.v_heads / p.heads;  // v-heads a k-head
  const int kh0 = head0 / group;          // the block's first k-head
  const int nk = (head0 + heads - 1) / group - kh0 + 1;
  const int L = c.buffer_len;
  const int S = stages;
  const int kh_cap = step_k_heads(heads, group);

  // The block's arrays (StepLayout).
  float* const qn = reinterpret_cast<float*>(dyn + Layout::qn(kh_cap));  // [k-head][K]: q_hat (scaled)
  float* const kn = reinterpret_cast<float*>(dyn + Layout::kn(kh_cap));  // [k-head][K]: k_hat
  float* const kdot = reinterpret_cast<float*>(dyn + Layout::kdot(kh_cap));         // [k-head][L]: k_hat_j . k_hat_t
  float* const qdot = reinterpret_cast<float*>(dyn + Layout::qdot(kh_cap, L));      // [k-head][L]: k_hat_j . q_hat_t
  float* const kq = reinterpret_cast<float*>(dyn + Layout::kq(kh_cap, L));          // [k-head]: k_hat_t . q_hat_t
  float* const rel = reinterpret_cast<float*>(dyn + Layout::rel(kh_cap, L));        // [head][L]: e^{Lambda_t - Lambda_j}
  float* const decay = reinterpret_cast<float*>(dyn + Layout::head_scalars(heads, kh_cap, L));  // [head]: e^{Lambda_t}
  float* const gate_g = decay + (Layout::a16(4 * static_cast<size_t>(heads)) / 4);              // [head]: g
  float* const gate_beta = gate_g + (Layout::a16(4 * static_cast<size_t>(heads)) / 4);          // [head]: beta
  unsigned char* const ring = dyn + Layout::ring(heads, kh_cap, L);
  uint64_t* const full = reinterpret_cast<uint64_t*>(dyn);

  const unsigned char* src = static_cast<const unsigned char*>(kCopy ? c.read_copy : c.checkpoint);
  const int64_t src_slot = kCopy ? c.rc_slot_stride : c.ck_slot_stride;
  const int64_t src_head = kCopy ? c.rc_head_stride : c.ck_head_stride;
  const int64_t src_row = kCopy ? c.rc_row_stride : c.ck_row_stride;
  const int total_chunks = heads * kChunks;
  const int first_chunks = total_chunks < S ? total_chunks : S;
  // Chunk `seq` of the block (head seq / kChunks, rows (seq % kChunks) kStageRows ..) into `stage`.
  auto issue_chunk = [&](int64_t slot, int seq, int stage) {
    const int head = head0 + seq / kChunks;
    const int64_t at = slot * src_slot + head * src_head + static_cast<int64_t>(seq % kChunks) * Traits::kStageRows * src_row;
    fence_proxy_async();  // a refilled stage was last read by ordinary loads, before a CTA barrier
    bulk_copy_tile_to_shared<Traits::kStageRows, Traits::kRowBytes>(
        ring + static_cast<size_t>(stage) * Traits::kStageBytes, src + at * dtype_size(kSrc), src_row * dtype_size(kSrc),
        full + stage);
  };
  auto v_at = [&](int i) { return row * tk.v_row_stride + (head0 + i) * tk.v_head_stride; };

  // ---- 1. before the cursor: slot, the first chunks, the cursor and the ticket (thread 0); the
  // token's q_hat, k_hat per k-head and gates per v-head (warps 1..7); the first head's value ----
  Act v_raw = Act{};  // threads t < V: the value of the head at hand, as stored
  if (tid < kV) v_raw = static_cast<const Act*>(tk.v)[v_at(0) + tid];
  int32_t ticket = 0;  // thread 0: the cursor word as its atomic found it (the tickets drawn before)
  if (tid == 0) {
    const int64_t slot = resolve_slot(p, row);
    int32_t w = -1;
    if (slot >= 0) {
      for (int s = 0; s < S; ++s) mbarrier_init(full + s, 1);
      fence_barrier_init();
      for (int s = 0; s < first_chunks; ++s) issue_chunk(slot, s, s);
      // Only this thread reads the cursor, so the CTA may take its ticket at once; the atomic's answer
      // is needed only at the end. A cursor with no room (w >= L, whatever its high bits) takes no
      // ticket and is left as it is.
      w = __ldcg(c.num_committed + slot) & kCursorMask;
      if (w < L) ticket = atomicAdd(c.num_committed + slot, kTicket);
    }
    sh.slot = slot;
    sh.w = w;
    sh.ticket = ticket;
    sh.heads = heads;
  }
  if (warp >= 1) {
    if (tid - 32 < heads) {  // the gates of head tid - 32
      const int hv = head0 + tid - 32;
      const float a = load_gate_input(tk.a, tk.a_dtype, row * tk.a_row_stride + hv * tk.a_head_stride);
      const float b = load_gate_input(tk.b, tk.b_dtype, row * tk.b_row_stride + hv * tk.b_head_stride);
      gate_g[tid - 32] = log_decay(a, __ldg(tk.A_log + hv), __ldg(tk.dt_bias + hv));
      gate_beta[tid - 32] = beta_gate(b);
    }
    // q_hat, k_hat and k_hat . q_hat of k-head kh0 + kk, a warp each
    constexpr int kPer = kK / 32;
    for (int kk = warp - 1; kk < nk; kk += kStepThreads / 32 - 1) {
      const int h = kh0 + kk;
      const int64_t k_at = row * tk.k_row_stride + h * tk.k_head_stride + lane * kPer;
      const int64_t q_at = row * tk.q_row_stride + h * tk.q_head_stride + lane * kPer;
      float kf[kPer], qf[kPer];
      float ss_k = 0.0f, ss_q = 0.0f, dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        kf[e] = load_act<kAct>(tk.k, k_at + e);
        qf[e] = load_act<kAct>(tk.q, q_at + e);
        ss_k += kf[e] * kf[e];
        ss_q += qf[e] * qf[e];
        dot += kf[e] * qf[e];
      }
      ss_k = row_sum<32>(ss_k);
      ss_q = row_sum<32>(ss_q);
      dot = row_sum<32>(dot);
      const float rk = key_scale(ss_k, tk.use_qk_l2norm);
      const float rq = key_scale(ss_q, tk.use_qk_l2norm) * tk.scale;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        kn[kk * kK + lane * kPer + e] = kf[e] * rk;
        qn[kk * kK + lane * kPer + e] = qf[e] * rq;
      }
      if (lane == 0) kq[kk] = dot * rk * rq;
    }
  }
  __syncthreads();  // the slot, cursor, barriers, keys and gates

  const int64_t slot = sh.slot;
  const int w = sh.w;
  auto zero_outputs = [&] {
    for (int i = 0; i < heads; ++i) {
      for (int t = tid; t < kV; t += kStepThreads) store_act<kAct>(tk.out, row * tk.out_row_stride + (head0 + i) * tk.out_head_stride + t, 0.0f);
    }
  };
  if (slot < 0) {  // touches nothing, zero output
    zero_outputs();
    return;
  }
  if (w >= L) {  // a cursor with no room: nothing touched, zero output
    if (tid == 0) {
      for (int s = 0; s < first_chunks; ++s) mbarrier_wait(full + s, 0);  // no copy outlives the CTA
    }
    zero_outputs();
    return;
  }
  // The CTA that drew the slot's last ticket writes its cursor (which clears the tickets); the slot has
  // gridDim.x CTAs, one per block of its v-heads.
  auto move_cursor = [&](int32_t to) {
    if (threadIdx.x == 0 && (*reinterpret_cast<volatile int32_t*>(&sh.ticket) >> 16) == static_cast<int>(gridDim.x) - 1) {
      p.cache.num_committed[*reinterpret_cast<volatile int64_t*>(&sh.slot)] = to;
    }
  };

  if (folds_after_append(w, c.max_draft_tokens, L)) {
    // ---- the fold: the buffer's w entries and the token, head after head; the output from the folded
    // state. Every u_j from the checkpoint with a read copy; without one the buffer's came from it
    // already and only the token's is computed, by the fold itself (so a folding CTA replays nothing).
    for (int s = 0; s < first_chunks; ++s) mbarrier_wait(full + s, 0);  // the fold's workspace overlaps the ring
    // Only the head's index lives in a register across the heads: everything else the fold takes is
    // read again at each head from shared memory (volatile, so that it is not kept), the kernel's
    // parameters or blockIdx. Held across the loop over the heads, the block's sizes and pointers made
    // ptxas spill in the fold's passes (it still spills a few of the fold's own loop-invariant addresses
    // at K = 128).
#pragma unroll 1
    for (int i = 0; i < *reinterpret_cast<volatile int32_t*>(&sh.heads); ++i) {
      const int heads = *reinterpret_cast<volatile int32_t*>(&sh.heads);
      const int64_t fslot = *reinterpret_cast<volatile int64_t*>(&sh.slot);
      const int fw = *reinterpret_cast<volatile int32_t*>(&sh.w);
      const int fgroup = p.v_heads / p.heads;
      const int hv = static_cast<int>(blockIdx.x) * heads + i;
      const int h = hv / fgroup;
      const int fkh = step_k_heads(heads, fgroup);
      const int fL = p.cache.buffer_len;
      const float* fg = reinterpret_cast<const float*>(dyn + Layout::head_scalars(heads, fkh, fL)) + Layout::a16(4 * static_cast<size_t>(heads)) / 4;
      FoldTail tail;
      tail.k = static_cast<const unsigned char*>(p.tokens.k) + (blockIdx.y * p.tokens.k_row_stride + h * p.tokens.k_head_stride) * dtype_size(kAct);
      tail.v = static_cast<const unsigned char*>(p.tokens.v) + (blockIdx.y * p.tokens.v_row_stride + hv * p.tokens.v_head_stride) * dtype_size(kAct);
      tail.g = fg[i];
      tail.beta = fg[i + Layout::a16(4 * static_cast<size_t>(heads)) / 4];
      const float* fq = reinterpret_cast<const float*>(dyn + Layout::qn(fkh)) + (h - static_cast<int>(blockIdx.x) * heads / fgroup) * kK;
      Traits::FoldHead::head(p, fslot, hv, fw + 1, kCopy ? 0 : fw, tail, fq, sh.o, dyn + Layout::ring(heads, fkh, fL));
      for (int t = threadIdx.x; t < kV; t += kStepThreads) {
        store_act<kAct>(p.tokens.out, blockIdx.y * p.tokens.out_row_stride + hv * p.tokens.out_head_stride + t, sh.o[t]);
      }
    }
    move_cursor(0);
    return;
  }

  // ---- 2. the window of the block, once: decays per v-head, key dots per k-head; the first head's u ----
  // This thread's u_j[v] of head i (value channel vc, entries slice, slice + kSlices, ...), issued a head
  // ahead; the fp8 row scale of row tid (threads t < V) likewise.
  const int vc = tid % kV, slice = tid / kV;
  auto load_u_batch = [&](int i, int m0, float (&uw)[Traits::kWindowBatch]) {
    const float* u_win = c.u_buf + slot * c.ub_slot_stride + (head0 + i) * c.ub_head_stride + vc;
#pragma unroll
    for (int m = 0; m < Traits::kWindowBatch; ++m) {
      const int j = slice + kSlices * (m0 + m);
      uw[m] = j < w ? __ldg(u_win + j * c.ub_entry_stride) : 0.0f;
    }
  };
  auto load_scale = [&](int i) {
    return kScaled && tid < kV ? __ldg(c.read_scale + slot * c.rs_slot_stride + (head0 + i) * c.rs_head_stride + tid) : 1.0f;
  };
  float uw[Traits::kWindowBatch];
  load_u_batch(0, 0, uw);
  float row_scale = load_scale(0);
  for (int i = warp; i < heads; i += kStepThreads / 32) {
    // Lane l holds entries l and l + 32; entries past the token add nothing. e^{Lambda_t - Lambda_j}
    // from the sum of g_{j+1} .. g_t (suffix sums of the next entries), not a difference of prefixes.
    const float* g_win = c.g_buf + slot * c.gb_slot_stride + (head0 + i) * c.gb_head_stride;
    const float g_t = gate_g[i];
    auto g_at = [&](int j) { return j < w ? __ldg(g_win + j) : (j == w ? g_t : 0.0f); };
    const float total = row_sum<32>(g_at(lane) + g_at(lane + 32));
    const float upper = warp_inclusive_suffix_sum(g_at(lane + 33));  // entries > lane + 32
    const float lower = warp_inclusive_suffix_sum(g_at(lane + 1)) + __shfl_sync(0xffffffffu, upper, 0);  // entries > lane
    if (lane < w) rel[i * L + lane] = expf(lower);
    if (lane + 32 < w) rel[i * L + lane + 32] = expf(upper);
    if (lane == 0) decay[i] = expf(total);
  }
  {
    // The window keys' dots with k_hat and q_hat of their k-head: pair e = (k-head e / w, entry e % w),
    // 8 lanes a pair (lane el's columns: 8-element chunks el, el + 8, ...), two pairs at once.
    constexpr int kCh = Traits::kKeyChunks;
    const int sub = lane / Traits::kEntryLanes, el = lane % Traits::kEntryLanes;
    const int pairs = nk * w;
    for (int e0 = warp * (32 / Traits::kEntryLanes); e0 < pairs; e0 += 2 * Traits::kPairsPerPass) {
      uint4 raw[2][kCh];
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int e = e0 + sub + q * Traits::kPairsPerPass;
        if (e < pairs) {
          const int kk = e / w, j = e % w;
          const unsigned char* k_win = static_cast<const unsigned char*>(c.k_buf) +
                                       (slot * c.kb_slot_stride + (kh0 + kk) * c.kb_head_stride) * dtype_size(kAct);
#pragma unroll
          for (int ch = 0; ch < kCh; ++ch) raw[q][ch] = Chunk16<kAct>::load(k_win, j * c.kb_entry_stride + (el + 8 * ch) * 8);
        }
      }
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int e = e0 + sub + q * Traits::kPairsPerPass;
        const int kk = e < pairs ? e / w : 0, j = e < pairs ? e % w : 0;
        float ss = 0.0f, dk = 0.0f, dq = 0.0f;
        if (e < pairs) {
#pragma unroll
          for (int ch = 0; ch < kCh; ++ch) {
            float kr[8];
            Chunk16<kAct>::to_float(raw[q][ch], kr);
            const float* kh = kn + kk * kK + (el + 8 * ch) * 8;
            const float* qh = qn + kk * kK + (el + 8 * ch) * 8;
#pragma unroll
            for (int x = 0; x < 8; ++x) {
              ss += kr[x] * kr[x];
              dk += kr[x] * kh[x];
              dq += kr[x] * qh[x];
            }
          }
        }
        ss = row_sum<Traits::kEntryLanes>(ss);
        dk = row_sum<Traits::kEntryLanes>(dk);
        dq = row_sum<Traits::kEntryLanes>(dq);
        if (el == 0 && e < pairs) {
          const float rk = key_scale(ss, tk.use_qk_l2norm);
          kdot[kk * L + j] = rk * dk;
          qdot[kk * L + j] = rk * dq;
        }
      }
    }
  }
  __syncthreads();  // the block's decays and dots

  // ---- 3. head after head ----
  int stage = 0;        // the ring stage of the next chunk, and its barrier's phase
  uint32_t phase = 0;
  for (int i = 0; i < heads; ++i) {
    const int hv = head0 + i;
    const int kk = hv / group - kh0;
    // The window terms of this head (this thread's entries of value channel vc).
    {
      const float* rel_i = rel + i * L;
      const float* kdot_k = kdot + kk * L;
      const float* qdot_k = qdot + kk * L;
      float wk = 0.0f, wq = 0.0f;
      for (int m0 = 0; slice + kSlices * m0 < w; m0 += Traits::kWindowBatch) {
        if (m0 > 0) load_u_batch(i, m0, uw);
#pragma unroll
        for (int m = 0; m < Traits::kWindowBatch; ++m) {
          const int j = slice + kSlices * (m0 + m);
          if (j < w) {
            const float r = rel_i[j];
            wk += (r * kdot_k[j]) * uw[m];
            wq += (r * qdot_k[j]) * uw[m];
          }
        }
      }
      sh.wk[slice][vc] = wk;
      sh.wq[slice][vc] = wq;
    }
    if (tid < kV) {
      sh.v[tid] = to_float(v_raw);
      if constexpr (kScaled) sh.scale[tid] = row_scale;
    }
    // The next head's u window, value and row scales: in flight during this head's rows.
    Act v_next = v_raw;
    if (i + 1 < heads) {
      load_u_batch(i + 1, 0, uw);
      if (tid < kV) v_next = static_cast<const Act*>(tk.v)[v_at(i + 1) + tid];
      row_scale = load_scale(i + 1);
    }
    __syncthreads();  // the window terms, v and the scales are in; the last head's u and o are stored

    // The rows: S_c k_hat and S_c q_hat from the ring, chunk after chunk.
    {
      constexpr int C = Lanes::kChunksPerLane;
      constexpr int E = Lanes::kElemsPerChunk;
      const float* kh = kn + kk * kK;
      const float* qh = qn + kk * kK;
      float kf[C][E], qf[C][E];
#pragma unroll
      for (int x = 0; x < C; ++x) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          kf[x][e] = kh[Lanes::col(x) + e];
          qf[x][e] = qh[Lanes::col(x) + e];
        }
      }
      const float decay_i = decay[i], beta_i = gate_beta[i], kq_i = kq[kk];
#pragma unroll 1
      for (int cc = 0; cc < kChunks; ++cc) {
        mbarrier_wait(full + stage, phase);
        const unsigned char* chunk = ring + static_cast<size_t>(stage) * Traits::kStageBytes;
#pragma unroll
        for (int r = 0; r < Traits::kStagePasses; ++r) {
          const int local = Lanes::first_row() + r * Traits::kPassRows;
          const int vr = cc * Traits::kStageRows + local;
          float dk = 0.0f, dq = 0.0f;
#pragma unroll
          for (int x = 0; x < C; ++x) {
            float s[E];
            Chunk16<kSrc>::to_float(*reinterpret_cast<const uint4*>(chunk + local * Traits::kRowBytes + Lanes::col(x) * dtype_size(kSrc)), s);
#pragma unroll
            for (int e = 0; e < E; ++e) {
              dk += s[e] * kf[x][e];
              dq += s[e] * qf[x][e];
            }
          }
          dk = row_sum<Lanes::kLanes>(dk);
          dq = row_sum<Lanes::kLanes>(dq);
          if constexpr (kScaled) {
            dk *= sh.scale[vr];
            dq *= sh.scale[vr];
          }
          if (Lanes::lane() == 0) {
            float wk = 0.0f, wq = 0.0f;
#pragma unroll
            for (int s = 0; s < kSlices; ++s) {
              wk += sh.wk[s][vr];
              wq += sh.wq[s][vr];
            }
            const float u = beta_i * (sh.v[vr] - (decay_i * dk + wk));
            sh.u[vr] = u;
            sh.o[vr] = decay_i * dq + wq + kq_i * u;
          }
        }
        __syncthreads();  // every thread is done with the stage (and, after the last chunk, u and o are in)
        const int seq = i * kChunks + cc;
        if (tid == 0 && seq + S < total_chunks) issue_chunk(slot, seq + S, stage);
        if (++stage == S) {
          stage = 0;
          phase ^= 1;
        }
      }
    }

    // The output and the entry at w.
    for (int t = tid; t < kV; t += kStepThreads) {
      store_act<kAct>(tk.out, row * tk.out_row_stride + hv * tk.out_head_stride + t, sh.o[t]);
      c.u_buf[slot * c.ub_slot_stride + hv * c.ub_head_stride + w * c.ub_entry_stride + t] = sh.u[t];
      static_cast<Act*>(c.v_buf)[slot * c.vb_slot_stride + hv * c.vb_head_stride + w * c.vb_entry_stride + t] = v_raw;
    }
    if (hv % group == 0) {  // the k-head's key, once (by its first v-head)
      const int h = hv / group;
      for (int t = tid; t < kK; t += kStepThreads) {
        static_cast<Act*>(c.k_buf)[slot * c.kb_slot_stride + h * c.kb_head_stride + w * c.kb_entry_stride + t] =
            static_cast<const Act*>(tk.k)[row * tk.k_row_stride + h * tk.k_head_stride + t];
      }
    }
    if (tid == 0) {
      c.g_buf[slot * c.gb_slot_stride + hv * c.gb_head_stride + w] = gate_g[i];
      c.beta_buf[slot * c.bb_slot_stride + hv * c.bb_head_stride + w] = gate_beta[i];
    }
    v_raw = v_next;
  }
  move_cursor(w + 1);
}

}  // namespace gdn
}  // namespace replayssm
