// The Gated DeltaNet fold: a slot's committed buffer entries folded into the checkpoint tile of one
// v-head, by a whole CTA of 256 threads. The one fold routine of the family: the replay step's fused
// fold (Fold::head) and the fold kernel of commit / flush / materialize (fold_kernel.cuh) run the same
// code, so the same buffer folds to the same checkpoint bits in either.
//
// Math (replayssm_cuda/reference.py, _delta_fold_state). Entries j < n: raw key k_j (the v-head's
// k-head), value v_j, log decay g_j, beta_j, stored corrected value u_j; kn_j the normalised key
// (gates.cuh); Lambda_j = g_0 + ... + g_j:
//     S = S_c e^{Lambda_{n-1}} + sum_{j<n} (u_j e^{Lambda_{n-1} - Lambda_j}) (outer) kn_j
// Entries t >= first_recompute get their u_t recomputed in order from the full-precision S_c first
// (every entry when a read copy served the window, so read-copy rounding never reaches the state; the
// step's own token, which no op has computed yet, when there is no copy):
//     u_t[v] = beta_t (v_t[v] - e^{Lambda_t} (S_c kn_t)[v] - sum_{j<t} c_tj u_j[v]),
//     c_tj = e^{Lambda_t - Lambda_j} kn_j . kn_t          (shared by all rows v)
// The state rows do not interact: the CTA takes them in passes of 32 (a row over 8 lanes, K/8 elements
// a lane), and per pass each row's dot products with kn_t, its recurrence (a triangular solve whose
// entries the row's 8 lanes share, fold_passes) and its fold, from the row in registers: K/8 floats a
// thread (the next pass's rows come in by cp.async meanwhile), so the routine fits the step's 64
// registers.
// Decays: e^{Lambda_t} from prefix sums; e^{Lambda_t - Lambda_j} = exp(g_{j+1} + ... + g_t) from suffix
// sums, never a difference of prefix sums (no cancellation when |Lambda| is large).
// Exactness: fp32, no fast math; per element s = e^{Lambda} S_c, then for j = 0 .. n-1:
// s = fma(u_j[v] e^{Lambda - Lambda_j}, kn_j[k], s), in every kernel.
//
// ---- Interface -----------------------------------------------------------------------------------
// The step: Fold<K, V, ckpt, copy, read, act>::head (below), all 256 threads: stages the entries,
// reads the checkpoint rows (cp.async, a pass ahead), writes the checkpoint and the read copy, o = S q.
// The fold kernel uses the pieces, in this order, all threads each:
//   1. FoldView ws(smem, L): FoldWorkspace::bytes(L) bytes of 16-byte aligned shared memory, a raw
//      area (the staged entries as stored) and an fp32 area.
//   2. stage_window(ws, cache, slot, v_head, k_head, count, first_recompute): cp.async of buffer
//      entries 0 .. count-1 (one commit group); stage_tail(ws, tail, j, first_recompute): an entry
//      from elsewhere (the step's token) into entry j with plain loads.
//   3. prepare_entries(ws, n, first_recompute, use_qk_l2norm): waits for all cp.async groups, normalised
//      keys, decays, U (stored u_j, or v_t to be corrected), the c_tj. Begins and ends with a CTA
//      barrier; afterwards the raw area is free (the next item may be staged at once).
//   4. fold_passes(ws, n, first_recompute, rows, first_rows, sink, q, o): the passes; `rows` gives a
//      pass's rows (StagedRows: from the checkpoint by cp.async, a pass ahead; RegisterRows: a tile in
//      registers),
//      `sink` stores them (CheckpointSink: checkpoint + read copy; StateSink: materialize's output).
//      No CTA barrier; the caller puts one before the workspace is staged again for a later fold.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cache/read_copy_store.cuh"
#include "common/bulk_copy.cuh"
#include "common/convert.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "families/gdn/gates.cuh"
#include "families/gdn/params.h"

namespace replayssm {
namespace gdn {

constexpr int kFoldThreads = 256;  // the CTA of every kernel that folds (and of verify)
constexpr int kRowLanes = 8;       // lanes per state row
constexpr unsigned kFullMask = 0xffffffffu;
static_assert(kGdnMaxBufferLen <= 64, "the scalar passes hold two entries per lane");

// The thread map of a [V][K] tile: a row over 8 lanes of a warp, lane l of the row (its index, lane())
// holding K/32 blocks of 4 columns, block b at columns 4 (l + 8 ((b + row) % (K/32))); 32 rows per pass,
// thread rows row(r) for pass r < R. The columns a row's lane sums, and their order, depend only on the
// row, so the rows may sit anywhere in the CTA: they are placed so that every shared-memory read of a
// key (kn_t, q) is half the bytes it would be. A warp holds 4 rows of one rotation (row % (K/32) =
// warp % 4), warp lane p holding lane (p >> 1) & 7 of its row a + 2 c (a = p & 1, c = (p >> 4) & 1), a
// row's lanes 2 apart (kLaneStride): lanes p and p ^ 1 then read the same 16 bytes of a key, and the
// hardware packs such a warp's 128-bit shared load into 2 wavefronts instead of 4 (the loads of kn_j
// were what bounded the fold: one 128-bit load a 4 fma). The 8 lanes of a row still cover 128
// contiguous bytes of fp32 (whole lines per store); a dense [V][K] tile in shared memory (the fold
// kernel's and verify's ring) is read with a 2-way bank conflict, once per tile.
template <int kK, int kV>
struct TileMap {
  static_assert(kK == 64 || kK == 128, "K (head_k_dim) must be 64 or 128");
  static_assert(kV == 64 || kV == 128, "V (head_v_dim) must be 64 or 128");
  static_assert(kFoldThreads == 256, "the row placement is written for 8 warps");
  static constexpr int kRowsPerPass = kFoldThreads / kRowLanes;  // 32
  static constexpr int R = kV / kRowsPerPass;                    // passes / rows per thread: 2 or 4
  static constexpr int kBlocks = kK / (4 * kRowLanes);           // 4-column blocks per lane and row: 2 or 4
  static constexpr int kSpan = kRowLanes / R;                    // lanes holding one row's rows_dot sum
  static constexpr int kLaneStride = 2;                          // warp lanes between a row's lanes

