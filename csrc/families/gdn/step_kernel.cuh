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
// folds its head with the family's fold routine (fold.cuh's Fold::head), the token as the last entry,
// and takes the output from the folded full-precision state; the cursor goes to 0. The fold computes
// the token's u from the checkpoint itself (and, with a read copy, every u_j), so a folding CTA does
// not replay.
//
// Byte model per (row, v-head), s = source bytes (checkpoint or read copy), a = activation bytes,
// w = the cursor, G = HV / H:
//   replay: V K s + w (4 V + 4 + K a / G) read (tile, u window, g, keys shared by the k-head's G
//           CTAs), V (4 + 2 a) + 8 + K a / G written (u, v, out, g, beta, key)
//   fold:   the replay's reads (with a copy the tile is read and not used), the checkpoint read and
//           written (2 V K s_ck), the window's k, v (copy) or u (none), g, beta, and the copy written
//           (V K s_rc, + 4 V scales for fp8)
// A cycle is L - max_draft_tokens replays and one fold; the conventional update moves 2 V K s_ck a
// step. qwen4b, fp32 checkpoint, L = 16: ~69 KB a replay, ~140 KB a fold, the cycle 1.74x under 16
// updates (bf16 copy ~2.7x, fp8 copy ~4.2x).
//
// One CTA of 256 threads per (row, v-head, part): the v-head's value rows are cut into `parts` equal
// blocks of V / parts rows (parts in 1, 2, 4 with V / parts >= 32, launch/gdn_policy.h), since the rows
// do not interact (tile.cuh): a part reads and writes only its rows (tile, u window, u, v, out) and
// folds only its rows (its passes of fold.cuh), and repeats the per-head work that is O(w K) (token,
// decays, the window keys' dots). Few rows (batch 1) thus spread over more SMs, and a folding CTA, the
// slowest of a launch, is shorter. Every row takes the same fp32 operations in the same order whatever
// `parts`, so the bits do not depend on it. The fold split applies the same cut to folding rows only
// (fold_parts CTAs a v-head for the first rows the order pass marks, the rest in one): under staggered
// folds a step's few folding rows are its longest CTAs. Phases:
//   1. thread 0: slot, the part's source rows' bulk copy (TMA, into dynamic shared memory; an fp32 tile
//      without a copy possibly in chunks of one replay pass, tile_stages below), cursor and the CTA's
//      ticket (cursor.cuh), whose answer is used at the end; warp 1: the token's q_hat, k_hat, g, beta;
//      all: v.
//   2. replay only: warp 0 the decays (suffix sums of g, no cancellation), every warp the window keys'
//      dots with k_hat and q_hat (8 lanes an entry), every thread its u_j[v] loads (issued first);
//      then the window terms sum_j (...) u_j[v], a value channel per thread, in slices.
//   3. the rows, from the tile in shared memory: the two dots, then u_t and o_t. A bf16 / fp16 / fp8
//      read copy that the mma takes with the activations' type: on tensor cores (rows_mma.cuh), a warp
//      per 16 rows, B the raw key and query written by warp 1 in phase 1. Otherwise tile.cuh's mapping,
//      8 lanes a row, lane 0 of the row forming u_t and o_t.
//   4. coalesced stores of out and the entry (the key, g and beta by part 0); the last CTA of the
//      slot writes the cursor.
//
// KDA (kVectorGate: the log decay per key channel; g_buf entries of K): e^{Lambda_t - Lambda_j} is a
// K-vector per entry, F_j[k] = exp(g_{j+1}[k] + .. + g_t[k]) (suffix sums per channel, a thread per
// channel walking the window from t down, so F is never stored: 3 warp sums an entry, the warps'
// partials in dynamic shared memory after the tile), taken into the window dots
//   kdot_j = (k_hat_j o F_j) . k_hat_t, qdot_j = (k_hat_j o F_j) . q_hat_t   (rel = 1),
// and the rows' dots take e^{Lambda_t} o k_hat_t and e^{Lambda_t} o q_hat_t (decay = 1). The fold is
// fold.cuh's with the vector gate.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cache/cursor.cuh"
#include "cache/slot_map.cuh"
#include "common/bulk_copy.cuh"
#include "common/programmatic_launch.cuh"
#include "common/reduce.cuh"
#include "diag/cta_timeline.cuh"
#include "families/gdn/fold.cuh"
#include "families/gdn/gates.cuh"
#include "families/gdn/params.h"
#include "families/gdn/rows_mma.cuh"
#include "families/gdn/tile.cuh"

