// The Gated DeltaNet fold: a slot's committed buffer entries folded into the checkpoint tile of one
// v-head, by a whole CTA of 256 threads. The one fold routine of the family: the fold kernel (commit,
// flush, materialize: fold_kernel.cuh) and the replay step's fused fold call it, so that the checkpoint
// bits do not depend on which op folded it.
//
// Math (replayssm_cuda/reference.py, _delta_fold_state). Entries j < n of the window: raw key k_j (the
// k-head's), value v_j, log decay g_j, beta_j and the stored corrected value u_j; kn_j = k_j normalised
// (k_j rsqrt(|k_j|^2 + 1e-6) when use_qk_l2norm), Lambda_j = g_0 + ... + g_j, Lambda = Lambda_{n-1}
// (0 for n = 0):
//     S = S_c e^{Lambda} + sum_{j<n} u_j (outer) kn_j e^{Lambda - Lambda_j}
// With recompute (a read copy served the window, and always for materialize) every u_t is first
// recomputed in order from the full-precision S_c, so read-copy rounding never reaches the state:
//     u_t[v] = beta_t (v_t[v] - e^{Lambda_t} (S_c kn_t)[v] - sum_{j<t} c_tj u_j[v]),
//     c_tj = e^{Lambda_t - Lambda_j} kn_j . kn_t          (shared by all rows v)
// The S_c kn_t for every t come from one pass over the tile in registers; the rows then solve their
// recurrences independently (one thread per row).
//
// ---- Interface (what a caller does, in this order; every step is called by all 256 threads) ----
//   1. FoldView<kK, kV, kAct> ws(smem, L): the workspace, FoldWorkspace<kK, kV>::bytes(L) bytes of
//      16-byte aligned shared memory (raw staging area, then the fp32 area).
//   2. stage_window(ws, cache, slot, v_head, k_head, first, count, recompute): cp.async of buffer
//      entries first .. first + count - 1 into the raw area (one commit group). A caller that holds
//      an entry itself (the step's current token) writes it instead into the raw area with plain
//      stores (ws.k_raw() + j * kK: the raw key as stored in k_buf; ws.v_raw() + j * kV: the raw value, when
//      recompute; ws.u_raw() + j * kV: u_j in fp32, when not; ws.g_raw()[j], ws.beta_raw()[j]).
//   3. prepare_window(ws, n, recompute, use_qk_l2norm): waits for the cp.async groups (all of them),
//      normalises the keys, takes Lambda and the decays, (recompute) the coefficients c_tj, else the
//      decayed keys. Ends with a CTA barrier; the raw area is free afterwards (the next item's
//      stage_window may be issued at once).
//   4. The tile S_c of the checkpoint in registers: load_tile_shared (a [V][K] tile in shared memory,
//      e.g. from a bulk copy) or load_tile_global. A caller that refills that shared memory must put a
//      CTA barrier between this load and the refill.
//   5. fold_tile(ws, frag, n, recompute): frag becomes the folded state in fp32 (before any storage
//      rounding; the step's output S q comes from it, with rows_dot). Has CTA barriers when recompute;
//      afterwards ws.U()[t * kV + TileMap::pos_of_row(v)] holds u_t[v] (recomputed, or as staged).
//   6. store_checkpoint<kCkpt, kCopy, kRead>(frag, cache, slot, v_head): the checkpoint (streaming
//      stores) and the read copy made from it as stored (bitwise make_read_copy's rule), row by row;
//      or store_tile / store_read_copy separately, store_tile<kFloat32> into materialize's output.
//   recompute: true when the cache has a read copy (the stored u came from it) and for materialize;
//   false otherwise (the stored u came from the checkpoint). Every op that folds takes this rule, the
//   step's fused fold included, so that the same buffer folds to the same checkpoint bits in any op.
//   Before the workspace is used again (the next item's prepare_window) a CTA barrier must separate it
//   from step 5's reads: prepare_window begins with one.
//
// Thread map (TileMap): a state row of K columns over 8 consecutive lanes; lane l holds K/32 blocks of
// 4 columns, block b at columns 4 (l + 8 ((b + first_row) % (K/32))): consecutive lanes cover 128
// contiguous bytes of fp32 (whole lines per store), and the rotation by row keeps the 16-bit and fp8
// shared-memory tile loads free of bank conflicts. 32 rows per pass, V/32 rows per thread (2 or 4).
// A row's dot product over its 8 lanes is a reduce-scatter of the thread's rows (rows_dot): 3-4
// shuffles for all of them instead of 3 per row.
//
// Exactness: fp32, no fast math (expf, rsqrtf as the reference's exp and rsqrt to a few ulp); the same
// FFMA sequence wherever it runs: s = e^{Lambda} S_c, then for j = 0 .. n-1: s += u_j[v] kd_j[k] with
// kd_j = kn_j e^{Lambda - Lambda_j}.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cache/read_copy_store.cuh"
#include "common/bulk_copy.cuh"
#include "common/convert.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "families/gdn/params.h"