  __device__ static int lane() { return (static_cast<int>(threadIdx.x) >> 1) & (kRowLanes - 1); }
  __device__ static int first_row() {
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5;
    return (warp & 3) + 4 * ((tid & 1) + 2 * ((tid >> 4) & 1) + 4 * (warp >> 2));
  }
  __device__ static int row(int r) { return first_row() + kRowsPerPass * r; }
  __device__ static int col(int b) { return 4 * (lane() + kRowLanes * ((b + first_row()) % kBlocks)); }
  // The warp lane holding lane i of this thread's rows (a shuffle's source).
  __device__ static int lane_of(int i) { return (static_cast<int>(threadIdx.x) & 0x11) | (i << 1); }
  // After rows_dot: the thread row (index r < R) whose sum this lane holds, and whether it stores it.
  __device__ static int dot_row() { return lane() / kSpan; }
  __device__ static bool dot_writer() { return lane() % kSpan == 0; }
};

// A thread's part of a whole [V][K] tile in fp32: s[r] = row row(r), s[r][b] = columns col(b) .. + 3.
template <int kK, int kV>
struct TileFrag {
  float s[TileMap<kK, kV>::R][TileMap<kK, kV>::kBlocks][4];
};

// ---- Keys and row dot products -------------------------------------------------------------------

// One key (or query) of K activations normalised by one warp: lane l takes elements l K/32 ..
// (l + 1) K/32 - 1, its squares summed in order, then a butterfly over the warp; out = (x
// key_scale(sum)) scale (gates.cuh; scale 1 for keys, exact). Every lane calls.
template <int kK, DType kAct>
__device__ __forceinline__ void normalize_key(const typename Storage<kAct>::type* raw, float* out, bool l2norm,
                                              float scale = 1.0f) {
  constexpr int kPer = kK / 32;  // 4 or 2 elements per lane
  const int lane = static_cast<int>(threadIdx.x) & 31;
  float x[kPer];
  if constexpr (kPer == 4) {
    Vec4<kAct>::to_float(*reinterpret_cast<const typename Vec4<kAct>::Raw*>(raw + lane * 4), x);
  } else {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(raw + lane * 2);
    const typename Storage<kAct>::type* h = reinterpret_cast<const typename Storage<kAct>::type*>(&w);
    x[0] = to_float(h[0]);
    x[1] = to_float(h[1]);
  }
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < kPer; ++e) ss = fmaf(x[e], x[e], ss);
  const float inv = key_scale(row_sum<32>(ss), l2norm);
#pragma unroll
  for (int e = 0; e < kPer; ++e) out[lane * kPer + e] = (x[e] * inv) * scale;
}

// One row's dot product with a K-vector in shared memory (fp32 [K]): the lane's blocks in order, then
// a butterfly over the row's 8 lanes (every lane of the row gets it). Every lane of the warp calls it.
template <int kK, int kV>
__device__ __forceinline__ float row_dot(const float (&x)[TileMap<kK, kV>::kBlocks][4], const float* vec) {
  using M = TileMap<kK, kV>;
  float d = 0.0f;
#pragma unroll
  for (int b = 0; b < M::kBlocks; ++b) {
    const float4 y = *reinterpret_cast<const float4*>(vec + M::col(b));
    d = fmaf(x[b][0], y.x, d);
    d = fmaf(x[b][1], y.y, d);
    d = fmaf(x[b][2], y.z, d);
    d = fmaf(x[b][3], y.w, d);
  }
  return row_sum<kRowLanes, M::kLaneStride>(d);
}

// The same for all R rows of a thread's tile at once, reduced by a reduce-scatter over the row's 8
// lanes (3-4 shuffles for all rows instead of 3 per row; bitwise row_dot's sums, reduce.cuh): returns,
// in every lane, the total of its row TileMap::dot_row() (the lanes with dot_writer() store it).
template <int kK, int kV>
__device__ __forceinline__ float rows_dot(const TileFrag<kK, kV>& f, const float* vec) {
  using M = TileMap<kK, kV>;
  float part[M::R];
#pragma unroll
  for (int r = 0; r < M::R; ++r) part[r] = 0.0f;
#pragma unroll
  for (int b = 0; b < M::kBlocks; ++b) {
    const float4 y = *reinterpret_cast<const float4*>(vec + M::col(b));
#pragma unroll
    for (int r = 0; r < M::R; ++r) {
      part[r] = fmaf(f.s[r][b][0], y.x, part[r]);
      part[r] = fmaf(f.s[r][b][1], y.y, part[r]);
      part[r] = fmaf(f.s[r][b][2], y.z, part[r]);
      part[r] = fmaf(f.s[r][b][3], y.w, part[r]);
    }
  }
  return reduce_scatter_rows<kRowLanes, M::R, M::kLaneStride>(part, SumOp{});
}

// The whole tile from shared memory, [V][K] rows of kSrc contiguous (a bulk copy of the tile).
template <int kK, int kV, DType kSrc>
__device__ __forceinline__ void load_tile_shared(TileFrag<kK, kV>& f, const unsigned char* tile) {
  using M = TileMap<kK, kV>;
  using V4 = Vec4<kSrc>;
#pragma unroll
  for (int r = 0; r < M::R; ++r) {
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) {
      const size_t off = (static_cast<size_t>(M::row(r)) * kK + M::col(b)) * dtype_size(kSrc);
      V4::to_float(*reinterpret_cast<const typename V4::Raw*>(tile + off), f.s[r][b]);
    }
  }
}