namespace replayssm {
namespace gdn {

constexpr int kStepThreads = 256;

template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kVectorGate = false,
          bool kStaged = false>
struct StepTraits {
  static constexpr DType kSrc = kCopy ? kRead : kCkpt;  // what the replay reads
  using Lanes = RowLanes<kK, kSrc, kStepThreads>;
  using FoldHead = Fold<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate>;
  // The rows' dots on tensor cores (rows_mma.cuh): a read copy of a type the mma takes with these
  // activations, and GDN's scalar gate (KDA's rows take e^{Lambda_t} o k_hat_t, a vector per channel,
  // which is no raw activation).
  static constexpr bool kRowsMma = kCopy && !kVectorGate && tile_on_tensor_cores(kRead, kAct);
  using RowsMmaT = RowsMma<kK, kRowsMma ? kRead : DType::kFloat8E4M3, kRowsMma ? kAct : DType::kBFloat16>;
  static constexpr int kRows = kV / Lanes::kRowsPerPass;  // rows a thread in the replay
  static constexpr bool kHasCopy = kCopy;
  static constexpr int kRowBytes = kK * dtype_size(kSrc);
  static constexpr int kKeyBytes = kK * dtype_size(kAct);  // a buffered key
  static constexpr int kKeyChannels = kK;
  static constexpr int kTileBytes = kV * kRowBytes;
  // An fp32 tile without a copy (64 KB at K = V = 128, 3 CTAs an SM) may be asked for in chunks of one
  // replay pass of rows, at most tile_stages in flight (launch/gdn_policy.h): an SM reaches full
  // bandwidth with about 16 KB a CTA in flight (tools/load_latency.cu), and three whole tiles an SM
  // only lengthen the queue that the set-up's small loads wait in; a folding CTA, which replays
  // nothing, then reads one chunk instead of the tile. 16-bit tiles and copies (32 KB or less, 4 CTAs
  // an SM) do not take these chunks (a 16-bit copy may be staged instead: below).
  static constexpr bool kChunkedTile = !kCopy && kSrc == DType::kFloat32;
  // A 16-bit read copy on tensor cores (32 KB at K = V = 128, 4 CTAs an SM) may stay on its one barrier
  // but be asked for a chunk at a time over the set-up: one with the slot, one at each of the set-up's
  // two barriers, the rest before the rows, so that fewer of its bytes queue ahead of the set-up's loads;
  // a folding or full CTA, which reads no tile, asks for no more and settles the rest of the barrier's
  // bytes (mbarrier_complete_tx). A kernel of its own (kStaged), so that the launches that keep the one
  // copy (one CTA an SM or fewer) keep their kernel's registers: with the staged copy compiled in, the
  // 64-register kernel spills 20 / 16 bytes and its batch-1 cycle was 4-5% slower. Not the fp8 copy (16
  // KB): there the staged copy was no faster in lock-step and up to 8% slower under staggered folds.
  static constexpr bool kCanStage = kRowsMma && kRead != DType::kFloat8E4M3;
  static_assert(!kStaged || kCanStage, "only a 16-bit read copy on tensor cores is staged");
  static constexpr bool kStagedTile = kStaged;
  static constexpr int kChunkRows = Lanes::kRowsPerPass;
  static constexpr int kChunkBytes = kChunkRows * kRowBytes;
  static constexpr int kMaxTileChunks = 4;
  // The window terms: thread t sums entries slice, slice + kSlices, ... of value channel t % V.
  static constexpr int kSlices = kStepThreads / kV;
  // u_j[v] loads a thread issues before the coefficients are ready: a window of up to 8 kSlices entries
  // (16 at V = 128, 32 at V = 64) in one round trip; longer windows load the rest in batches after.
  static constexpr int kWindowBatch = 8;
  // The window keys' dots: 8 lanes an entry, 16-byte loads of the activation.
  static constexpr int kEntryLanes = 8;
  static constexpr int kKeyPerLane = kK / kEntryLanes;
  static constexpr int kEntriesPerPass = kStepThreads / kEntryLanes;
  static_assert(kRows >= 1 && kV % Lanes::kRowsPerPass == 0, "the replay covers the tile in whole passes");
  static_assert(kStepThreads % kV == 0 && kV <= kStepThreads, "the window terms take whole value channels");
  static_assert(kKeyPerLane % 8 == 0, "window keys move in 16-byte chunks");
  static_assert(FoldHead::kThreads == kStepThreads, "the fold routine (fold.cuh) is written for the step's CTA");

