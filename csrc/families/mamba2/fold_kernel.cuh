// Mamba-2 fold for commit, flush and materialize: a persistent grid of 256-thread CTAs over the
// (row, head) items of the rows that fold (fold_kernel says why).
//
// With n committed entries to fold (commit: the cursor after accepting; flush and materialize: the
// cursor), Lambda_j = A sum_{i<=j} dt_i and wgt_j = dt_j exp(Lambda_{n-1} - Lambda_j):
//   S = e^{Lambda_{n-1}} S_c + sum_{j<n} (wgt_j x_j) (outer) B_j
// with the step kernel's fold arithmetic (fold.cuh: the same tile, a state row over N/4 lanes, 4
// elements each, s *= decay, then per entry s += (wgt_j * x_j[p]) * B_j[n] in fp32 FFMA in entry
// order), the read copy made from the checkpoint as stored, like make_read_copy. An fp32 checkpoint
// therefore stays at fp32 rounding however many folds it sees.
//
// Commit: a row folds when cursor + accepted + max_draft_tokens > L (the flush-early rule; accepted is
// num_accepted clamped to the slot's last verify, cache/fold_rows.cuh); only the folding rows' items
// are taken. Flush: the rows with committed entries; materialize: every row
// (zeros for pads and out-of-range cursors). No CTA writes a cursor here (the heads of a slot all
// read it): launch_mamba2_fold runs the cursor kernel after this one, which also advances the
// stochastic-rounding offset when there is one (stochastic_rounding.cuh).
#pragma once

#include "cache/fold_rows.cuh"
#include "cache/layer_table.h"
#include "families/mamba2/fold.cuh"
#include "families/mamba2/spec_common.cuh"
#include "common/stochastic_rounding.cuh"

namespace replayssm {
namespace mamba2_spec {

// The fold's tile and coefficient layout are the step kernel's (tile.cuh, fold.cuh): a state row covered
// by N/4 consecutive lanes, the coefficients wgt_j x_j[row] in shared memory once per (entry, row).
template <int kP, int kN>
using FoldTile = mamba2::TileShape<kP, kN>;
template <int kP, int kN>
using FoldCoef = mamba2::FoldCoef<kP, kN>;

// The folding rows of one chunk of kThreads batch rows, in row order (every CTA finds them itself).
// Slots fit in int32: a pool of 2^31 slots of at least 64 x 64 fp32 elements is far beyond any GPU.
struct FoldRows {
  int32_t slot[kThreads];  // -1: write a zero state (materialize of a pad row or an out-of-range cursor)
  int32_t row[kThreads];
  int8_t n[kThreads];      // entries to fold (<= kMamba2SpecMaxBufferLen)
};
static_assert(kMamba2SpecMaxBufferLen <= 127, "entry counts fit in int8");

// Shared memory of a fold CTA (dynamic part): a ring of checkpoint tiles fed by bulk copies (the next
// items' tiles land while this one folds), the coefficients of the item folded, its B rows, and the
// ring barriers. The per-chunk row list is static (FoldRows).
template <int kP, int kN, DType kCkpt, DType kAct>
struct FoldLayout {
  using Act = typename Storage<kAct>::type;
  static constexpr size_t kTileBytes = static_cast<size_t>(kP) * kN * dtype_size(kCkpt);
  static_assert(kTileBytes % 16 == 0, "bulk copies move whole 16-byte units");
  __host__ __device__ static constexpr size_t coef_offset(int stages) { return stages * kTileBytes; }
  __host__ __device__ static constexpr size_t B_offset(int stages, int L) {
    return coef_offset(stages) + FoldCoef<kP, kN>::bytes(L);
  }
  __host__ __device__ static constexpr size_t barrier_offset(int stages, int L) {
    return (B_offset(stages, L) + sizeof(Act) * static_cast<size_t>(L) * kN + 7) / 8 * 8;
  }
  __host__ __device__ static constexpr size_t bytes_with(int stages, int L) {
    return barrier_offset(stages, L) + stages * sizeof(uint64_t);
  }
  // CTAs per SM a ring of `stages` allows at L = 16 (228 KB per SM, 1 KB reserved per CTA), at most 3.
  static constexpr int ctas_with(int stages) {
    const int ctas = static_cast<int>(228 * 1024 / (bytes_with(stages, 16) + sizeof(FoldRows) + 64 + 1024));
    return ctas > 3 ? 3 : (ctas < 1 ? 1 : ctas);
  }
  // Three stages (two tiles in flight per CTA) wherever they keep two CTAs per SM or cost none; the
  // launch takes two where a long buffer leaves no room for the third (launch.ring_stages).
  static constexpr int kStages = ctas_with(3) >= (ctas_with(2) < 2 ? ctas_with(2) : 2) ? 3 : 2;
  static constexpr int kCtasPerSm = ctas_with(kStages);
};

// CTAs per SM of the fold; the launch bounds follow, so that registers never limit occupancy below it.
template <int kP, int kN, DType kCkpt, DType kAct>
constexpr int fold_ctas_per_sm() {
  return FoldLayout<kP, kN, kCkpt, kAct>::kCtasPerSm;
}

template <int kElems, class Act>
struct EntryChunks {
  static constexpr int kPerChunk = 16 / sizeof(Act);
  static constexpr int kPerEntry = kElems / kPerChunk;
  static_assert(kElems % kPerChunk == 0, "rows must be whole 16-byte chunks");
  __device__ static const Act* src(const Act* buffer, int64_t entry_stride, int i) {
    const int j = i / kPerEntry;
    return buffer + j * entry_stride + (i - j * kPerEntry) * kPerChunk;
  }
};

// Chunks kThreads and up of the first `count` entries into dst (contiguous entries), by cp.async: the
// chunks below kThreads come from FoldInputs' registers, so this runs only for buffers of more entries.
template <int kElems, class Act>
__device__ __forceinline__ void stage_entries_rest(Act* dst, const Act* buffer, int64_t entry_stride, int count) {
  using Chunks = EntryChunks<kElems, Act>;
  for (int i = threadIdx.x + kThreads; i < count * Chunks::kPerEntry; i += kThreads) {
    cp_async16(dst + i * Chunks::kPerChunk, Chunks::src(buffer, entry_stride, i));
  }
}

// The fold's per-entry scalars, held by the lanes of every warp: lane l holds entries l and l + 32.
struct FoldScalars {
  float wgt[kMamba2SpecMaxBufferLen / 32];  // dt_j exp(Lambda_{n-1} - Lambda_j), 0 from n on
  float decay;                              // exp(Lambda_{n-1}); 1 when n == 0