// ---- Row sources and sinks of fold_passes ----------------------------------------------------------

// The rows of a tile in global memory (element (v, k) at base[offset + v * row_stride + k]), fetched a
// pass ahead by cp.async into shared memory (`area`, kAreaBytes): each thread copies and later reads only
// its own blocks, [block][thread] so that a warp's reads are conflict-free, so no CTA barrier is needed,
// and the rows in flight take no registers (in registers they made the 64-register step spill at
// K = V = 128). fetch issues the copies, convert waits for this thread's copies and reads them.
template <int kK, int kV, DType kSrc>
struct StagedRows {
  using M = TileMap<kK, kV>;
  using V4 = Vec4<kSrc>;
  static_assert(kSrc != DType::kFloat8E4M3, "checkpoints are fp32 / bf16 / fp16");
  static constexpr int kBlockBytes = 4 * dtype_size(kSrc);  // 16 (fp32) or 8 (16-bit)
  static constexpr size_t kAreaBytes = static_cast<size_t>(M::kBlocks) * kFoldThreads * kBlockBytes;
  struct Raw {};
  const void* base;
  int64_t offset, row_stride;
  unsigned char* area;
  __device__ unsigned char* block(int b) const { return area + (b * kFoldThreads + threadIdx.x) * kBlockBytes; }
  __device__ Raw fetch(int r) const {
    const unsigned char* row = static_cast<const unsigned char*>(base) + (offset + M::row(r) * row_stride) * dtype_size(kSrc);
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) {
      const unsigned char* src = row + M::col(b) * dtype_size(kSrc);
      if constexpr (kBlockBytes == 16) {
        cp_async16(block(b), src);
      } else {
        cp_async8(block(b), src);
      }
    }
    cp_async_commit();
    return Raw{};
  }
  __device__ void convert(const Raw&, float (&x)[M::kBlocks][4]) const {
    cp_async_wait_all();
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) V4::to_float(*reinterpret_cast<const typename V4::Raw*>(block(b)), x[b]);
  }
};

// The rows of a tile already in registers (the fold kernel loads whole tiles from its ring).
template <int kK, int kV>
struct RegisterRows {
  using M = TileMap<kK, kV>;
  struct Raw {
    float b[M::kBlocks][4];
  };
  const TileFrag<kK, kV>& f;
  __device__ Raw fetch(int r) const {  // r a compile-time index after unrolling
    Raw raw;
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) {
#pragma unroll
      for (int q = 0; q < 4; ++q) raw.b[b][q] = f.s[r][b][q];
    }
    return raw;
  }
  __device__ void convert(const Raw& raw, float (&x)[M::kBlocks][4]) const {
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) {
#pragma unroll
      for (int q = 0; q < 4; ++q) x[b][q] = raw.b[b][q];
    }
  }
};

// A folded row into the checkpoint (its dtype; kStreaming: evict-first stores) and, with kCopy, the
// read copy made from it as stored (bitwise make_read_copy's rule, cache/read_copy_store.cuh).
template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, bool kStreaming>
struct CheckpointSink {
  using M = TileMap<kK, kV>;
  const GdnCache& c;
  int64_t slot;
  int v_head;
  __device__ void operator()(int v, const float (&s)[M::kBlocks][4]) const {
    const int64_t at = slot * c.ck_slot_stride + v_head * c.ck_head_stride + v * c.ck_row_stride;
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) store4<kCkpt, kStreaming>(c.checkpoint, at + M::col(b), s[b]);
    if constexpr (kCopy) {
      store_read_copy_blocks<kCkpt, kRead, kRowLanes, M::kBlocks, M::kLaneStride>(c, slot, v_head, v,
                                                                                 [](int b) { return M::col(b); }, s);
    }
  }
};

// A folded row into materialize's fp32 output (element (v, k) at out[offset + v * row_stride + k]).
template <int kK, int kV>
struct StateSink {
  using M = TileMap<kK, kV>;
  float* out;
  int64_t offset, row_stride;
  __device__ void operator()(int v, const float (&s)[M::kBlocks][4]) const {
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) store4<DType::kFloat32>(out, offset + v * row_stride + M::col(b), s[b]);
  }
};