  // A folding CTA's read-copy tile (read, not used) may still be landing when the fold's first
  // checkpoint rows go out: those rows are placed after it. Without a copy the tile is the checkpoint
  // (64 KB at K = V = 128 fp32), so the rows overlap it, and the fold waits for it first.
  static constexpr size_t kFoldKeep = kCopy ? static_cast<size_t>(kTileBytes) : 0;
  // KDA's replay: after the tile, e^{Lambda_t} per channel [K], then the window dots' per-warp partial
  // sums [L][K / 32][3] (fp32).
  static constexpr size_t kChannelDecayOffset = kTileBytes;
  static constexpr size_t kPartialOffset = kTileBytes + 4 * static_cast<size_t>(kK);
  __host__ __device__ static constexpr size_t replay_bytes(int buffer_len) {
    return kVectorGate ? kPartialOffset + 12 * static_cast<size_t>(buffer_len) * (kK / 32) : static_cast<size_t>(kTileBytes);
  }
  // Dynamic shared memory: the replay's tile, or (a folding CTA, which replays nothing) the fold's
  // workspace over it.
  __host__ __device__ static constexpr size_t smem_bytes(int buffer_len) {
    const size_t fold = FoldHead::workspace_bytes(buffer_len, kFoldKeep);
    return fold > replay_bytes(buffer_len) ? fold : replay_bytes(buffer_len);
  }
  // CTAs per SM: 4 (64 registers) where the shared memory at L = 16 lets 4 share an SM, so that they
  // keep 4 tiles in flight (the replay is latency-bound: slot, cursor, window, tile); as many as it
  // lets where that is fewer (the fp32 checkpoint's 64 KB tile at K = V = 128: 3), whose registers
  // (80) then cost no occupancy and keep the fused fold from spilling. 228 KB an SM, 1 KB reserved
  // per CTA, the static StepShared under 6 KB.
  static constexpr size_t kSmemAtL16 = smem_bytes(16) + 6 * 1024 + 1024;
  static constexpr int kMinCtasPerSm = 228 * 1024 / kSmemAtL16 < 4 ? static_cast<int>(228 * 1024 / kSmemAtL16) : 4;
  static_assert(kMinCtasPerSm >= 1, "a step CTA fits an SM");
};

template <int kK, int kV, int kSlices, int kRowsMmaWords = 1>
struct StepShared {
  alignas(16) float q[kK];  // the token's q_hat (scaled)
  alignas(16) float k[kK];  // and k_hat
  float v[kV];         // the token's value
  float u[kV], o[kV];  // u_t and the output, per value channel
  float wk[kSlices][kV], wq[kSlices][kV];  // the window terms' partial sums
  float rel[kGdnMaxBufferLen];             // e^{Lambda_t - Lambda_j}
  float kdot[kGdnMaxBufferLen], qdot[kGdnMaxBufferLen];  // k_hat_j . k_hat_t, k_hat_j . q_hat_t
  uint64_t tile_full;  // the source tile's bulk copy
  int64_t slot;        // -1: the row touches nothing
  int32_t w;           // the cursor
  int32_t split_part;  // fold split: this CTA's part of fold_parts; -1: not split
  float decay;         // e^{Lambda_t}
  float g, beta, kq;   // the token's gates and k_hat . q_hat
  // Tensor-core rows (rows_mma.cuh): the raw key and query as B fragments, and what turns their dots
  // into S k_hat and S q_hat (the l2 scales, the query's scale, F16RangeScale's unscale).
  alignas(16) uint32_t rows_b[kRowsMmaWords];
  float k_mul, q_mul;
  // The tile in chunks (StepTraits::kChunkedTile and tile_stages > 0): a barrier each, the tile's first
  // row in global memory and the rows' stride, and how many of them thread 0 has asked for. Kept here,
  // not in registers, which the rows need. Thread 0 writes chunks_asked while the other threads read
  // the rest: it has 16 bytes of its own, so that no wider load of a neighbour reads it (racecheck).
  uint64_t chunk_full[4];
  const unsigned char* chunk_src;
  int64_t chunk_stride;
  int32_t chunks;                     // 0: the tile in one copy (tile_full); written before the first barrier
  alignas(16) int32_t chunks_asked;   // chunks 0 .. chunks_asked - 1 are in flight or landed
};

// KDA: the token's log decays per key channel besides.
template <int kK, int kV, int kSlices>
struct KdaStepShared : StepShared<kK, kV, kSlices> {
  alignas(16) float gv[kK];
};

// tile_stages (StepTraits::kChunkedTile variants): > 0 the tile in chunks of one replay pass of rows, the
// first tile_stages asked for with the slot and one more each time an earlier chunk lands (thread 0 tests
// at the set-up's barriers) or the rows reach it; 0 the whole tile in one copy. kStaged kernels (a 16-bit
// read copy, StepTraits::kStagedTile): > 0 the tile asked for over the set-up.
// pdl_wait: launched with programmatic dependent launch (launch/pdl.h); pdl_trigger: let the next kernel
// start early; warm_l2 (with pdl_wait, not ordered): before the wait, ask L2 for the CTA's cursor, tile and
// window (warm_step_l2).
// parts: CTAs per (row, v-head), each V / parts value rows (a divisor of V / 32); gridDim.x = HV parts.
// fold_parts: with parts = 1 and the order pass, the marked folding rows' CTAs a v-head (below); 1: none.
// ordered: the order pass (cache/row_order.cuh) ran before this launch and filled p.row_order: CTA row
// y takes the batch row and slot it put at y (the folding rows first). after_order_pass: launched with PDL
// behind that pass (launch/pdl.h): the CTA waits for it as for any kernel ahead, and lets nothing start
// early unless pdl_trigger.
// Before the PDL wait (launch/pdl.h, warm_l2), warp 0 of a CTA asks L2 for what its first round trips
// read: the slot's cursor, its part's tile, and every buffer entry of its window (u of its value rows, the
// k-head's keys, g; an fp8 copy's row scales), for the slot its row names as read through L2 now
// (peek_slot: the kernel ahead may still write the slots; a stale slot only wastes the prefetches).
// Prefetches only, none into the SM's L1, so nothing read after the wait can be stale.
template <class Traits, DType kAct, bool kVectorGate>
__device__ __forceinline__ void warm_step_l2(const GdnParams& p, int row, int hv, int row0, int rows) {
  const GdnCache& c = p.cache;
  const int lane = threadIdx.x % 32;
  const int64_t slot = peek_slot(p, row);
  if (slot < 0) return;
  constexpr bool kCopy = Traits::kHasCopy;
  if (lane == 0) {
    prefetch_line_l2(c.num_committed + slot);
    const int64_t row_stride = kCopy ? c.rc_row_stride : c.ck_row_stride;
    const int64_t tile = (kCopy ? slot * c.rc_slot_stride + hv * c.rc_head_stride : slot * c.ck_slot_stride + hv * c.ck_head_stride) +
                         row0 * row_stride;
    const unsigned char* src = static_cast<const unsigned char*>(kCopy ? c.read_copy : c.checkpoint);
    prefetch_rows_l2(src + tile * dtype_size(Traits::kSrc), rows, Traits::kRowBytes, row_stride * dtype_size(Traits::kSrc));
    if constexpr (Traits::kSrc == DType::kFloat8E4M3) {
      prefetch_line_l2(c.read_scale + slot * c.rs_slot_stride + hv * c.rs_head_stride + row0);
    }
    if constexpr (!kVectorGate) prefetch_line_l2(c.g_buf + slot * c.gb_slot_stride + hv * c.gb_head_stride);
  }
  const int h = hv / (p.v_heads / p.heads);
  for (int j = lane; j < c.buffer_len; j += 32) {
    prefetch_l2_if_aligned(c.u_buf + slot * c.ub_slot_stride + hv * c.ub_head_stride + j * c.ub_entry_stride + row0,
                           static_cast<size_t>(rows) * sizeof(float));
    prefetch_l2_if_aligned(static_cast<const unsigned char*>(c.k_buf) +
                               (slot * c.kb_slot_stride + h * c.kb_head_stride + j * c.kb_entry_stride) * dtype_size(kAct),
                           static_cast<size_t>(Traits::kKeyBytes));
    if constexpr (kVectorGate) {
      prefetch_l2_if_aligned(c.g_buf + slot * c.gb_slot_stride + hv * c.gb_head_stride + j * p.kda.gb_entry_stride,
                             static_cast<size_t>(Traits::kKeyChannels) * sizeof(float));
    }
  }
}

template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kVectorGate, bool kStaged>
__global__ void __launch_bounds__(kStepThreads, (StepTraits<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate>::kMinCtasPerSm))
    step_kernel(const GdnParams p, const bool pdl_wait, const bool pdl_trigger, const bool warm_l2, const int parts,
                const bool ordered, const int fold_parts, const bool after_order_pass, const int tile_stages) {
  using Traits = StepTraits<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate, kStaged>;
  using Lanes = typename Traits::Lanes;
  constexpr DType kSrc = Traits::kSrc;
  constexpr int kSlices = Traits::kSlices;
  extern __shared__ __align__(128) unsigned char dyn[];
  constexpr int kRowsMmaWords = Traits::kRowsMma ? Traits::RowsMmaT::kWords : 1;
  __shared__ std::conditional_t<kVectorGate, KdaStepShared<kK, kV, kSlices>, StepShared<kK, kV, kSlices, kRowsMmaWords>> sh;
  static_assert(sizeof(sh) <= 6 * 1024, "StepTraits::kMinCtasPerSm counts 6 KB of static shared memory");

  const GdnCache& c = p.cache;
  const GdnTokens& tk = p.tokens;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int L = c.buffer_len;

  // ---- 0. with PDL (common/programmatic_launch.cuh) the wait for the kernel ahead, before anything
  // global (the CTA may have started while that kernel ended); while it waits, L2 warmed (warm_l2) ----
  if (warm_l2 && warp == 0) {
    warm_step_l2<Traits, kAct, kVectorGate>(p, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x) / parts,
                                            (static_cast<int>(blockIdx.x) % parts) * (kV / parts), kV / parts);
  }
  wait_for_prior_grids(pdl_wait || after_order_pass);
  if (pdl_trigger && tid == 0) launch_dependent_grids();
  // A diagnostic build's time line (diag/cta_timeline.cuh; empty in a product build): start, the slot
  // and cursor known to every thread, the window terms done (set-up), the tile landed (item 0), the end.
  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineStart);
  // The CTA's row and part. With a fold split (fold_parts > 1, ordered launches of one part a v-head),
  // the rows the order pass marked (its first folding rows) take fold_parts CTAs a v-head: part 0 at
  // their own grid row, parts 1 .. fold_parts - 1 in the helper rows after the batch, fold_parts - 1 per
  // marked position; a helper of a position the pass left unmarked (fewer folds than marks) has no work.
  int pos = static_cast<int>(blockIdx.y);
  int split_part = 0;
  if (fold_parts > 1 && pos >= p.batch) {
    const int helper = pos - p.batch;
    pos = helper / (fold_parts - 1);
    split_part = 1 + helper % (fold_parts - 1);
  }
  const int entry = ordered ? __ldg(p.row_order + pos) : pos;
  const bool split = fold_parts > 1 && (entry & kFoldPartsRow) != 0;
  if (split_part > 0 && !split) return;
  const int row = entry & ~kFoldPartsRow;
  const int hv = static_cast<int>(blockIdx.x) / parts;
  // The replay's value rows: a split row always folds (the pass marks folding rows only), so outside
  // the fold branch the part is the launch's; the fold takes its own from sh.split_part (kept in shared
  // memory rather than live in registers across the replay).
  const int part = static_cast<int>(blockIdx.x) % parts;
  const int part_rows = kV / parts;
  const int row0 = part * part_rows;  // this CTA's value rows: row0 .. row0 + part_rows - 1
  auto mine = [&](int v) { return v >= row0 && v < row0 + part_rows; };
  const int h = hv / (p.v_heads / p.heads);
  auto row_slot = [&]() -> int64_t { return ordered ? __ldg(p.row_order + p.batch + pos) : resolve_slot(p, row); };

