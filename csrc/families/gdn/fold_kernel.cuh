// Gated DeltaNet fold for commit, flush and materialize: a persistent grid of 256-thread CTAs over the
// (row, v-head) items of the rows that fold, each item fold.cuh's fold of one v-head's tile.
//
// Which rows fold and how many entries: cache/fold_rows.cuh (commit: the cursor after accepting, where
// the next verify of max_draft_tokens would not fit; flush: every row with committed entries;
// materialize: every row, a zero state for pads and out-of-range cursors). No CTA writes a cursor here
// (the v-heads of a slot all read it): launch_gdn_fold runs the cursor kernel (cache/fold_cursor.h)
// after this one. recompute (fold.cuh): with a read copy and for materialize the u_j are recomputed
// from the checkpoint; commit and flush refresh the read copy from the checkpoint as stored.
//
// Why a persistent grid: commit folds few rows per call (about 1 in L - T + 1 per round), and a grid of
// one CTA per (row, head) spends most of its time on CTAs that read two integers and leave, holding
// the SM slots the folding CTAs need. Every CTA finds the folding rows of a chunk of 256 rows itself
// (cursors and accepted counts are L2-hot after the first), then takes every gridDim.x-th item.
//
// What bounds an item is latency, so its inputs are requested an item ahead: the checkpoint tiles of
// the next `stages` items by bulk copy into a ring of shared-memory stages (a stage is refilled as soon
// as its tile is in registers, so one stage already keeps a tile in flight beside the one folding), and
// the next item's buffer entries by cp.async into the workspace's raw area right after this item's
// prepare_entries has converted its own. The whole tile in registers (128 of them, two CTAs per SM),
// fold.cuh's passes take its rows from there. The checkpoint is stored with the streaming cache operator
// (nothing reads it in the next kernel). Byte model per item: the tile read once and written once
// (V K ckpt bytes each), plus n entries of k (K act), v or u (V act or fp32), g and beta, and the read
// copy written where there is one.
#pragma once

#include "cache/fold_rows.cuh"
#include "cache/layer_table.h"
#include "cache/slot_map.cuh"
#include "families/gdn/fold.cuh"
#include "families/gdn/variants.h"