// ---- Workspace -------------------------------------------------------------------------------------
// Raw area (cp.async, or the caller's plain stores): k [L][K] act; vu [L][V] fp32-sized rows holding
// u_j (fp32) for a stored entry or v_t (act, the row's first half) for a recomputed one; g, beta [L].
// fp32 area: kn [L][K] normalised keys; U [L][V] (u_j, or v_t until the passes correct it to u_t);
// coef [L][L] (c_tj at [j][t]: a row's lanes read consecutive t); elam (e^{Lambda_t}), rel
// (e^{Lambda - Lambda_j}), beta [L]; the decay e^{Lambda}.
//
// KDA (kVectorGate: a log decay per key channel) appends the raw log decays gv [L][K] and the decay
// e^{Lambda} per channel [K]; g, rel and elam are unused. prepare_entries then overwrites kn_j with the
// fold key kd_j = kn_j e^{Lambda - Lambda_j} (per channel) and writes the recompute keys kel_t =
// e^{Lambda_t} kn_t [L][K] fp32 over the raw k / vu area (2 L K + 4 L V >= 4 L K bytes as V >= K / 2),
// so the whole raw area is in use until the passes end.
template <int kK, int kV, bool kVectorGate = false>
struct FoldWorkspace {
  __host__ __device__ static constexpr size_t a16(size_t b) { return (b + 15) / 16 * 16; }
  __host__ __device__ static constexpr size_t k_raw(int) { return 0; }
  __host__ __device__ static constexpr size_t vu_raw(int L) { return 2 * static_cast<size_t>(L) * kK; }
  __host__ __device__ static constexpr size_t g_raw(int L) { return vu_raw(L) + 4 * static_cast<size_t>(L) * kV; }
  __host__ __device__ static constexpr size_t beta_raw(int L) { return g_raw(L) + a16(4 * static_cast<size_t>(L)); }
  __host__ __device__ static constexpr size_t kn(int L) { return beta_raw(L) + a16(4 * static_cast<size_t>(L)); }
  __host__ __device__ static constexpr size_t U(int L) { return kn(L) + 4 * static_cast<size_t>(L) * kK; }
  __host__ __device__ static constexpr size_t coef(int L) { return U(L) + 4 * static_cast<size_t>(L) * kV; }
  __host__ __device__ static constexpr size_t scalars(int L) { return coef(L) + a16(4 * static_cast<size_t>(L) * L); }
  __host__ __device__ static constexpr size_t gdn_bytes(int L) { return scalars(L) + 3 * a16(4 * static_cast<size_t>(L)) + 16; }
  __host__ __device__ static constexpr size_t gv(int L) { return gdn_bytes(L); }
  __host__ __device__ static constexpr size_t channel_decay(int L) { return gv(L) + 4 * static_cast<size_t>(L) * kK; }
  __host__ __device__ static constexpr size_t bytes(int L) {
    return kVectorGate ? channel_decay(L) + 4 * static_cast<size_t>(kK) : gdn_bytes(L);
  }
  static_assert(2 * kK + 4 * kV >= 4 * kK, "KDA's kel fits the raw k / vu area");
};

// The workspace's arrays; only the base and L are kept (the addresses are cheap to form again, and a
// pointer per array held across a fold cost registers the rows need).
template <int kK, int kV, DType kAct, bool kVectorGate = false>
struct FoldView {
  using Act = typename Storage<kAct>::type;
  using W = FoldWorkspace<kK, kV, kVectorGate>;
  unsigned char* base;
  int L;
  __device__ FoldView(unsigned char* b, int buffer_len) : base(b), L(buffer_len) {}
  __device__ Act* k_raw() const { return reinterpret_cast<Act*>(base + W::k_raw(L)); }
  __device__ float* u_raw(int j) const { return reinterpret_cast<float*>(base + W::vu_raw(L)) + j * kV; }
  __device__ Act* v_raw(int j) const { return reinterpret_cast<Act*>(u_raw(j)); }
  __device__ float* g_raw() const { return reinterpret_cast<float*>(base + W::g_raw(L)); }
  __device__ float* beta_raw() const { return reinterpret_cast<float*>(base + W::beta_raw(L)); }
  __device__ float* kn() const { return reinterpret_cast<float*>(base + W::kn(L)); }
  __device__ float* U() const { return reinterpret_cast<float*>(base + W::U(L)); }
  __device__ float* coef() const { return reinterpret_cast<float*>(base + W::coef(L)); }
  __device__ float* scalar(int i) const {
    return reinterpret_cast<float*>(base + W::scalars(L) + i * W::a16(4 * static_cast<size_t>(L)));
  }
  __device__ float* elam() const { return scalar(0); }
  __device__ float* rel() const { return scalar(1); }
  __device__ float* beta() const { return scalar(2); }
  __device__ float* decay() const { return scalar(3); }
  // KDA only.
  __device__ float* gv_raw() const { return reinterpret_cast<float*>(base + W::gv(L)); }
  __device__ float* channel_decay() const { return reinterpret_cast<float*>(base + W::channel_decay(L)); }
  __device__ float* kel() const { return reinterpret_cast<float*>(base); }
};

// The step's own token, folded as the last entry: not in the buffers.
struct FoldTail {
  const void* k = nullptr;  // raw key of the token's k-head (activation dtype, K elements, 16-byte
                            // aligned); nullptr: no tail (commit / flush / materialize)
  const void* v = nullptr;  // raw value (activation dtype, V elements, 16-byte aligned)
  float g = 0.0f, beta = 0.0f;  // the token's log decay and beta (gates.cuh)
  const float* g_channels = nullptr;  // KDA: the token's K log decays (fp32, 16-byte aligned); g unused
  // The token's u (fp32, V values, 16-byte aligned), used as stored when the tail is not recomputed
  // (first_recompute == n: a caller that computed it already); nullptr: recompute it.
  const float* u = nullptr;
};

// ---- The fold -------------------------------------------------------------------------------------