  // The tile in chunks: thread 0 asks for them (only it reads or writes chunks_asked until the CTA's
  // last request is behind a barrier), every thread waits. Whether the CTA takes its tile in chunks is
  // read from shared memory once, after the first barrier (`in_chunks` below; false at compile time in
  // every other variant, whose code is then as before): a check of sh.chunks in a condition of thread 0's
  // before that barrier may be evaluated by every thread, which racecheck reports against its write.
  auto ask_chunk = [&](int q) {  // thread 0
    mbarrier_arrive_expect_tx(&sh.chunk_full[q], Traits::kChunkBytes);
    bulk_copy_row_range_to_shared<Traits::kRowBytes>(dyn, sh.chunk_src, q * Traits::kChunkRows, Traits::kChunkRows,
                                                     sh.chunk_stride, &sh.chunk_full[q]);
  };
  auto ask_chunks_through = [&](int last) {  // thread 0
    int next = sh.chunks_asked;
    for (; next < sh.chunks && next <= last; ++next) ask_chunk(next);
    sh.chunks_asked = next;
  };
  // Thread 0: one more chunk for each of the oldest in flight that has landed (tile_stages in flight).
  auto ask_landed_chunks = [&]() {
    int next = sh.chunks_asked;
    while (next < sh.chunks && mbarrier_test(&sh.chunk_full[next - tile_stages], 0)) ask_chunk(next++);
    sh.chunks_asked = next;
  };
  // A staged tile (kStagedTile): thread 0 asks for chunks through `last` on the tile's one barrier, armed
  // for the whole tile (the chunk loop of ask_chunks_through, without a barrier per chunk).
  auto ask_staged_through = [&](int last) {
    int next = sh.chunks_asked;
    for (; next < sh.chunks && next <= last; ++next) {
      bulk_copy_row_range_to_shared<Traits::kRowBytes>(dyn, sh.chunk_src, next * Traits::kChunkRows, Traits::kChunkRows,
                                                       sh.chunk_stride, &sh.tile_full);
    }
    sh.chunks_asked = next;
  };
  // Every thread, after a CTA barrier that follows thread 0's last request: the chunks asked for land
  // before their shared memory is reused or the CTA leaves (a folding or full CTA asks for no more).
  auto wait_asked_chunks = [&]() {
    for (int q = 0; q < sh.chunks_asked; ++q) mbarrier_wait(&sh.chunk_full[q], 0);
  };