namespace replayssm {
namespace gdn {

static_assert(static_cast<int32_t>(GdnFoldMode::kCommit) == kFoldCommit &&
                  static_cast<int32_t>(GdnFoldMode::kFlush) == kFoldFlush &&
                  static_cast<int32_t>(GdnFoldMode::kMaterialize) == kFoldMaterialize,
              "GdnFoldMode takes the values of cache/fold_rows.cuh");

// Shared memory of a fold CTA (dynamic part): the mbarriers of the ring, the ring of checkpoint tiles,
// then fold.cuh's workspace. The per-chunk row list is static (FoldRowList).
template <int kK, int kV, DType kCkpt, bool kVectorGate = false>
struct FoldLayout {
  static constexpr size_t kTileBytes = static_cast<size_t>(kV) * kK * dtype_size(kCkpt);
  static constexpr size_t kRingOffset = 128;  // up to 16 barriers
  static constexpr int kMaxStages = 4;
  static_assert(kTileBytes % 128 == 0, "tiles keep the ring 128-byte aligned");
  __host__ __device__ static constexpr size_t workspace(int stages) { return kRingOffset + stages * kTileBytes; }
  __host__ __device__ static constexpr size_t bytes(int stages, int L) {
    return workspace(stages) + FoldWorkspace<kK, kV, kVectorGate>::bytes(L);
  }
  static constexpr size_t kStaticBytes = sizeof(FoldRowList<kFoldThreads>);
};

// Two CTAs per SM are the target (the launcher falls back to one where a long buffer leaves no room).
constexpr int kFoldCtasPerSm = 2;

template <int kK, int kV>
__device__ __forceinline__ void write_zero_state(const GdnParams& p, int64_t row, int v_head) {
  using M = TileMap<kK, kV>;
  float zero[M::kBlocks][4];
#pragma unroll
  for (int b = 0; b < M::kBlocks; ++b) {
#pragma unroll
    for (int q = 0; q < 4; ++q) zero[b][q] = 0.0f;
  }
  const StateSink<kK, kV> sink{p.state_out, row * p.so_row_stride + v_head * p.so_head_stride, p.so_v_stride};
#pragma unroll
  for (int r = 0; r < M::R; ++r) sink(M::row(r), zero);
}

// The fold kernel's rows: into materialize's output, or the checkpoint (streaming stores: no kernel
// reads it right after commit) and the read copy.
template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead>
struct FoldKernelSink {
  bool materialize;
  StateSink<kK, kV> state;
  CheckpointSink<kK, kV, kCkpt, kCopy, kRead, true> checkpoint;
  __device__ void operator()(int v, const float (&s)[TileMap<kK, kV>::kBlocks][4]) const {
    if (materialize) {
      state(v, s);
    } else {
      checkpoint(v, s);
    }
  }
};

// kCopy: the cache has a read copy of dtype kRead (commit and flush refresh it; the launcher never
// passes one to materialize). p.cache.buffer_len entries at most; stages: tiles in the ring.
//
// The body is fold_items, run by fold_kernel for one layer (the params' tensors) and by
// fold_layers_kernel for every layer of a layer table (blockIdx.y the layer): the same code on other
// pointers.
// kVectorGate: KDA (params.gate = GdnGate::kVector), the decay per key channel (fold.cuh); its
// prepared entries use the whole raw area until the passes end, so the next item is staged after them.
template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kVectorGate>
__device__ __forceinline__ void fold_items(const GdnParams& p, const int stages) {
  using Layout = FoldLayout<kK, kV, kCkpt, kVectorGate>;
  using View = FoldView<kK, kV, kAct, kVectorGate>;
  extern __shared__ __align__(128) unsigned char smem_base[];
  __shared__ FoldRowList<kFoldThreads> rows;

  const GdnCache& c = p.cache;
  const int L = c.buffer_len;
  const int HV = p.v_heads;
  const int group = HV / p.heads;  // v-heads per k-head
  const bool materialize = p.mode == GdnFoldMode::kMaterialize;
  // Entries recomputed from the checkpoint: all with a read copy (it served them) and for materialize.
  const bool recompute = kCopy || materialize;
  const bool l2norm = p.tokens.use_qk_l2norm;
  const int S = stages;
  const int tid = static_cast<int>(threadIdx.x);
  const bool producer = tid == 0;
  const int grid = static_cast<int>(gridDim.x);  // item indices fit in int32 (the API bounds batch x v_heads)
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem_base);
  auto tile_smem = [&](int s) { return smem_base + Layout::kRingOffset + s * Layout::kTileBytes; };
  const View ws(smem_base + Layout::workspace(S), L);
  const unsigned char* checkpoint = static_cast<const unsigned char*>(c.checkpoint);
  constexpr int kCkBytes = dtype_size(kCkpt);
  if (producer) {
    for (int s = 0; s < S; ++s) mbarrier_init(full + s, 1);
    fence_barrier_init();
  }
  int items_before = 0;  // items of the earlier chunks: this CTA takes the items k with k % grid == blockIdx.x
  int stage = 0;             // the ring stage of this CTA's next tile, and its barrier's phase
  uint32_t phase = 0;