namespace replayssm {
namespace gdn {

constexpr int kThreads = 256;    // every CTA that calls the fold routine
constexpr int kRowLanes = 8;     // lanes per state row
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kL2NormEps = 1e-6f;
static_assert(kGdnMaxBufferLen <= 64, "the scalar pass holds two entries per lane");

template <int kK, int kV>
struct TileMap {
  static_assert(kK == 64 || kK == 128, "K (head_k_dim) must be 64 or 128");
  static_assert(kV == 64 || kV == 128, "V (head_v_dim) must be 64 or 128");
  static constexpr int kRowsPerPass = kThreads / kRowLanes;  // 32
  static constexpr int R = kV / kRowsPerPass;                // rows per thread: 2 or 4
  static constexpr int kBlocks = kK / (4 * kRowLanes);       // 4-column blocks per lane and row: 2 or 4
  static constexpr int kSpan = kRowLanes / R;                // lanes that hold one row's rows_dot sum

  __device__ static int lane() { return static_cast<int>(threadIdx.x) % kRowLanes; }
  __device__ static int first_row() { return static_cast<int>(threadIdx.x) / kRowLanes; }
  __device__ static int row(int r) { return first_row() + kRowsPerPass * r; }
  __device__ static int col(int b) { return 4 * (lane() + kRowLanes * ((b + first_row()) % kBlocks)); }
  // After rows_dot: the thread row (index r < R) whose sum this lane holds, and whether it writes it.
  __device__ static int dot_row() { return lane() / kSpan; }
  __device__ static bool dot_writer() { return lane() % kSpan == 0; }
  // Rows in "position" order: a thread's R rows at consecutive positions (one vector load in the fold).
  __host__ __device__ static int pos_of_row(int v) { return (v % kRowsPerPass) * R + v / kRowsPerPass; }
  __host__ __device__ static int row_of_pos(int pos) { return pos / R + kRowsPerPass * (pos % R); }
};

// A thread's part of a [V][K] state tile in fp32: s[r][b] = row row(r), columns col(b) .. col(b) + 3.
template <int kK, int kV>
struct TileFrag {
  float s[TileMap<kK, kV>::R][TileMap<kK, kV>::kBlocks][4];
};

// ---- Workspace ------------------------------------------------------------------------------------
// Raw area (staged by cp.async, or written by the caller): k [L][K] act, v [L][V] act (recompute) or
// u [L][V] fp32 (not) in one place, g [L], beta [L] fp32. fp32 area: kn [L][K] (normalised keys, then
// decayed keys kd), U [L][V] in position order (the u_j; with recompute first v_t - e^{Lambda_t} S_c kn_t,
// then u_t), coef [L][L] (c_tj, recompute), lam, elam = e^{Lambda_t}, rel = e^{Lambda - Lambda_j},
// beta [L], and the decay e^{Lambda}.
template <int kK, int kV>
struct FoldWorkspace {
  __host__ __device__ static constexpr size_t align16(size_t b) { return (b + 15) / 16 * 16; }
  __host__ __device__ static constexpr size_t k_raw(int) { return 0; }
  __host__ __device__ static constexpr size_t vu_raw(int L) { return k_raw(L) + 2 * static_cast<size_t>(L) * kK; }
  __host__ __device__ static constexpr size_t g_raw(int L) { return vu_raw(L) + 4 * static_cast<size_t>(L) * kV; }
  __host__ __device__ static constexpr size_t beta_raw(int L) { return g_raw(L) + align16(4 * static_cast<size_t>(L)); }
  __host__ __device__ static constexpr size_t kn(int L) { return beta_raw(L) + align16(4 * static_cast<size_t>(L)); }
  __host__ __device__ static constexpr size_t U(int L) { return kn(L) + 4 * static_cast<size_t>(L) * kK; }
  __host__ __device__ static constexpr size_t coef(int L) { return U(L) + 4 * static_cast<size_t>(L) * kV; }
  __host__ __device__ static constexpr size_t scalars(int L) { return coef(L) + align16(4 * static_cast<size_t>(L) * L); }
  __host__ __device__ static constexpr size_t bytes(int L) { return scalars(L) + 4 * align16(4 * static_cast<size_t>(L)) + 16; }
};

// The workspace's arrays; only the base and L are kept (the addresses are cheap to form again, and a
// pointer per array held across a whole item cost registers the tile needs).
template <int kK, int kV, DType kAct>
struct FoldView {
  using Act = typename Storage<kAct>::type;
  using W = FoldWorkspace<kK, kV>;
  unsigned char* base;
  int L;
  __device__ FoldView(unsigned char* b, int buffer_len) : base(b), L(buffer_len) {}
  __device__ Act* k_raw() const { return reinterpret_cast<Act*>(base + W::k_raw(L)); }
  __device__ Act* v_raw() const { return reinterpret_cast<Act*>(base + W::vu_raw(L)); }      // recompute
  __device__ float* u_raw() const { return reinterpret_cast<float*>(base + W::vu_raw(L)); }  // not recompute
  __device__ float* g_raw() const { return reinterpret_cast<float*>(base + W::g_raw(L)); }
  __device__ float* beta_raw() const { return reinterpret_cast<float*>(base + W::beta_raw(L)); }
  __device__ float* kn() const { return reinterpret_cast<float*>(base + W::kn(L)); }
  __device__ float* U() const { return reinterpret_cast<float*>(base + W::U(L)); }
  __device__ float* coef() const { return reinterpret_cast<float*>(base + W::coef(L)); }
  __device__ float* scalar(int i) const { return reinterpret_cast<float*>(base + W::scalars(L) + i * W::align16(4 * static_cast<size_t>(L))); }
  __device__ float* lam() const { return scalar(0); }
  __device__ float* elam() const { return scalar(1); }
  __device__ float* rel() const { return scalar(2); }
  __device__ float* beta() const { return scalar(3); }
  __device__ float* decay() const { return scalar(4); }
};

// ---- Keys --------------------------------------------------------------------------------------------
// One key (or query) of K activations normalised by one warp, the family's one rule: lane l takes
// elements l K/32 .. (l + 1) K/32 - 1, its squares summed in order, then a butterfly over the warp;
// out = x rsqrt(sum + 1e-6) (x when !l2norm), times `scale` (queries) unless it is 1. Every lane calls.
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
  float inv = 1.0f;
  if (l2norm) {
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) ss = fmaf(x[e], x[e], ss);
    inv = rsqrtf(row_sum<32>(ss) + kL2NormEps);
  }
#pragma unroll
  for (int e = 0; e < kPer; ++e) out[lane * kPer + e] = (x[e] * inv) * scale;  // exact for scale 1
}