  // ---- 1. slot, tile copy, cursor and ticket; the token ----
  int32_t ticket = 0;  // thread 0: the cursor word as its atomic found it (the tickets drawn before)
  bool replay_asks_early = false;  // thread 0: a replaying CTA in chunks (it asks for more at the barriers)
  bool staged_asks = false;        // thread 0: a replaying CTA whose staged tile it asks for at the barriers
  if (tid == 0) {
    const int64_t slot = row_slot();
    int32_t w = -1;
    if constexpr (Traits::kChunkedTile) sh.chunks = 0;
    if (slot >= 0) {
      const int copy_rows = split ? kV / fold_parts : part_rows;
      const int copy_row0 = split ? split_part * copy_rows : row0;
      // In chunks: 2 to kMaxTileChunks whole passes of rows (with more parts, one chunk is the tile).
      const int chunks = copy_rows / Traits::kChunkRows;
      const bool chunkable = tile_stages > 0 && chunks * Traits::kChunkRows == copy_rows && chunks >= 2 &&
                             chunks <= Traits::kMaxTileChunks;
      const bool tile_in_chunks = Traits::kChunkedTile && chunkable;
      const bool tile_staged = Traits::kStagedTile && chunkable;
      // The tile's barriers, set up by the thread that arms them and issues the copies, right before
      // them (only a CTA with a slot waits on them, after the CTA barrier below). Initialised at the top
      // of the kernel, before the PDL wait, compute-sanitizer's racecheck reported the init against the
      // arm.
      if (tile_in_chunks) {
        for (int q = 0; q < chunks; ++q) mbarrier_init(&sh.chunk_full[q], 1);
      } else {
        mbarrier_init(&sh.tile_full, 1);
      }
      fence_barrier_init();
      // The tile's bulk copy first (the part's rows, at the start of the dynamic shared memory): its
      // address needs only the slot, so the tile is in flight during the cursor's round trip instead
      // of after it (one DRAM round trip less before the rows).
      const int64_t row_stride = kCopy ? c.rc_row_stride : c.ck_row_stride;
      const int64_t tile = (kCopy ? slot * c.rc_slot_stride + hv * c.rc_head_stride : slot * c.ck_slot_stride + hv * c.ck_head_stride) +
                           copy_row0 * row_stride;
      const unsigned char* src = static_cast<const unsigned char*>(kCopy ? c.read_copy : c.checkpoint);
      if (tile_in_chunks) {
        sh.chunks = chunks;
        sh.chunks_asked = 0;
        sh.chunk_src = src + tile * dtype_size(kSrc);
        sh.chunk_stride = row_stride * dtype_size(kSrc);
        ask_chunks_through(tile_stages - 1);
      } else if (tile_staged) {
        sh.chunks = chunks;
        sh.chunks_asked = 1;
        sh.chunk_src = src + tile * dtype_size(kSrc);
        sh.chunk_stride = row_stride * dtype_size(kSrc);
        mbarrier_arrive_expect_tx(&sh.tile_full, static_cast<uint32_t>(copy_rows) * Traits::kRowBytes);
        bulk_copy_row_range_to_shared<Traits::kRowBytes>(dyn, sh.chunk_src, 0, Traits::kChunkRows, sh.chunk_stride, &sh.tile_full);
      } else {
        bulk_copy_rows_to_shared<Traits::kRowBytes>(dyn, src + tile * dtype_size(kSrc), copy_rows, row_stride * dtype_size(kSrc),
                                                    &sh.tile_full);
      }
      REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineGdnSlot);
      // Only this thread reads the cursor, so the CTA may take its ticket at once; the atomic's answer
      // is needed only at the end. A cursor with no room (w >= L, whatever its high bits) takes no
      // ticket and is left as it is.
      w = __ldcg(c.num_committed + slot) & kCursorMask;
      if (w < L) ticket = atomicAdd(c.num_committed + slot, kTicket);
      REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineGdnCursorRead);
      replay_asks_early = tile_in_chunks && w < L && !folds_after_append(w, c.max_draft_tokens, L);
      staged_asks = tile_staged && w < L && !folds_after_append(w, c.max_draft_tokens, L);
      // A folding or full CTA reads no tile: the chunks not asked for are settled on the barrier, which
      // then completes when the first lands (before the fold reuses its shared memory).
      if (tile_staged && !staged_asks) {
        mbarrier_complete_tx(&sh.tile_full, static_cast<uint32_t>(chunks - 1) * Traits::kChunkBytes);
      }
    }
    sh.slot = slot;
    sh.w = w;
    sh.split_part = split ? split_part : -1;
  }
  // The CTA that drew the slot's last ticket writes its cursor (which clears the tickets); `of`: the
  // CTAs of each of the slot's v-heads.
  auto move_cursor = [&](int64_t slot, int32_t to, int of) {
    if (tid == 0 && (ticket >> 16) == p.v_heads * of - 1) c.num_committed[slot] = to;
  };
  if (warp == 1) {  // q_hat, k_hat, k_hat . q_hat; g and beta
    constexpr int kPer = kK / 32;
    const int64_t k_at = row * tk.k_row_stride + h * tk.k_head_stride + lane * kPer;
    const int64_t q_at = row * tk.q_row_stride + h * tk.q_head_stride + lane * kPer;
    float kf[kPer], qf[kPer];
    float ss_k = 0.0f, ss_q = 0.0f, kq = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      kf[e] = load_act<kAct>(tk.k, k_at + e);
      qf[e] = load_act<kAct>(tk.q, q_at + e);
      ss_k += kf[e] * kf[e];
      ss_q += qf[e] * qf[e];
      kq += kf[e] * qf[e];
    }
    ss_k = row_sum<32>(ss_k);
    ss_q = row_sum<32>(ss_q);
    kq = row_sum<32>(kq);
    const float rk = key_scale(ss_k, tk.use_qk_l2norm);
    const float rq = key_scale(ss_q, tk.use_qk_l2norm) * tk.scale;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      sh.k[lane * kPer + e] = kf[e] * rk;
      sh.q[lane * kPer + e] = qf[e] * rq;
    }
    if constexpr (Traits::kRowsMma) {  // the raw key and query as B fragments (rows_mma.cuh)
      using Mma = typename Traits::RowsMmaT;
      float k_scale = 1.0f, q_scale = 1.0f, k_unscale = 1.0f, q_unscale = 1.0f;
      if constexpr (Mma::kScaleB) {
        float k_max = 0.0f, q_max = 0.0f;
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          k_max = fmaxf(k_max, fabsf(kf[e]));
          q_max = fmaxf(q_max, fabsf(qf[e]));
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
          k_max = fmaxf(k_max, __shfl_xor_sync(0xffffffffu, k_max, offset));
          q_max = fmaxf(q_max, __shfl_xor_sync(0xffffffffu, q_max, offset));
        }
        const F16RangeScale k_range(k_max), q_range(q_max);
        k_scale = k_range.scale, k_unscale = k_range.unscale;
        q_scale = q_range.scale, q_unscale = q_range.unscale;
      }
      static_assert(kPer % 2 == 0, "a lane's columns are whole pairs");