  __device__ float weight(int j) const {
    const float lo = __shfl_sync(kFullMask, wgt[0], j & 31);
    const float hi = __shfl_sync(kFullMask, wgt[1], j & 31);
    return j < 32 ? lo : hi;
  }
};

// The step kernel's window_scalars with the window = the n buffered entries (no current token), from
// dt[h] = dt_j of entry j = lane + 32 h (0 from n on).
__device__ __forceinline__ FoldScalars fold_scalars(const float (&dt)[kMamba2SpecMaxBufferLen / 32], float A, int n) {
  constexpr int kPerLane = kMamba2SpecMaxBufferLen / 32;
  const int lane = threadIdx.x & 31;
  float prefix[kPerLane];
  float carry = 0.0f;
#pragma unroll
  for (int h = 0; h < kPerLane; ++h) {
    const float v = warp_inclusive_sum(dt[h]);
    prefix[h] = v + carry;
    carry += __shfl_sync(kFullMask, v, 31);
  }
  const int last = n > 0 ? n - 1 : 0;
  const float at_last = __shfl_sync(kFullMask, last < 32 ? prefix[0] : prefix[1], last & 31);
  const float total = n > 0 ? A * at_last : 0.0f;
  FoldScalars fs;
#pragma unroll
  for (int h = 0; h < kPerLane; ++h) {
    const int j = lane + 32 * h;
    fs.wgt[h] = j < n ? dt[h] * expf(total - A * prefix[h]) : 0.0f;
  }
  fs.decay = expf(total);
  return fs;
}

// What an item reads from global memory besides its checkpoint tile, loaded into registers an item
// ahead (while the item before folds), so that an item starts without a round trip to L2: issued at the
// item's start, these loads (dt, then x: two serial L2 round trips per item) held 19% of the commit
// fold's warp samples. Thread t
// holds 16-byte chunk t of the item's x rows and chunk t of its B rows (chunk t is of entry t / the
// chunks per entry, so kThreads chunks cover 16 entries at any P and N); buffers of more entries load
// the chunks past kThreads in the item itself (stage_entries_rest for B, the x loop after
// store_coef_chunk).
template <int kP, int kN, class Act>
struct FoldInputs {
  using XChunks = EntryChunks<kP, Act>;
  using BChunks = EntryChunks<kN, Act>;
  uint4 x, B;
  float dt[kMamba2SpecMaxBufferLen / 32];  // dt_j of entries lane + 32 h, 0 from n on
  float A;