// Dot products of a thread's rows with a K-vector in shared memory (fp32, [K]), reduced over each row's
// 8 lanes by a reduce-scatter: returns, in every lane, the total of its row TileMap::dot_row() (the
// lanes with TileMap::dot_writer() store it). Every lane of the warp calls it.
template <int kK, int kV>
__device__ __forceinline__ float rows_dot(const TileFrag<kK, kV>& f, const float* vec) {
  using M = TileMap<kK, kV>;
  float part[M::R];
#pragma unroll
  for (int r = 0; r < M::R; ++r) part[r] = 0.0f;
#pragma unroll
  for (int b = 0; b < M::kBlocks; ++b) {
    const float4 x = *reinterpret_cast<const float4*>(vec + M::col(b));
#pragma unroll
    for (int r = 0; r < M::R; ++r) {
      part[r] = fmaf(f.s[r][b][0], x.x, part[r]);
      part[r] = fmaf(f.s[r][b][1], x.y, part[r]);
      part[r] = fmaf(f.s[r][b][2], x.z, part[r]);
      part[r] = fmaf(f.s[r][b][3], x.w, part[r]);
    }
  }
  return reduce_scatter_rows<kRowLanes, M::R>(part, SumOp{});
}

// ---- Tile loads and stores -----------------------------------------------------------------------------