#pragma unroll
      for (int e = 0; e < kPer; e += 2) {
        const int word = Mma::word_of(lane * kPer + e);
        sh.rows_b[word] = Mma::pack(kf[e] * k_scale, kf[e + 1] * k_scale);
        sh.rows_b[Mma::kQueryBase + word] = Mma::pack(qf[e] * q_scale, qf[e + 1] * q_scale);
      }
      if (lane == 0) {
        sh.k_mul = rk * k_unscale;
        sh.q_mul = rq * q_unscale;
      }
    }
    if constexpr (kVectorGate) {
      const float A_log = __ldg(tk.A_log + hv);
      const float* dt_bias = tk.dt_bias + hv * p.kda.dt_bias_head_stride;
      const int64_t a_at = row * tk.a_row_stride + hv * tk.a_head_stride;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const int ch = lane * kPer + e;
        sh.gv[ch] = log_decay(load_gate_input(tk.a, tk.a_dtype, a_at + ch * p.kda.a_channel_stride), A_log, __ldg(dt_bias + ch));
      }
      if (lane == 0) {
        sh.beta = beta_gate(load_gate_input(tk.b, tk.b_dtype, row * tk.b_row_stride + hv * tk.b_head_stride));
        sh.kq = kq * rk * rq;
      }
    } else if (lane == 0) {
      const float a = load_gate_input(tk.a, tk.a_dtype, row * tk.a_row_stride + hv * tk.a_head_stride);
      const float b = load_gate_input(tk.b, tk.b_dtype, row * tk.b_row_stride + hv * tk.b_head_stride);
      sh.g = log_decay(a, __ldg(tk.A_log + hv), __ldg(tk.dt_bias + hv));
      sh.beta = beta_gate(b);
      sh.kq = kq * rk * rq;
    }
    if (lane == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineGdnToken);
  }
  for (int t = tid; t < kV; t += kStepThreads) sh.v[t] = load_act<kAct>(tk.v, row * tk.v_row_stride + hv * tk.v_head_stride + t);
  // A replaying CTA's next chunks where its first have landed already (a folding or full one asks for no
  // more: it reads no tile).
  if (replay_asks_early) ask_landed_chunks();
  if (staged_asks) ask_staged_through(1);
  __syncthreads();
  const bool in_chunks = Traits::kChunkedTile && sh.chunks > 0;

  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineCursor);
  const int64_t out_at = row * tk.out_row_stride + hv * tk.out_head_stride;
  const int64_t slot = sh.slot;
  const int w = sh.w;
  if (slot < 0) {  // touches nothing, zero output
    for (int t = row0 + tid; t < row0 + part_rows; t += kStepThreads) store_act<kAct>(tk.out, out_at + t, 0.0f);
    return;
  }
  if (w >= L) {  // a cursor with no room: nothing touched, zero output
    if (in_chunks) {  // the tile lands before the CTA leaves
      wait_asked_chunks();
    } else {
      mbarrier_wait(&sh.tile_full, 0);
    }
    for (int t = row0 + tid; t < row0 + part_rows; t += kStepThreads) store_act<kAct>(tk.out, out_at + t, 0.0f);
    return;
  }

  if (folds_after_append(w, c.max_draft_tokens, L)) {
    // ---- the fold: the buffer's w entries and the token; the output from the folded state ----
    // Every u_j from the checkpoint with a read copy; without one the buffer's came from it already
    // and only the token's is computed, by the fold itself (so a folding CTA replays nothing).
    // The fold's workspace overlaps the tile: the fold waits for it (with a copy, after its first
    // checkpoint rows have gone out).
    if (in_chunks) {
      wait_asked_chunks();
    } else if constexpr (!kCopy) {
      mbarrier_wait(&sh.tile_full, 0);
    }
    FoldTail tail;
    tail.k = static_cast<const unsigned char*>(tk.k) + (row * tk.k_row_stride + h * tk.k_head_stride) * dtype_size(kAct);
    tail.v = static_cast<const unsigned char*>(tk.v) + (row * tk.v_row_stride + hv * tk.v_head_stride) * dtype_size(kAct);
    if constexpr (kVectorGate) {
      tail.g_channels = sh.gv;
    } else {
      tail.g = sh.g;
    }
    tail.beta = sh.beta;
    // A split row's CTA folds its part of fold_parts (sh.split_part), the others the launch's part.
    const int fold_part = sh.split_part >= 0 ? sh.split_part : part;
    const int fold_of = sh.split_part >= 0 ? fold_parts : parts;
    const int fold_rows = kV / fold_of, fold_row0 = fold_part * fold_rows;
    Traits::FoldHead::head(p, slot, hv, w + 1, kCopy ? 0 : w, tail, sh.q, sh.o, dyn, Traits::kFoldKeep,
                           kCopy ? &sh.tile_full : nullptr, fold_part, fold_of);
    for (int t = fold_row0 + tid; t < fold_row0 + fold_rows; t += kStepThreads) store_act<kAct>(tk.out, out_at + t, sh.o[t]);
    if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineConsumerEnd);
    move_cursor(slot, 0, fold_of);
    return;
  }

  // ---- 2. the window: decays, the keys' dots, the window terms ----
  // This thread's u_j[v] first (value channel vc, entries slice, slice + kSlices, ...): in flight
  // while the coefficients are made.
  // (Channels of other parts load nothing: w_mine = 0.)
  const int vc = tid % kV, slice = tid / kV;
  const int w_mine = mine(vc) ? w : 0;
  const float* u_win = c.u_buf + slot * c.ub_slot_stride + hv * c.ub_head_stride + vc;
  auto load_u_batch = [&](int m0, float (&uw)[Traits::kWindowBatch]) {
#pragma unroll
    for (int m = 0; m < Traits::kWindowBatch; ++m) {
      const int j = slice + kSlices * (m0 + m);
      uw[m] = j < w_mine ? __ldg(u_win + j * c.ub_entry_stride) : 0.0f;
    }
  };
  float uw[Traits::kWindowBatch];
  load_u_batch(0, uw);
  float* const channel_decay = reinterpret_cast<float*>(dyn + Traits::kChannelDecayOffset);  // KDA
  if constexpr (kVectorGate) {
    // A thread per key channel (whole warps): F_j = exp(g_{j+1} + .. + g_t) from t down (no exponent
    // positive and no difference of sums) taken into entry j's products k_j F_j k_hat_t, k_j F_j
    // q_hat_t and k_j^2, each summed over the warp's channels; e^{Lambda_t} the whole sum. The warps'
    // sums of entry j at partial[(j W + warp) 3 ..], W = K / 32 warps.
    constexpr int kChannelWarps = kK / 32;
    float* const partial = reinterpret_cast<float*>(dyn + Traits::kPartialOffset);
    if (tid < kK) {
      using Act = typename Storage<kAct>::type;
      const float* g_win = c.g_buf + slot * c.gb_slot_stride + hv * c.gb_head_stride + tid;
      const Act* k_win = static_cast<const Act*>(c.k_buf) + slot * c.kb_slot_stride + h * c.kb_head_stride + tid;
      const float kt = sh.k[tid], qt = sh.q[tid];
      float after = sh.gv[tid];  // g_t
#pragma unroll 4
      for (int j = w - 1; j >= 0; --j) {
        const float kr = to_float(k_win[j * c.kb_entry_stride]);
        const float kd = kr * expf(after);
        const float ss = row_sum<32>(kr * kr), dk = row_sum<32>(kd * kt), dq = row_sum<32>(kd * qt);
        if (lane == 0) {
          float* out = partial + (j * kChannelWarps + warp) * 3;
          out[0] = ss;
          out[1] = dk;
          out[2] = dq;
        }
        after += __ldg(g_win + j * p.kda.gb_entry_stride);
      }
      channel_decay[tid] = expf(after);
    }
    __syncthreads();
    for (int j = tid; j < w; j += kStepThreads) {
      float ss = 0.0f, dk = 0.0f, dq = 0.0f;
#pragma unroll
      for (int q = 0; q < kChannelWarps; ++q) {
        const float* in = partial + (j * kChannelWarps + q) * 3;
        ss += in[0];
        dk += in[1];
        dq += in[2];
      }
      const float rk = key_scale(ss, tk.use_qk_l2norm);
      sh.kdot[j] = rk * dk;  // the decays are in the dots (rel unused)
      sh.qdot[j] = rk * dq;
    }
  } else {
    if (warp == 0) {
      // Lane l holds entries l and l + 32; entries past the token add nothing. e^{Lambda_t - Lambda_j}
      // from the sum of g_{j+1} .. g_t (suffix sums of the next entries), not a difference of prefixes.
      const float* g_win = c.g_buf + slot * c.gb_slot_stride + hv * c.gb_head_stride;
      auto g_at = [&](int j) { return j < w ? __ldg(g_win + j) : (j == w ? sh.g : 0.0f); };
      const float total = row_sum<32>(g_at(lane) + g_at(lane + 32));
      const float upper = warp_inclusive_suffix_sum(g_at(lane + 33));  // entries > lane + 32
      const float lower = warp_inclusive_suffix_sum(g_at(lane + 1)) + __shfl_sync(0xffffffffu, upper, 0);  // entries > lane
      if (lane < w) sh.rel[lane] = expf(lower);
      if (lane + 32 < w) sh.rel[lane + 32] = expf(upper);
      if (lane == 0) sh.decay = expf(total);
    }
    {
      constexpr int kPer = Traits::kKeyPerLane;
      const int sub = lane / Traits::kEntryLanes, el = lane % Traits::kEntryLanes;
      // Lane el's columns: 8-element chunks el, el + 8, ... (k_hat and q_hat read from shared memory per
      // entry: held in registers they would cost the replay its occupancy)
      const unsigned char* k_win = static_cast<const unsigned char*>(c.k_buf) +
                                   (slot * c.kb_slot_stride + h * c.kb_head_stride) * dtype_size(kAct);
      for (int j0 = warp * (32 / Traits::kEntryLanes); j0 < w; j0 += Traits::kEntriesPerPass) {
        const int j = j0 + sub;
        float ss = 0.0f, dk = 0.0f, dq = 0.0f;
        if (j < w) {
#pragma unroll
          for (int i = 0; i < kPer / 8; ++i) {
            float kr[8];
            Chunk16<kAct>::to_float(Chunk16<kAct>::load(k_win, j * c.kb_entry_stride + (el + 8 * i) * 8), kr);
            const float* kh = sh.k + (el + 8 * i) * 8;
            const float* qh = sh.q + (el + 8 * i) * 8;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              ss += kr[e] * kr[e];
              dk += kr[e] * kh[e];
              dq += kr[e] * qh[e];
            }
          }
        }
        ss = row_sum<Traits::kEntryLanes>(ss);
        dk = row_sum<Traits::kEntryLanes>(dk);
        dq = row_sum<Traits::kEntryLanes>(dq);
        if (el == 0 && j < w) {
          const float rk = key_scale(ss, tk.use_qk_l2norm);
          sh.kdot[j] = rk * dk;
          sh.qdot[j] = rk * dq;
        }
      }
    }
  }
  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineGdnKeys);
  if (tid == 0 && in_chunks) ask_landed_chunks();
  if (staged_asks) ask_staged_through(2);
  __syncthreads();
  {
    float wk = 0.0f, wq = 0.0f;
    for (int m0 = 0; slice + kSlices * m0 < w_mine; m0 += Traits::kWindowBatch) {
      if (m0 > 0) load_u_batch(m0, uw);
#pragma unroll
      for (int m = 0; m < Traits::kWindowBatch; ++m) {
        const int j = slice + kSlices * (m0 + m);
        if (j < w_mine) {
          if constexpr (kVectorGate) {  // the decays are in the dots
            wk += sh.kdot[j] * uw[m];
            wq += sh.qdot[j] * uw[m];
          } else {
            const float rel = sh.rel[j];
            wk += (rel * sh.kdot[j]) * uw[m];
            wq += (rel * sh.qdot[j]) * uw[m];
          }
        }
      }
    }
    sh.wk[slice][vc] = wk;
    sh.wq[slice][vc] = wq;
  }
  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineGdnWindow);
  if (tid == 0 && in_chunks) ask_landed_chunks();
  if (staged_asks) ask_staged_through(Traits::kMaxTileChunks - 1);  // the rest, before the rows
  __syncthreads();
  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineSetUp);

  // ---- 3. the rows: S_c k_hat and S_c q_hat from the tile ----
  if constexpr (Traits::kRowsMma) {
    // A warp a block of 16 of the part's rows (all K columns: a row's sums never depend on `parts`);
    // lanes 0 and 1 of each quad finish rows g and g + 8 (rows_mma.cuh).
    const int g = lane >> 2, quad_lane = lane & 3;
    if (warp < part_rows / 16) {
      const int vr = row0 + 16 * warp + g + 8 * quad_lane;  // the row this lane finishes, for quad_lane < 2
      float sc = 1.0f;  // an fp8 copy's row scale, loaded before the tile lands
      if constexpr (kRead == DType::kFloat8E4M3) {
        if (quad_lane < 2) sc = __ldg(c.read_scale + slot * c.rs_slot_stride + hv * c.rs_head_stride + vr);
      }
      mbarrier_wait(&sh.tile_full, 0);
      if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineItem0);
      float acc[4];
      Traits::RowsMmaT::dot(dyn + 16 * warp * Traits::kRowBytes, sh.rows_b, acc);
      if (quad_lane < 2) {
        const float dk = (quad_lane == 0 ? acc[0] : acc[2]) * sc * sh.k_mul;
        const float dq = (quad_lane == 0 ? acc[1] : acc[3]) * sc * sh.q_mul;
        float wk = 0.0f, wq = 0.0f;
#pragma unroll
        for (int s = 0; s < kSlices; ++s) {
          wk += sh.wk[s][vr];
          wq += sh.wq[s][vr];
        }
        const float u = sh.beta * (sh.v[vr] - (sh.decay * dk + wk));
        sh.u[vr] = u;
        sh.o[vr] = sh.decay * dq + wq + sh.kq * u;
      }
    }
  } else {
    constexpr int R = Traits::kRows;
    constexpr int C = Lanes::kChunksPerLane;
    constexpr int E = Lanes::kElemsPerChunk;
    // An fp8 copy's row scales, loaded before the tile lands. The row loop below is unrolled by 2 (a copy),
    // so it picks its row's scale with a select per entry: indexed by the loop's counter the array
    // would live in local memory (a stack frame in every variant, ~4 KB of local stores a CTA).
    constexpr bool kScaled = kRead == DType::kFloat8E4M3 && kCopy;
    float scale[kScaled ? R : 1];
    if constexpr (kScaled) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int vr = Lanes::first_row() + r * Lanes::kRowsPerPass;
        scale[r] = mine(vr) ? __ldg(c.read_scale + slot * c.rs_slot_stride + hv * c.rs_head_stride + vr) : 1.0f;
      }
    }
    float kf[C][E], qf[C][E];