  __device__ static const Act* x_rows(const Mamba2SpecParams& p, int64_t slot, int head) {
    return static_cast<const Act*>(p.x_buf) + slot * p.xb_slot_stride + head * p.xb_head_stride;
  }
  __device__ static const Act* B_rows(const Mamba2SpecParams& p, int64_t slot, int head) {
    return static_cast<const Act*>(p.B_buf) + slot * p.Bb_slot_stride + (head / (p.heads / p.groups)) * p.Bb_group_stride;
  }

  __device__ void load(const Mamba2SpecParams& p, int64_t slot, int head, int n) {
    const int tid = threadIdx.x;
    x = B = make_uint4(0, 0, 0, 0);
    if (tid < n * XChunks::kPerEntry) {
      x = __ldg(reinterpret_cast<const uint4*>(XChunks::src(x_rows(p, slot, head), p.xb_entry_stride, tid)));
    }
    if (tid < n * BChunks::kPerEntry) {
      B = __ldg(reinterpret_cast<const uint4*>(BChunks::src(B_rows(p, slot, head), p.Bb_entry_stride, tid)));
    }
    const float* dt_buf = p.dt_buf + slot * p.dtb_slot_stride + head * p.dtb_head_stride;
#pragma unroll
    for (int h = 0; h < kMamba2SpecMaxBufferLen / 32; ++h) {
      const int j = (tid & 31) + 32 * h;
      dt[h] = j < n ? __ldg(dt_buf + j) : 0.0f;
    }
    A = __ldg(p.A + head);
  }
};

// coef[index(j, row)] = wgt_j * x_j[row] for the 8 activations of one 16-byte x chunk (chunk i of the
// item's rows). Every lane calls it (the weight comes by shuffle); `valid` says whether it stores.
template <int kP, int kN, class Act>
__device__ __forceinline__ void store_coef_chunk(float* coef, const FoldScalars& fs, uint4 chunk, int i, int n,
                                                 bool valid) {
  using XChunks = EntryChunks<kP, Act>;
  const int j = i / XChunks::kPerEntry;
  const float wj = fs.weight(j < n ? j : (n > 0 ? n - 1 : 0));
  if (!valid) return;
  const int row0 = (i - j * XChunks::kPerEntry) * XChunks::kPerChunk;
  const Act* xv = reinterpret_cast<const Act*>(&chunk);
#pragma unroll
  for (int e = 0; e < XChunks::kPerChunk; ++e) coef[FoldCoef<kP, kN>::index(j, row0 + e)] = wj * to_float(xv[e]);
}

// Entries to fold for this row's slot, or -1 when the CTA has nothing to do: the rule of every
// family (cache/fold_rows.cuh), with commit's accepted count clamped to the slot's last verify.
__device__ __forceinline__ int entries_to_fold(const Mamba2SpecParams& p, int64_t row, int64_t slot) {
  const bool commit = p.mode == Mamba2FoldMode::kCommit;
  const int64_t accepted = commit ? accepted_entries(p, row, p.num_verified[slot]) : 0;
  return fold_entries(static_cast<int32_t>(p.mode), p.num_committed[slot], accepted, p.buffer_len,
                      p.max_draft_tokens);
}

template <int kP, int kN>
__device__ __forceinline__ void write_zero_state(const Mamba2SpecParams& p, int64_t row, int head) {
  using Tile = FoldTile<kP, kN>;
  float* out = p.state_out + row * p.so_row_stride + head * p.so_head_stride;
#pragma unroll
  for (int r = 0; r < Tile::kRowsPerThread; ++r) {
    store_whole(out + Tile::row(r) * p.so_p_stride + Tile::col0(), make_float4(0.f, 0.f, 0.f, 0.f));
  }
}

// A persistent grid (as many CTAs as fit on the GPU) over the (row, head) items of the rows that fold:
// commit folds few rows per call (about 1 in 5 at T = 4, L = 16), and a grid of one CTA per (row, head)
// spent most of its time on CTAs that read two integers and left, holding the SM slots the folding
// CTAs needed. Every CTA finds the folding rows of a chunk of rows itself (cursors and accepted counts
// are L2-hot after the first), then takes every gridDim.x-th item of the chunk.
//
// An item is the step's fold of one head (fold_rows, fold.cuh), FFMA for FFMA: the checkpoint tile
// in shared memory, the coefficients wgt_j x_j[row] written once per (entry, row) (FoldCoef), a batch
// of rows at a time per thread against the B rows (FoldCoef::batch_rows). What bounds it is latency,
// so every input is requested ahead: the checkpoint tiles of the next S - 1 items by bulk copy into
// the ring (S = 3 where it keeps two CTAs per SM, docs/TUNING.md), the tile after them into L2 (further
// ahead was slower: the prefetched tiles were evicted before use), and the next item's x, B and dt into
// registers (FoldInputs). (Loading the tile into registers at the item's start and waiting for it there
// ran at about half the copy rate.)
// kRound: stochastic rounding of a 16-bit checkpoint's stores (p.rounding_seed); false compiles to the
// kernel without any rounding code.
//
// The body is fold_items, run by fold_kernel for one layer (the params' tensors) and by
// fold_layers_kernel for every layer of a layer table (blockIdx.y the layer): the same code on other
// pointers.
template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kRound>
__device__ __forceinline__ void fold_items(const Mamba2SpecParams& p, const Mamba2FoldLaunch launch) {
  static_assert(!kRound || kCkpt != DType::kFloat32, "stochastic rounding is for 16-bit checkpoints");
  using Tile = FoldTile<kP, kN>;
  using Coef = FoldCoef<kP, kN>;
  using Layout = FoldLayout<kP, kN, kCkpt, kAct>;
  using Act = typename Storage<kAct>::type;
  constexpr int R = Tile::kRowsPerThread;
  constexpr int kBatch = Coef::batch_rows(fold_ctas_per_sm<kP, kN, kCkpt, kAct>());  // rows folded together
  static_assert(kBatch % 2 == 0 && (kBatch % 4 == 0 || kBatch == R), "batches start at multiples of 4 rows, even");
  constexpr int kLanes = Tile::kLanesPerRow;
  constexpr int kCkBytes = dtype_size(kCkpt);
  constexpr int kWarps = kThreads / 32;
  extern __shared__ __align__(128) unsigned char smem_base[];
  __shared__ FoldRows rows;
  __shared__ int warp_counts[kWarps];

  const int L = p.buffer_len;
  const bool materialize = p.mode == Mamba2FoldMode::kMaterialize;
  const int S = launch.ring_stages;  // Layout::kStages, or 2 where L leaves no room for more
  auto tile_smem = [&](int stage) { return smem_base + stage * Layout::kTileBytes; };
  float* const coef = reinterpret_cast<float*>(smem_base + Layout::coef_offset(S));
  Act* const B_rows = reinterpret_cast<Act*>(smem_base + Layout::B_offset(S, L));
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem_base + Layout::barrier_offset(S, L));
  const int col0 = Tile::col0();
  const int tid = threadIdx.x;
  const bool producer = tid == 0;
  const int64_t grid = gridDim.x;
  const unsigned char* checkpoint = static_cast<const unsigned char*>(p.checkpoint);
  if (producer) {
    for (int s = 0; s < S; ++s) mbarrier_init(full + s, 1);
    fence_barrier_init();
  }
  int64_t items_before = 0;  // items of the earlier chunks: this CTA takes the items k with k % grid == blockIdx.x
  int stage = 0;             // the ring stage of this CTA's next tile to fold, and its barrier's phase
  uint32_t phase = 0;