// The tile from shared memory, [V][K] rows of kSrc contiguous (a bulk copy of the checkpoint's tile).
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

// The tile from global memory: element (v, k) at base[offset + v * row_stride + k].
template <int kK, int kV, DType kSrc>
__device__ __forceinline__ void load_tile_global(TileFrag<kK, kV>& f, const void* base, int64_t offset, int64_t row_stride) {
  using M = TileMap<kK, kV>;
  typename Vec4<kSrc>::Raw raw[M::R][M::kBlocks];  // every load in flight before any conversion
#pragma unroll
  for (int r = 0; r < M::R; ++r) {
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) raw[r][b] = Vec4<kSrc>::load(base, offset + M::row(r) * row_stride + M::col(b));
  }
#pragma unroll
  for (int r = 0; r < M::R; ++r) {
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) Vec4<kSrc>::to_float(raw[r][b], f.s[r][b]);
  }
}

// The tile stored in kDst (the checkpoint's dtype, or fp32 for materialize's output): element (v, k)
// at base[offset + v * row_stride + k], one whole-vector store per block; kStreaming: evict-first.
template <int kK, int kV, DType kDst, bool kStreaming = false>
__device__ __forceinline__ void store_tile(const TileFrag<kK, kV>& f, void* base, int64_t offset, int64_t row_stride) {
  using M = TileMap<kK, kV>;
#pragma unroll
  for (int r = 0; r < M::R; ++r) {
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) store4<kDst, kStreaming>(base, offset + M::row(r) * row_stride + M::col(b), f.s[r][b]);
  }
}

// The tile's rows stored in the checkpoint (kCkpt, streaming stores) and, where kRead is a read copy's
// dtype (kCopy), the read copy made from them: row by row, so that a row's registers are free once
// both are written.
template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead>
__device__ __forceinline__ void store_checkpoint(const TileFrag<kK, kV>& f, const GdnCache& c, int64_t slot, int v_head) {
  using M = TileMap<kK, kV>;
  const int64_t tile = slot * c.ck_slot_stride + v_head * c.ck_head_stride;
#pragma unroll
  for (int r = 0; r < M::R; ++r) {
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) store4<kCkpt, true>(c.checkpoint, tile + M::row(r) * c.ck_row_stride + M::col(b), f.s[r][b]);
    if constexpr (kCopy) {
      store_read_copy_blocks<kCkpt, kRead, kRowLanes, M::kBlocks>(c, slot, v_head, M::row(r), [](int b) { return M::col(b); },
                                                                  f.s[r]);
    }
  }
}

// The read copy of the tile, made from the values as a kCkpt checkpoint stores them.
template <int kK, int kV, DType kCkpt, DType kRead>
__device__ __forceinline__ void store_read_copy(const TileFrag<kK, kV>& f, const GdnCache& c, int64_t slot, int v_head) {
  using M = TileMap<kK, kV>;
#pragma unroll
  for (int r = 0; r < M::R; ++r) {
    store_read_copy_blocks<kCkpt, kRead, kRowLanes, M::kBlocks>(c, slot, v_head, M::row(r), [](int b) { return M::col(b); },
                                                                f.s[r]);
  }
}

// ---- The fold ---------------------------------------------------------------------------------------