#pragma unroll
    for (int i = 0; i < C; ++i) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        if constexpr (kVectorGate) {  // e^{Lambda_t} o k_hat_t, e^{Lambda_t} o q_hat_t
          const float d = channel_decay[Lanes::col(i) + e];
          kf[i][e] = d * sh.k[Lanes::col(i) + e];
          qf[i][e] = d * sh.q[Lanes::col(i) + e];
        } else {
          kf[i][e] = sh.k[Lanes::col(i) + e];
          qf[i][e] = sh.q[Lanes::col(i) + e];
        }
      }
    }
    if (!in_chunks) mbarrier_wait(&sh.tile_full, 0);  // in chunks: each pass waits for its own
    if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineItem0);
    // Rows unrolled by 2 where a copy or KDA's vector gate keeps more live (fewer spills: sm_90a ptxas,
    // fp32 checkpoint + bf16 copy 4 / 4 bytes of spill stores / loads against 16 / 12 unrolled fully),
    // fully for GDN's copy-less replay (16-bit checkpoint 12 / 8 against 32 / 128).
    constexpr int kRowUnroll = kCopy || kVectorGate ? 2 : R;
#pragma unroll kRowUnroll
    for (int r = 0; r < R; ++r) {
      const int vr = Lanes::first_row() + r * Lanes::kRowsPerPass;
      if (!mine(vr)) continue;  // whole rows: a row's lanes agree
      if (in_chunks) {  // this pass's chunk (the same for every thread); thread 0 asks tile_stages on
        const int q = (vr - row0) / Traits::kChunkRows;
        mbarrier_wait(&sh.chunk_full[q], 0);
        if (tid == 0) ask_chunks_through(q + tile_stages);
      }
      float dk = 0.0f, dq = 0.0f;
#pragma unroll
      for (int i = 0; i < C; ++i) {
        float s[E];
        Chunk16<kSrc>::to_float(*reinterpret_cast<const uint4*>(dyn + (vr - row0) * Traits::kRowBytes + Lanes::col(i) * dtype_size(kSrc)), s);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          dk += s[e] * kf[i][e];
          dq += s[e] * qf[i][e];
        }
      }
      dk = row_sum<Lanes::kLanes>(dk);
      dq = row_sum<Lanes::kLanes>(dq);
      if constexpr (kScaled) {
        float sc = scale[0];
#pragma unroll
        for (int q = 1; q < R; ++q) sc = q == r ? scale[q] : sc;
        dk *= sc;
        dq *= sc;
      }
      if (Lanes::lane() == 0) {
        float wk = 0.0f, wq = 0.0f;
#pragma unroll
        for (int s = 0; s < kSlices; ++s) {
          wk += sh.wk[s][vr];
          wq += sh.wq[s][vr];
        }
        if constexpr (kVectorGate) {
          const float u = sh.beta * (sh.v[vr] - (dk + wk));
          sh.u[vr] = u;
          sh.o[vr] = dq + wq + sh.kq * u;
        } else {
          const float u = sh.beta * (sh.v[vr] - (sh.decay * dk + wk));
          sh.u[vr] = u;
          sh.o[vr] = sh.decay * dq + wq + sh.kq * u;
        }
      }
    }
  }
  __syncthreads();

  // ---- 4. the output and the entry at w; the cursor ----
  using Act = typename Storage<kAct>::type;
  for (int t = row0 + tid; t < row0 + part_rows; t += kStepThreads) {
    store_act<kAct>(tk.out, out_at + t, sh.o[t]);
    c.u_buf[slot * c.ub_slot_stride + hv * c.ub_head_stride + w * c.ub_entry_stride + t] = sh.u[t];
    static_cast<Act*>(c.v_buf)[slot * c.vb_slot_stride + hv * c.vb_head_stride + w * c.vb_entry_stride + t] =
        static_cast<const Act*>(tk.v)[row * tk.v_row_stride + hv * tk.v_head_stride + t];
  }
  if (part == 0 && hv % (p.v_heads / p.heads) == 0) {  // the k-head's key, once (by its first v-head's first part)
    for (int t = tid; t < kK; t += kStepThreads) {
      static_cast<Act*>(c.k_buf)[slot * c.kb_slot_stride + h * c.kb_head_stride + w * c.kb_entry_stride + t] =
          static_cast<const Act*>(tk.k)[row * tk.k_row_stride + h * tk.k_head_stride + t];
    }
  }
  if constexpr (kVectorGate) {
    if (part == 0 && tid < kK) c.g_buf[slot * c.gb_slot_stride + hv * c.gb_head_stride + w * p.kda.gb_entry_stride + tid] = sh.gv[tid];
    if (part == 0 && tid == 0) c.beta_buf[slot * c.bb_slot_stride + hv * c.bb_head_stride + w] = sh.beta;
  } else if (part == 0 && tid == 0) {
    c.g_buf[slot * c.gb_slot_stride + hv * c.gb_head_stride + w] = sh.g;
    c.beta_buf[slot * c.bb_slot_stride + hv * c.bb_head_stride + w] = sh.beta;
  }
  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineConsumerEnd);
  move_cursor(slot, w + 1, parts);
}

}  // namespace gdn
}  // namespace replayssm