  for (int64_t chunk = 0; chunk < p.batch; chunk += kThreads) {
    // ---- the chunk's folding rows, compacted in row order ----
    const int64_t row = chunk + tid;
    int64_t slot = -1;
    int n = -1;
    if (row < p.batch) {
      slot = resolve_slot(p, row);
      if (slot >= 0) n = entries_to_fold(p, row, slot);
    }
    const bool item = row < p.batch && (materialize || n >= 0);
    const unsigned ballot = __ballot_sync(kFullMask, item);
    __syncthreads();  // the previous chunk's readers of rows are done (and the barriers are initialised)
    if ((tid & 31) == 0) warp_counts[tid / 32] = __popc(ballot);
    __syncthreads();
    int before = __popc(ballot & ((1u << (tid & 31)) - 1u));
    int count = 0;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) {
      if (k < tid / 32) before += warp_counts[k];
      count += warp_counts[k];
    }
    if (item) {
      rows.slot[before] = n >= 0 ? static_cast<int32_t>(slot) : -1;
      rows.row[before] = static_cast<int32_t>(row);
      rows.n[before] = static_cast<int8_t>(n);
    }
    __syncthreads();

    const int64_t items = static_cast<int64_t>(count) * p.heads;
    // This CTA's first item of the chunk at or after k (k itself one of its items) with a tile to fold.
    auto next_tile_item = [&](int64_t k) {
      while (k < items && rows.slot[k / p.heads] < 0) k += grid;
      return k;
    };
    auto tile_of = [&](int64_t k) {
      return (static_cast<int64_t>(rows.slot[k / p.heads]) * p.ck_slot_stride + (k % p.heads) * p.ck_head_stride) * kCkBytes;
    };
    auto issue_tile = [&](int64_t k, int stage) {
      fence_proxy_async();  // the stage was last read by ordinary loads, before a CTA barrier
      bulk_copy_tile_to_shared<kP, kN * kCkBytes>(tile_smem(stage), checkpoint + tile_of(k), p.ck_row_stride * kCkBytes,
                                                  full + stage);
    };
    const int64_t first = ((blockIdx.x - items_before) % grid + grid) % grid;
    // The inputs of this CTA's next item with a tile: loaded here for the chunk's first, then an item
    // ahead inside the loop.
    FoldInputs<kP, kN, Act> next_in;
    {
      int64_t k = next_tile_item(first);
      if (k < items) next_in.load(p, rows.slot[k / p.heads], static_cast<int>(k % p.heads), rows.n[k / p.heads]);
      if (producer) {  // the chunk's first S - 1 tiles (every stage is free: the last chunk's items are done)
        int st = stage;
        for (int s = 0; s < S - 1 && k < items; ++s) {
          issue_tile(k, st);
          st = st + 1 == S ? 0 : st + 1;
          k = next_tile_item(k + grid);
        }
        if (k < items && p.ck_row_stride == kN) bulk_prefetch_l2(checkpoint + tile_of(k), Layout::kTileBytes);
      }
    }