  for (int chunk = 0; chunk < p.batch; chunk += kFoldThreads) {
    const int count = collect_fold_rows<kFoldThreads>(rows, chunk, [&](int64_t row, int64_t& slot, int& n) {
      if (row >= p.batch) return false;
      slot = resolve_slot(p, row);
      if (slot >= 0) {
        const int w = c.num_committed[slot];
        const int64_t accepted = p.mode == GdnFoldMode::kCommit ? accepted_entries(p, row, c.num_verified[slot]) : 0;
        n = fold_entries(static_cast<int32_t>(p.mode), w, accepted, L, c.max_draft_tokens);
      }
      if (n < 0) slot = -1;
      return materialize || n >= 0;
    });
    const int items = count * HV;
    // This CTA's first item at or after k (k itself one of its items) that has a tile to fold.
    auto next_tile_item = [&](int k) {
      while (k < items && rows.slot[k / HV] < 0) k += grid;
      return k;
    };
    auto issue_tile = [&](int k, int s) {
      const int64_t slot = rows.slot[k / HV];
      const int head = static_cast<int>(k % HV);
      fence_proxy_async();  // the stage was last read by ordinary loads, before a CTA barrier
      bulk_copy_tile_to_shared<kV, kK * kCkBytes>(
          tile_smem(s), checkpoint + (slot * c.ck_slot_stride + head * c.ck_head_stride) * kCkBytes,
          c.ck_row_stride * kCkBytes, full + s);
    };
    auto stage_item = [&](int k) {
      const int head = k % HV, n = rows.n[k / HV];
      stage_window(ws, c, rows.slot[k / HV], head, head / group, n, recompute ? 0 : n, p.kda.gb_entry_stride);
    };
    const int first = ((static_cast<int>(blockIdx.x) - items_before) % grid + grid) % grid;
    {
      int k = next_tile_item(first);
      if (k < items) stage_item(k);
      if (producer) {
        int st = stage;
        for (int s = 0; s < S && k < items; ++s) {
          issue_tile(k, st);
          st = st + 1 == S ? 0 : st + 1;
          k = next_tile_item(k + grid);
        }
      }
    }

    for (int k = first; k < items; k += grid) {
      const int ri = k / HV;
      const int head = k % HV;
      const int64_t slot = rows.slot[ri];
      const int64_t row = rows.row[ri];
      if (slot < 0) {  // materialize only: no tile
        write_zero_state<kK, kV>(p, row, head);
        continue;
      }
      const int n = rows.n[ri];
      const int first_recompute = recompute ? 0 : n;
      prepare_entries(ws, n, first_recompute, l2norm);
      const int k_next = next_tile_item(k + grid);
      if constexpr (!kVectorGate) {
        if (k_next < items) stage_item(k_next);  // the raw area is free now
      }

      TileFrag<kK, kV> f;
      mbarrier_wait(full + stage, phase);
      load_tile_shared<kK, kV, kCkpt>(f, tile_smem(stage));
      __syncthreads();  // every thread has its part of the tile: the stage may be refilled
      if (producer) {
        int k_ahead = k;
        for (int s = 0; s < S && k_ahead < items; ++s) k_ahead = next_tile_item(k_ahead + grid);
        if (k_ahead < items) issue_tile(k_ahead, stage);
      }
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }

      const RegisterRows<kK, kV> tile_rows{f};
      const FoldKernelSink<kK, kV, kCkpt, kCopy, kRead> sink{
          materialize,
          StateSink<kK, kV>{p.state_out, row * p.so_row_stride + head * p.so_head_stride, p.so_v_stride},
          CheckpointSink<kK, kV, kCkpt, kCopy, kRead, true>{c, slot, head}};
      fold_passes(ws, n, first_recompute, tile_rows, tile_rows.fetch(0), sink, nullptr, nullptr);
      if constexpr (kVectorGate) {
        __syncthreads();  // every pass has read the raw area (kel, the log decays)
        if (k_next < items) stage_item(k_next);
      }
    }
    items_before += items;
  }
}

template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kVectorGate>
__global__ void __launch_bounds__(kFoldThreads, kFoldCtasPerSm) fold_kernel(const GdnParams p, const int stages) {
  fold_items<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate>(p, stages);
}

// Every layer of a layer table (cache/layer_table.h) in one launch: the CTAs of blockIdx.y fold layer
// blockIdx.y, as fold_kernel folds one layer with a grid of gridDim.x CTAs. p holds layer 0's shapes,
// strides and dtypes (shared by every layer) and the rows, slots and num_accepted of all layers;
// materialize writes layer l's states at p.state_out + l * out_layer_stride. The record's buffers are
// k_buf, v_buf, g_buf, beta_buf and u_buf, in that order.
template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kVectorGate>
__global__ void __launch_bounds__(kFoldThreads, kFoldCtasPerSm)
fold_layers_kernel(const GdnParams p, const int stages, const LayerTableArgs layers) {
  const LayerPointers& lp = layer_pointers(layers, static_cast<int>(blockIdx.y));
  GdnParams q = p;
  q.cache.checkpoint = lp.checkpoint;
  q.cache.read_copy = lp.read_copy;
  q.cache.read_scale = lp.read_scale;
  q.cache.k_buf = lp.buffers[0];
  q.cache.v_buf = lp.buffers[1];
  q.cache.g_buf = static_cast<float*>(lp.buffers[2]);
  q.cache.beta_buf = static_cast<float*>(lp.buffers[3]);
  q.cache.u_buf = static_cast<float*>(lp.buffers[4]);
  q.cache.num_committed = lp.num_committed;
  q.cache.num_verified = lp.num_verified;
  if (p.state_out != nullptr) q.state_out = p.state_out + blockIdx.y * layers.out_layer_stride;
  fold_items<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate>(q, stages);
}

}  // namespace gdn
}  // namespace replayssm