// Buffer entries 0 .. count-1 of (slot, v_head) into the raw area, one cp.async group: the keys of
// k_head, the stored u_j for j < first_recompute and the values v_t from it on, g and beta. Each thread
// copies one 16-byte chunk column of the rows (no per-thread index tables for the compiler to hold).
template <int kK, int kV, DType kAct, bool kVectorGate>
__device__ __forceinline__ void stage_window(const FoldView<kK, kV, kAct, kVectorGate>& ws, const GdnCache& c, int64_t slot,
                                             int v_head, int k_head, int count, int first_recompute,
                                             int64_t gb_entry_stride = 0) {
  using Act = typename Storage<kAct>::type;
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int kKC = kK / 8, kVC = kV / 8, kUC = kV / 4;  // 16-byte chunks of a key, a value, a u row
  const int stored = first_recompute < count ? first_recompute : count;
  {
    const int kc = tid % kKC;
    const Act* src = static_cast<const Act*>(c.k_buf) + slot * c.kb_slot_stride + k_head * c.kb_head_stride + kc * 8;
    for (int j = tid / kKC; j < count; j += kFoldThreads / kKC) cp_async16(ws.k_raw() + j * kK + kc * 8, src + j * c.kb_entry_stride);
  }
  {
    const int uc = tid % kUC;
    const float* src = c.u_buf + slot * c.ub_slot_stride + v_head * c.ub_head_stride + uc * 4;
    for (int j = tid / kUC; j < stored; j += kFoldThreads / kUC) cp_async16(ws.u_raw(j) + uc * 4, src + j * c.ub_entry_stride);
  }
  {
    const int vc = tid % kVC;
    const Act* src = static_cast<const Act*>(c.v_buf) + slot * c.vb_slot_stride + v_head * c.vb_head_stride + vc * 8;
    for (int j = stored + tid / kVC; j < count; j += kFoldThreads / kVC) cp_async16(ws.v_raw(j) + vc * 8, src + j * c.vb_entry_stride);
  }
  if constexpr (kVectorGate) {  // KDA: entry j's K log decays (g_buf's channels contiguous, 16-byte aligned)
    constexpr int kGC = kK / 4;
    const int gc = tid % kGC;
    const float* src = c.g_buf + slot * c.gb_slot_stride + v_head * c.gb_head_stride + gc * 4;
    for (int j = tid / kGC; j < count; j += kFoldThreads / kGC) cp_async16(ws.gv_raw() + j * kK + gc * 4, src + j * gb_entry_stride);
    if (tid >= kFoldThreads / 2 && tid - kFoldThreads / 2 < count) {
      const int j = tid - kFoldThreads / 2;
      cp_async4(ws.beta_raw() + j, c.beta_buf + slot * c.bb_slot_stride + v_head * c.bb_head_stride + j);
    }
  } else if (tid < count) {
    cp_async4(ws.g_raw() + tid, c.g_buf + slot * c.gb_slot_stride + v_head * c.gb_head_stride + tid);
  } else if (tid >= kFoldThreads / 2 && tid - kFoldThreads / 2 < count) {
    const int j = tid - kFoldThreads / 2;
    cp_async4(ws.beta_raw() + j, c.beta_buf + slot * c.bb_slot_stride + v_head * c.bb_head_stride + j);
  }
  cp_async_commit();
}

// The step's token as entry j, from anywhere the generic address space reaches: its value to be
// corrected (recompute: j >= first_recompute), or its u as given.
template <int kK, int kV, DType kAct, bool kVectorGate>
__device__ __forceinline__ void stage_tail(const FoldView<kK, kV, kAct, kVectorGate>& ws, const FoldTail& tail, int j,
                                           int first_recompute) {
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int kKC = kK / 8, kVC = kV / 8, kUC = kV / 4;
  if constexpr (kVectorGate) {  // the token's K log decays, by the threads the branches below leave idle
    if (tid >= 128 && tid - 128 < kK / 4) {
      reinterpret_cast<float4*>(ws.gv_raw() + j * kK)[tid - 128] = reinterpret_cast<const float4*>(tail.g_channels)[tid - 128];
    }
  }
  if (tid < kKC) {
    reinterpret_cast<uint4*>(ws.k_raw() + j * kK)[tid] = reinterpret_cast<const uint4*>(tail.k)[tid];
  } else if (tid >= 32 && tid - 32 < kVC && j >= first_recompute) {
    reinterpret_cast<uint4*>(ws.v_raw(j))[tid - 32] = reinterpret_cast<const uint4*>(tail.v)[tid - 32];
  } else if (tid >= 32 && tid - 32 < kUC && j < first_recompute) {
    reinterpret_cast<float4*>(ws.u_raw(j))[tid - 32] = reinterpret_cast<const float4*>(tail.u)[tid - 32];
  } else if (tid == 64) {
    ws.g_raw()[j] = tail.g;
    ws.beta_raw()[j] = tail.beta;
  }
}

// Lanes l (< 32) hold g_l and g_{l+32} (0 past the window): after0 / after1 = the sum of the entries
// after entry l / l + 32 (g_{j+1} + ... + g_63, suffix sums: the reverse of warp_inclusive_sum's order),
// total = the sum of all, in every lane.
__device__ __forceinline__ void suffix_after(float g0, float g1, float& after0, float& after1, float& total) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const float s1 = warp_inclusive_suffix_sum(g1);
  const float upper = __shfl_sync(kFullMask, s1, 0);
  const float s0 = warp_inclusive_suffix_sum(g0) + upper;
  const float next0 = __shfl_down_sync(kFullMask, s0, 1);
  const float next1 = __shfl_down_sync(kFullMask, s1, 1);
  total = __shfl_sync(kFullMask, s0, 0);
  after0 = lane < 31 ? next0 : upper;
  after1 = lane < 31 ? next1 : 0.0f;
}