// Buffer entries first .. first + count - 1 of (slot, v_head) into the raw area, one cp.async group:
// the keys of k_head, and the values (recompute) or the stored u (not), g and beta.
template <int kK, int kV, DType kAct>
__device__ __forceinline__ void stage_window(const FoldView<kK, kV, kAct>& ws, const GdnCache& c, int64_t slot,
                                             int v_head, int k_head, int first, int count, bool recompute) {
  using Act = typename Storage<kAct>::type;
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int kKChunks = kK / 8;  // 16-byte chunks of a key
  const Act* k_src = static_cast<const Act*>(c.k_buf) + slot * c.kb_slot_stride + k_head * c.kb_head_stride;
  for (int i = tid; i < count * kKChunks; i += kThreads) {
    const int j = first + i / kKChunks, ch = i % kKChunks;
    cp_async16(ws.k_raw() + j * kK + ch * 8, k_src + j * c.kb_entry_stride + ch * 8);
  }
  if (recompute) {
    constexpr int kVChunks = kV / 8;
    const Act* v_src = static_cast<const Act*>(c.v_buf) + slot * c.vb_slot_stride + v_head * c.vb_head_stride;
    for (int i = tid; i < count * kVChunks; i += kThreads) {
      const int j = first + i / kVChunks, ch = i % kVChunks;
      cp_async16(ws.v_raw() + j * kV + ch * 8, v_src + j * c.vb_entry_stride + ch * 8);
    }
  } else {
    constexpr int kUChunks = kV / 4;
    const float* u_src = c.u_buf + slot * c.ub_slot_stride + v_head * c.ub_head_stride;
    for (int i = tid; i < count * kUChunks; i += kThreads) {
      const int j = first + i / kUChunks, ch = i % kUChunks;
      cp_async16(ws.u_raw() + j * kV + ch * 4, u_src + j * c.ub_entry_stride + ch * 4);
    }
  }
  if (tid < count) {
    cp_async4(ws.g_raw() + first + tid, c.g_buf + slot * c.gb_slot_stride + v_head * c.gb_head_stride + first + tid);
  } else if (tid >= kThreads / 2 && tid - kThreads / 2 < count) {
    const int j = first + tid - kThreads / 2;
    cp_async4(ws.beta_raw() + j, c.beta_buf + slot * c.bb_slot_stride + v_head * c.bb_head_stride + j);
  }
  cp_async_commit();
}

// The per-entry scalars of n entries (one warp): Lambda_j by a warp prefix sum (two entries a lane),
// e^{Lambda_j}, e^{Lambda - Lambda_j} (0 from n on), beta_j, and the decay e^{Lambda}.
template <int kK, int kV, DType kAct>
__device__ __forceinline__ void window_scalars(const FoldView<kK, kV, kAct>& ws, int n) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const float g0 = lane < n ? ws.g_raw()[lane] : 0.0f;
  const float g1 = lane + 32 < n ? ws.g_raw()[lane + 32] : 0.0f;
  const float p0 = warp_inclusive_sum(g0);
  const float p1 = warp_inclusive_sum(g1) + __shfl_sync(kFullMask, p0, 31);
  const int last = n > 0 ? n - 1 : 0;
  const float at_last = __shfl_sync(kFullMask, last < 32 ? p0 : p1, last & 31);
  const float total = n > 0 ? at_last : 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = lane + 32 * h;
    if (j < n) {
      const float lam = h == 0 ? p0 : p1;
      ws.lam()[j] = lam;
      ws.elam()[j] = expf(lam);
      ws.rel()[j] = expf(total - lam);
      ws.beta()[j] = ws.beta_raw()[j];
    }
  }
  if (lane == 0) *ws.decay() = expf(total);
}