    for (int64_t k = first; k < items; k += grid) {
      const int ri = static_cast<int>(k / p.heads);
      const int head = static_cast<int>(k % p.heads);
      const int64_t fslot = rows.slot[ri];
      const int64_t frow = rows.row[ri];
      if (fslot < 0) {  // materialize only; no tile
        write_zero_state<kP, kN>(p, frow, head);
        continue;
      }
      const int n_fold = rows.n[ri];
      __syncthreads();  // the previous item's readers of the coefficients, B rows and ring stage are done

      // ---- ahead: the tile S - 1 items on into the stage the previous item freed, the one after into L2 ----
      const int64_t k_next = next_tile_item(k + grid);
      if (producer) {
        int64_t k_ahead = k_next;
        for (int s = 2; s < S && k_ahead < items; ++s) k_ahead = next_tile_item(k_ahead + grid);
        if (k_ahead < items) {
          issue_tile(k_ahead, stage == 0 ? S - 1 : stage - 1);
          const int64_t k_after = next_tile_item(k_ahead + grid);
          if (k_after < items && p.ck_row_stride == kN) bulk_prefetch_l2(checkpoint + tile_of(k_after), Layout::kTileBytes);
        }
      }

      // ---- this item: B rows, scalars, coefficients (from the registers loaded an item ago) ----
      const FoldScalars fs = fold_scalars(next_in.dt, next_in.A, n_fold);
      {
        using XChunks = EntryChunks<kP, Act>;
        using BChunks = EntryChunks<kN, Act>;
        const Act* B_buf = FoldInputs<kP, kN, Act>::B_rows(p, fslot, head);
        const Act* x_buf = FoldInputs<kP, kN, Act>::x_rows(p, fslot, head);
        if (tid < n_fold * BChunks::kPerEntry) *reinterpret_cast<uint4*>(B_rows + tid * BChunks::kPerChunk) = next_in.B;
        stage_entries_rest<kN>(B_rows, B_buf, p.Bb_entry_stride, n_fold);
        cp_async_commit();
        const int x_chunks = n_fold * XChunks::kPerEntry;
        store_coef_chunk<kP, kN, Act>(coef, fs, next_in.x, tid, n_fold, tid < x_chunks);
        for (int i0 = kThreads; i0 < x_chunks; i0 += kThreads) {  // buffers past 16 entries (CTA-uniform trip count)
          const int i = i0 + tid;
          uint4 chunk{};
          if (i < x_chunks) chunk = __ldg(reinterpret_cast<const uint4*>(XChunks::src(x_buf, p.xb_entry_stride, i)));
          store_coef_chunk<kP, kN, Act>(coef, fs, chunk, i, n_fold, i < x_chunks);
        }
      }
      if (k_next < items) {
        next_in.load(p, rows.slot[k_next / p.heads], static_cast<int>(k_next % p.heads), rows.n[k_next / p.heads]);
      }
      cp_async_wait_all();
      __syncthreads();  // the coefficients and B rows are in
      mbarrier_wait(full + stage, phase);
      const unsigned char* ck_smem = tile_smem(stage);
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }

      // ---- the fold, kBatch rows at a time, and the stores ----
      const int64_t tile = fslot * p.ck_slot_stride + head * p.ck_head_stride;
      RoundingKey key{};
      RoundingWords words;  // kRound: rows drawn in pairs, which kBatch (even) never splits
      if constexpr (kRound) key = RoundingKey::load(p.rounding_seed);
#pragma unroll
      for (int r0 = 0; r0 < R; r0 += kBatch) {
        float s[kBatch][4];
        mamba2::FoldOperands<kBatch> operands;
        mamba2::fold_rows<kP, kN, kCkpt, kAct, kBatch, (kBatch > 4)>(s, operands, ck_smem, r0, fs.decay, coef, B_rows, n_fold);
#pragma unroll
        for (int rb = 0; rb < kBatch; ++rb) {
          const int r = r0 + rb;
          if (r >= R) break;
          const int pr = Tile::row(r);
          if (materialize) {
            float* out = p.state_out + frow * p.so_row_stride + head * p.so_head_stride;
            store_whole(out + pr * p.so_p_stride + col0, make_float4(s[rb][0], s[rb][1], s[rb][2], s[rb][3]));
            continue;
          }
          if constexpr (kRound) {  // the read copy below is then made from the stochastically rounded value
            uint32_t w[2];
            words.get<R>(key, fslot, head, r, [](int q) { return Tile::row(q); }, col0, w);
            stochastic_round4<kCkpt>(s[rb], w);
          }
          // Streaming stores (evict-first in L2): no kernel reads the checkpoint right after commit
          // (docs/TUNING.md, "Whole and streaming stores").
          store4<kCkpt, true>(p.checkpoint, tile + pr * p.ck_row_stride + col0, s[rb]);
          if constexpr (kCopy) store_read_copy4<kCkpt, kRead, kLanes>(p, fslot, head, pr, col0, s[rb]);
        }
      }
    }
    items_before += items;
  }
}

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kRound>
__global__ void __launch_bounds__(kThreads, (fold_ctas_per_sm<kP, kN, kCkpt, kAct>())) fold_kernel(const Mamba2SpecParams p, const Mamba2FoldLaunch launch) {
  fold_items<kP, kN, kCkpt, kCopy, kRead, kAct, kRound>(p, launch);
}

// Every layer of a layer table (cache/layer_table.h) in one launch: the CTAs of blockIdx.y fold layer
// blockIdx.y, as fold_kernel folds one layer with a grid of gridDim.x CTAs. p holds layer 0's shapes,
// strides and dtypes (shared by every layer) and the rows, slots and num_accepted of all layers;
// materialize writes layer l's states at p.state_out + l * out_layer_stride.
template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kRound>
__global__ void __launch_bounds__(kThreads, (fold_ctas_per_sm<kP, kN, kCkpt, kAct>()))
fold_layers_kernel(const Mamba2SpecParams p, const Mamba2FoldLaunch launch, const LayerTableArgs layers) {
  const LayerPointers& lp = layer_pointers(layers, static_cast<int>(blockIdx.y));
  Mamba2SpecParams q = p;
  q.checkpoint = lp.checkpoint;
  q.read_copy = lp.read_copy;
  q.read_scale = lp.read_scale;
  q.x_buf = lp.buffers[0];
  q.B_buf = lp.buffers[1];
  q.dt_buf = static_cast<float*>(lp.buffers[2]);
  q.num_committed = lp.num_committed;
  q.num_verified = lp.num_verified;
  q.A = static_cast<const float*>(lp.weights[0]);
  q.rounding_seed = lp.rounding_seed;
  if (p.state_out != nullptr) q.state_out = p.state_out + blockIdx.y * layers.out_layer_stride;
  fold_items<kP, kN, kCkpt, kCopy, kRead, kAct, kRound>(q, launch);
}

}  // namespace mamba2_spec
}  // namespace replayssm