// KDA's step 3 (prepare_entries with kVectorGate): keys, beta, U as GDN's; then, per key channel,
//   c_tj = sum_k kn_j[k] kn_t[k] e^{Lambda_t[k] - Lambda_j[k]}   (a warp per t, lanes over K, the
//          exponent the suffix sum g_t + g_{t-1} + .. + g_{j+1} built from t down, never positive)
//   kel_t = e^{Lambda_t} kn_t (prefix sums), kd_j = e^{Lambda - Lambda_j} kn_j (suffix sums, over kn_j),
//   e^{Lambda} per channel: a thread per channel, no exponent positive and no difference of sums.
template <int kK, int kV, DType kAct>
__device__ __forceinline__ void prepare_channel_entries(const FoldView<kK, kV, kAct, true>& ws, int n, int first_recompute,
                                                        bool l2norm) {
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid & 31;
  constexpr int kWarps = kFoldThreads / 32;
  constexpr int kPer = kK / 32;
  const int L = ws.L;
  cp_async_wait_all();
  __syncthreads();  // the staged entries (and a caller's own) are in; the last fold's readers are done
  for (int j = first_recompute + tid; j < n; j += kFoldThreads) ws.beta()[j] = ws.beta_raw()[j];
  for (int j = warp; j < n; j += kWarps) normalize_key<kK, kAct>(ws.k_raw() + j * kK, ws.kn() + j * kK, l2norm);
  for (int i = tid; i < n * kV; i += kFoldThreads) {
    const int j = i / kV, v = i % kV;
    ws.U()[i] = j < first_recompute ? ws.u_raw(j)[v] : to_float(ws.v_raw(j)[v]);
  }
  __syncthreads();  // kn in; the raw k and vu are consumed (kel goes over them)
  for (int t = first_recompute + warp; t < n; t += kWarps) {
    float kt[kPer], acc[kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      kt[e] = ws.kn()[t * kK + lane * kPer + e];
      acc[e] = 0.0f;
    }
    for (int j = t - 1; j >= 0; --j) {
      float d = 0.0f;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        acc[e] += ws.gv_raw()[(j + 1) * kK + lane * kPer + e];
        d = fmaf(ws.kn()[j * kK + lane * kPer + e] * expf(acc[e]), kt[e], d);
      }
      d = row_sum<32>(d);
      if (lane == 0) ws.coef()[j * L + t] = d;
    }
  }
  __syncthreads();  // the coefficients have read kn
  for (int ch = tid; ch < kK; ch += kFoldThreads) {
    float prefix = 0.0f;
    for (int j = 0; j < n; ++j) {
      prefix += ws.gv_raw()[j * kK + ch];
      if (j >= first_recompute) ws.kel()[j * kK + ch] = expf(prefix) * ws.kn()[j * kK + ch];
    }
    float after = 0.0f;  // g_{j+1} + .. + g_{n-1}
    for (int j = n - 1; j >= 0; --j) {
      ws.kn()[j * kK + ch] *= expf(after);
      after += ws.gv_raw()[j * kK + ch];
    }
    ws.channel_decay()[ch] = expf(after);  // 1 when n = 0
  }
  __syncthreads();
}

// Step 3: keys, scalars, U, and the coefficients of the recomputed entries.
template <int kK, int kV, DType kAct, bool kVectorGate>
__device__ __forceinline__ void prepare_entries(const FoldView<kK, kV, kAct, kVectorGate>& ws, int n, int first_recompute, bool l2norm) {
  if constexpr (kVectorGate) {
    prepare_channel_entries(ws, n, first_recompute, l2norm);
    return;
  }
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid & 31;
  constexpr int kWarps = kFoldThreads / 32;
  const int L = ws.L;
  cp_async_wait_all();
  __syncthreads();  // the staged entries (and a caller's own) are in; the last fold's readers are done
  if (warp == kWarps - 1) {
    const float g0 = lane < n ? ws.g_raw()[lane] : 0.0f;
    const float g1 = lane + 32 < n ? ws.g_raw()[lane + 32] : 0.0f;
    float after0, after1, total;  // e^{Lambda - Lambda_j} = exp(g_{j+1} + ... + g_{n-1}); e^{Lambda}
    suffix_after(g0, g1, after0, after1, total);
    const float p0 = warp_inclusive_sum(g0);
    const float p1 = warp_inclusive_sum(g1) + __shfl_sync(kFullMask, p0, 31);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = lane + 32 * h;
      if (j < n) {
        ws.rel()[j] = expf(h == 0 ? after0 : after1);
        if (j >= first_recompute) {
          ws.elam()[j] = expf(h == 0 ? p0 : p1);
          ws.beta()[j] = ws.beta_raw()[j];
        }
      }
    }
    if (lane == 0) *ws.decay() = expf(n > 0 ? total : 0.0f);
  }
  for (int j = warp; j < n; j += kWarps) normalize_key<kK, kAct>(ws.k_raw() + j * kK, ws.kn() + j * kK, l2norm);
  for (int i = tid; i < n * kV; i += kFoldThreads) {
    const int j = i / kV, v = i % kV;
    ws.U()[i] = j < first_recompute ? ws.u_raw(j)[v] : to_float(ws.v_raw(j)[v]);
  }
  // c_tj = e^{Lambda_t - Lambda_j} kn_j . kn_t for t >= first_recompute, j < t, in two parts: first the
  // decays (a warp per t, from the suffix sums of g_{j+1} .. g_t, lane j & 31 storing entry j's), then,
  // after the barrier, the dots: a warp per (t, j) pair, the lanes splitting K, lane 0 multiplying the
  // decay by the dot. The pairs, not the t, are spread over the warps: without a read copy only the
  // last entry is recomputed, and a warp per t left its t dots to one warp while seven waited.
  for (int t = first_recompute + warp; t < n; t += kWarps) {
    const float g0 = lane <= t ? ws.g_raw()[lane] : 0.0f;
    const float g1 = lane + 32 <= t ? ws.g_raw()[lane + 32] : 0.0f;
    float after0, after1, total;
    suffix_after(g0, g1, after0, after1, total);
    if (lane < t) ws.coef()[lane * L + t] = expf(after0);
    if (lane + 32 < t) ws.coef()[(lane + 32) * L + t] = expf(after1);
  }
  __syncthreads();
  constexpr int kPer = kK / 32;
  // Pair (t, j), t >= first_recompute, j < t, in the order t-major: this warp's first, then every
  // kWarps-th (the walk is uniform over the warp).
  int t = first_recompute, j = warp;
  while (t < n && j >= t) j -= t++;
  while (t < n) {
    float d = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) d = fmaf(ws.kn()[j * kK + lane * kPer + e], ws.kn()[t * kK + lane * kPer + e], d);
    d = row_sum<32>(d);
    if (lane == 0) ws.coef()[j * L + t] *= d;
    j += kWarps;
    while (t < n && j >= t) j -= t++;
  }
  __syncthreads();
}