// Step 3 of the interface: keys, scalars, U, and the coefficients (recompute) or decayed keys (not).
template <int kK, int kV, DType kAct>
__device__ __forceinline__ void prepare_window(const FoldView<kK, kV, kAct>& ws, int n, bool recompute, bool l2norm) {
  using M = TileMap<kK, kV>;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid & 31;
  constexpr int kWarps = kThreads / 32;
  cp_async_wait_all();
  __syncthreads();  // the staged entries (and a caller's own) are in; the last item's readers are done
  if (warp == kWarps - 1) window_scalars(ws, n);
  for (int j = warp; j < n; j += kWarps) normalize_key<kK, kAct>(ws.k_raw() + j * kK, ws.kn() + j * kK, l2norm);
  for (int i = tid; i < n * kV; i += kThreads) {
    const int j = i / kV, pos = i % kV, v = M::row_of_pos(pos);
    ws.U()[i] = recompute ? to_float(ws.v_raw()[j * kV + v]) : ws.u_raw()[j * kV + v];
  }
  __syncthreads();
  if (recompute) {
    // c_tj = e^{Lambda_t - Lambda_j} kn_j . kn_t, j < t: a warp per t, the lanes split K.
    constexpr int kPer = kK / 32;
    for (int t = warp; t < n; t += kWarps) {
      float kt[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) kt[e] = ws.kn()[t * kK + lane * kPer + e];
      const float lam_t = ws.lam()[t];
      for (int j = 0; j < t; ++j) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < kPer; ++e) d = fmaf(ws.kn()[j * kK + lane * kPer + e], kt[e], d);
        d = row_sum<32>(d);
        if (lane == 0) ws.coef()[t * ws.L + j] = expf(lam_t - ws.lam()[j]) * d;
      }
    }
  } else {
    for (int i = tid; i < n * kK; i += kThreads) ws.kn()[i] *= ws.rel()[i / kK];
  }
  __syncthreads();
}

// Step 5: the fold of the n prepared entries into the tile in f (S_c on entry, the folded fp32 state on
// return). With recompute, first the u_t from S_c (rows_dot of each kn_t), then the decayed keys.
template <int kK, int kV, DType kAct>
__device__ __forceinline__ void fold_tile(const FoldView<kK, kV, kAct>& ws, TileFrag<kK, kV>& f, int n, bool recompute) {
  using M = TileMap<kK, kV>;
  const int tid = static_cast<int>(threadIdx.x);
  if (recompute) {
#pragma unroll 1
    for (int t = 0; t < n; ++t) {
      const float p = rows_dot<kK, kV>(f, ws.kn() + t * kK);
      if (M::dot_writer()) {
        float* u = ws.U() + t * kV + M::first_row() * M::R + M::dot_row();
        *u = fmaf(-ws.elam()[t], p, *u);  // v_t - e^{Lambda_t} (S_c kn_t)
      }
    }
    __syncthreads();
    if (tid < kV) {  // position tid's row: u_t = beta_t (U_t - sum_{j<t} c_tj u_j), in order
      for (int t = 0; t < n; ++t) {
        float acc = ws.U()[t * kV + tid];
        const float* c = ws.coef() + t * ws.L;
        for (int j = 0; j < t; ++j) acc = fmaf(-c[j], ws.U()[j * kV + tid], acc);
        ws.U()[t * kV + tid] = ws.beta()[t] * acc;
      }
    } else {  // the other threads decay the keys meanwhile
      for (int i = tid - kV; i < n * kK; i += kThreads - kV) ws.kn()[i] *= ws.rel()[i / kK];
    }
    __syncthreads();
  }
  const float decay = *ws.decay();
#pragma unroll
  for (int r = 0; r < M::R; ++r) {
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) {
#pragma unroll
      for (int q = 0; q < 4; ++q) f.s[r][b][q] *= decay;
    }
  }
  const float* u_rows = ws.U() + M::first_row() * M::R;
#pragma unroll 1
  for (int j = 0; j < n; ++j) {
    float u[M::R];
    if constexpr (M::R == 4) {
      const float4 x = *reinterpret_cast<const float4*>(u_rows + j * kV);
      u[0] = x.x; u[1] = x.y; u[2] = x.z; u[3] = x.w;
    } else {
      const float2 x = *reinterpret_cast<const float2*>(u_rows + j * kV);
      u[0] = x.x; u[1] = x.y;
    }
#pragma unroll
    for (int b = 0; b < M::kBlocks; ++b) {
      const float4 kd = *reinterpret_cast<const float4*>(ws.kn() + j * kK + M::col(b));
#pragma unroll
      for (int r = 0; r < M::R; ++r) {
        f.s[r][b][0] = fmaf(u[r], kd.x, f.s[r][b][0]);
        f.s[r][b][1] = fmaf(u[r], kd.y, f.s[r][b][1]);
        f.s[r][b][2] = fmaf(u[r], kd.z, f.s[r][b][2]);
        f.s[r][b][3] = fmaf(u[r], kd.w, f.s[r][b][3]);
      }
    }
  }
}

}  // namespace gdn
}  // namespace replayssm