// Step 4: the passes first_pass .. last_pass - 1 (all by default: a step CTA that folds a part of the
// rows takes its passes). first_rows = rows.fetch(first_pass), issued by the caller as early as it
// likes.
// KDA (kVectorGate): a_t = v_t - S_c kel_t, the row decayed per column, and the fold's key kd_j (in
// kn) with rel 1.
template <int kK, int kV, DType kAct, bool kVectorGate, class Rows, class Sink>
__device__ __forceinline__ void fold_passes(const FoldView<kK, kV, kAct, kVectorGate>& ws, int n, int first_recompute, const Rows& rows,
                                            typename Rows::Raw first_rows, const Sink& sink, const float* q, float* o,
                                            int first_pass = 0, int last_pass = TileMap<kK, kV>::R) {
  using M = TileMap<kK, kV>;
  const int L = ws.L;
  const bool writer = M::lane() == 0;
  typename Rows::Raw next = first_rows;
#pragma unroll
  for (int r = 0; r < M::R; ++r) {
    if (r < first_pass || r >= last_pass) continue;
    float x[M::kBlocks][4];
    rows.convert(next, x);
    const int v = M::row(r);
    float* u_col = ws.U() + v;
    // u_t for t >= first_recompute: a_t = v_t - e^{Lambda_t} (S_c kn_t) first, for all t at once (the
    // dots do not depend on each other; lane t % 8 of the row keeps a_t in U[t]), then the triangular
    // solve u_t = beta_t (a_t - sum_{j<t} c_tj u_j) in blocks of 8 entries, lane l of the row holding
    // entry b0 + l of block b0: the terms of the entries before the block (u_j known, in U), then the
    // block's own in order, each u_j passed from its lane by a shuffle. Every acc_t takes its terms in
    // the order j = 0, 1, .., t - 1, so the bits are those of the row-by-row form, but the chain is one
    // fma and one shuffle per entry instead of a dot, a butterfly and t fmas.
    const int lane = M::lane();
#pragma unroll 2
    for (int t = first_recompute; t < n; ++t) {
      if constexpr (kVectorGate) {
        const float p = row_dot<kK, kV>(x, ws.kel() + t * kK);
        if (lane == t % kRowLanes) u_col[t * kV] -= p;
      } else {
        const float p = row_dot<kK, kV>(x, ws.kn() + t * kK);
        if (lane == t % kRowLanes) u_col[t * kV] = fmaf(-ws.elam()[t], p, u_col[t * kV]);
      }
    }
    if constexpr (kVectorGate) {
#pragma unroll
      for (int b = 0; b < M::kBlocks; ++b) {
        const float4 d = *reinterpret_cast<const float4*>(ws.channel_decay() + M::col(b));
        x[b][0] *= d.x;
        x[b][1] *= d.y;
        x[b][2] *= d.z;
        x[b][3] *= d.w;
      }
    } else {
      const float decay = *ws.decay();
#pragma unroll
      for (int b = 0; b < M::kBlocks; ++b) {
#pragma unroll
        for (int k = 0; k < 4; ++k) x[b][k] *= decay;
      }
    }
    // The next pass's rows, in flight during the solve, this fold and its stores; fetched only now
    // that every value of this pass's rows has been used (a staged source reuses the same shared
    // memory).
    if (r + 1 < last_pass) next = rows.fetch(r + 1);
#pragma unroll 1
    for (int b0 = first_recompute - first_recompute % kRowLanes; b0 < n; b0 += kRowLanes) {
      const int t = b0 + lane;
      const bool mine = t >= first_recompute && t < n;
      const float* ct = ws.coef() + t;  // c_tj at ct[j * L]
      float acc = mine ? u_col[t * kV] : 0.0f;
#pragma unroll 4
      for (int j = 0; j < b0; ++j) {
        const float uj = u_col[j * kV];
        if (mine) acc = fmaf(-ct[j * L], uj, acc);
      }
#pragma unroll 1
      for (int j = b0; j < n && j < b0 + kRowLanes; ++j) {
        float uj;
        if (j < first_recompute) {
          uj = u_col[j * kV];
        } else {
          uj = __shfl_sync(kFullMask, ws.beta()[j] * acc, M::lane_of(j - b0));
          if (lane == j - b0) u_col[j * kV] = uj;
        }
        if (mine && j < t) acc = fmaf(-ct[j * L], uj, acc);
      }
      __syncwarp();  // the block's u_t, stored by their lanes, before every lane reads them
    }
#pragma unroll 1
    for (int j = 0; j < n; ++j) {
      const float cj = kVectorGate ? u_col[j * kV] : u_col[j * kV] * ws.rel()[j];
      const float* kn = ws.kn() + j * kK;
#pragma unroll
      for (int b = 0; b < M::kBlocks; ++b) {
        const float4 y = *reinterpret_cast<const float4*>(kn + M::col(b));
        x[b][0] = fmaf(cj, y.x, x[b][0]);
        x[b][1] = fmaf(cj, y.y, x[b][1]);
        x[b][2] = fmaf(cj, y.z, x[b][2]);
        x[b][3] = fmaf(cj, y.w, x[b][3]);
      }
    }
    if (q != nullptr) {
      const float ov = row_dot<kK, kV>(x, q);
      if (writer) o[v] = ov;
    }
    sink(v, x);
  }
}

// The step's fused fold of one v-head (the interface it was written for). kVectorGate: KDA's (the
// tail's decays in tail.g_channels).
template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kVectorGate = false>
struct Fold {
  static constexpr int kThreads = kFoldThreads;
  using Rows = StagedRows<kK, kV, kCkpt>;
  using Workspace = FoldWorkspace<kK, kV, kVectorGate>;
  // Dynamic shared memory the routine needs (16-byte aligned base), for buffer length L: fold.cuh's
  // workspace, then the checkpoint rows in flight (4-16 KB), placed after the first `keep` bytes too
  // (the step's read-copy tile, still landing when the first rows go out).
  __host__ __device__ static constexpr size_t rows_offset(int buffer_len, size_t keep = 0) {
    return Workspace::bytes(buffer_len) > keep ? Workspace::bytes(buffer_len) : keep;
  }
  __host__ __device__ static constexpr size_t workspace_bytes(int buffer_len, size_t keep = 0) {
    return rows_offset(buffer_len, keep) + Rows::kAreaBytes;
  }

  // Called by all 256 threads (none has exited); has CTA barriers and ends with one, so `o` is visible.
  // Folds entries 0..n-1 of (slot, hv): entries 0..n-2 from the buffers and entry n-1 from `tail` when
  // tail.k != nullptr, else entries 0..n-1 from the buffers. u_j from u_buf for j < first_recompute,
  // recomputed in order from the full-precision checkpoint for j >= it (the tail's u is recomputed, or
  // tail.u with first_recompute == n: the step's replay computed it from the checkpoint). Reads the
  // checkpoint tile from global memory (a pass ahead), writes the checkpoint (its dtype) and refreshes
  // the read copy (kCopy). If q != nullptr (shared memory, K fp32: the token's query, normalised and
  // scaled), o[v] = S_new[v] . q (shared memory, V fp32) from the folded fp32 state, before its storage
  // rounding. Leaves the cursor alone. keep, pending: the first `keep` bytes of `workspace` are being
  // written by a bulk copy that completes phase 0 of the mbarrier `pending` (nullptr: none); the first
  // rows go out before the wait, the workspace is written after it. part, parts: only the rows of part
  // `part` of `parts` (a divisor of the passes R = V / 32): its passes, o and stores of its rows only.
  __device__ static void head(const GdnParams& p, int64_t slot, int hv, int n, int first_recompute, const FoldTail& tail,
                              const float* q, float* o, unsigned char* workspace, size_t keep = 0,
                              uint64_t* pending = nullptr, int part = 0, int parts = 1) {
    const int passes = TileMap<kK, kV>::R / parts;
    const int first_pass = part * passes;
    const GdnCache& c = p.cache;
    const FoldView<kK, kV, kAct, kVectorGate> ws(workspace, c.buffer_len);
    const Rows rows{c.checkpoint, slot * c.ck_slot_stride + hv * c.ck_head_stride, c.ck_row_stride,
                    workspace + rows_offset(c.buffer_len, keep)};
    const auto first_rows = rows.fetch(first_pass);  // in flight during the staging and the preparation
    if (pending != nullptr) mbarrier_wait(pending, 0);
    const bool has_tail = tail.k != nullptr;
    stage_window(ws, c, slot, hv, hv / (p.v_heads / p.heads), has_tail ? n - 1 : n, first_recompute, p.kda.gb_entry_stride);
    if (has_tail) stage_tail(ws, tail, n - 1, first_recompute);
    prepare_entries(ws, n, first_recompute, p.tokens.use_qk_l2norm);
    fold_passes(ws, n, first_recompute, rows, first_rows, CheckpointSink<kK, kV, kCkpt, kCopy, kRead, false>{c, slot, hv}, q, o,
                first_pass, first_pass + passes);
    __syncthreads();
  }
};

}  // namespace gdn
}  // namespace replayssm
