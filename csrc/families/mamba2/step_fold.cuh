// The step's fused fold (w + 1 + max_draft_tokens > L; all heads of a CTA fold, they share the slot):
//   S = e^{Lambda_w} S_c + sum_{j<=w} (wgt_j x_j) (outer) B_j;  y = S C + D x;  write S and its read copy
// head after head, the arithmetic of fold.cuh (the fold kernel's, FFMA for FFMA).
#pragma once

#include "common/stochastic_rounding.cuh"
#include "families/mamba2/step_cta.cuh"

namespace replayssm {
namespace mamba2 {

// The fold's compile-time choices, on top of the step's traits.
template <class T>
struct StepFoldTraits {
  using Layout = typename T::Layout;
  using Shape = TileShape<T::kP, T::kN>;
  using Coef = FoldCoef<T::kP, T::kN>;
  static constexpr int RF = Shape::kRowsPerThread;
  // With a read copy the fold also converts and stores the copy: batches of 4 rows there (larger ones
  // spilled the P = 128 kernels, whose budget is 128 registers).
  static constexpr int kBatch = Coef::batch_rows(T::kCopy ? 3 : Layout::kCtasPerSm);
  // B by whole words in the fp32-checkpoint kernels without a copy (the P = 64 fold 6% faster at batches
  // of 4); elsewhere at 80 registers it tripled the spills of the kernels with a bf16 read copy.
  static constexpr bool kBByWords = kBatch > 4 || (T::kCkpt == DType::kFloat32 && !T::kCopy);
  static_assert(kBatch % 2 == 0 && (kBatch % 4 == 0 || kBatch == RF), "batches start at multiples of 4 rows, even");
  // An fp8 read copy is quantised a batch of rows at a time (store_fp8_copy_rows: one pair of divisions
  // per lane for the batch, instead of per row) where the batches are whole: P = 64 / 128
  // (docs/TUNING.md, "fp8 copy quantisation by batch of rows"). Not at P = 80 (10 rows a thread, batches
  // of 4, 4, 2): batched there (the last 2 rows together) ptxas spilled and the fold took longer.
  static constexpr bool kFp8CopyByBatch = T::kRead == DType::kFloat8E4M3 && RF % kBatch == 0;
  // Where the batches are not whole (P = 80), the fp8 copy is quantised after the head's last row
  // instead of row by row (kFp8CopyAtEnd): each row's maximum is reduced as the row is folded and kept
  // by lane r of the row's lanes for row r (RF <= lanes per row at every P, N), the folded row goes
  // back into its place in the shared-memory tile (as stored: 16-bit checkpoints packed), and at the
  // end one pair of correctly rounded divisions per lane serves all RF rows: 2 per warp and head
  // instead of 2 RF (the fp8-copy fold is issue-bound, and row by row it ran 20 FCHK per warp and head
  // with their branches). Bitwise the copy and scales of the row-by-row rule (store_read_copy4).
  static constexpr bool kFp8CopyAtEnd = T::kCopy && T::kRead == DType::kFloat8E4M3 && !kFp8CopyByBatch;
  static_assert(!kFp8CopyAtEnd || RF <= Shape::kLanesPerRow, "a lane per row holds its maximum");
  // kFoldYPairs: the output dots reduced two rows at a time, in the folds without a read copy only. In
  // every kernel it sped the folds up a little but slowed the nano4b fp8-copy kernel's replay step
  // 4.5% with its source unchanged (ptxas laid out its replay path differently; docs/EXPERIMENTS.md),
  // so the copy kernels keep the row-by-row loop, and so do the 16-bit checkpoints, where at P = N =
  // 128 it made ptxas spill.
  static constexpr bool kFoldYPairs = !T::kCopy && T::kCkpt == DType::kFloat32;
  static constexpr int kCkBytes = dtype_size(T::kCkpt);
  static constexpr uint32_t kCkTileBytes = T::kP * T::kN * kCkBytes;
  static_assert(kCkTileBytes <= T::kStages * Layout::kTileBytes, "a checkpoint tile fits in the ring");
  // With a read copy on tensor cores at P = 64 and 80 (the ring has room there for an x window beside
  // the checkpoint tile): the coefficients' x window itself is copied into shared memory a head ahead
  // (bulk copies on x_full(1), which the fold does not otherwise use; phase i for head i), so that the
  // coefficients read it there instead of every thread of the CTA waiting for an L2 round trip at each
  // head's start (~14% of the super120b fp8-copy fold's samples were on those x loads; with the window
  // staged its fold step is 1-6% faster). P = 128, N = 64 has the room too, but there ptxas spilled
  // 12-20 more bytes: P = 128 stays without it.
  static constexpr bool kFoldStagedX = T::kCopy && T::kTensorReplay && T::kP <= 80 &&
                                       kCkTileBytes + Layout::x_window_bytes(kMamba2MaxBufferLen) <=
                                           static_cast<size_t>(T::kStages) * Layout::kTileBytes;
  static_assert(!kFoldStagedX || T::kStages >= 2, "x_full(1) exists");
};

// Fold, head after head, in fp32 FFMA (fold_rows), 4 columns per thread (TileShape), rows in batches
// (FoldCoef::batch_rows), the checkpoint tile read from shared memory. Without a read copy the ring
// already holds checkpoint tiles, S heads ahead. With one, the ring's read-copy tiles (issued before the
// cursor was known) are drained and its memory holds one checkpoint tile at a time (not asked into L2
// ahead: the prefetched tiles were evicted before use, docs/EXPERIMENTS.md) and, at P <= 80, the next
// head's x window beside it (kFoldStagedX). The window weights come one head ahead, as in the replay;
// the coefficients wgt_j x_j[p] are written once per head (FoldCoef) from those x windows or, elsewhere,
// from x rows requested into L2 a head earlier. The output rows come from the folded state.
template <class T>
__device__ __forceinline__ void step_fold(const StepCta<T>& c) {
  using Act = typename T::Act;
  using Layout = typename T::Layout;
  using F = StepFoldTraits<T>;
  using Shape = typename F::Shape;
  using Coef = typename F::Coef;
  using V = Vec4<T::kCkpt>;
  constexpr int kP = T::kP, kN = T::kN, S = T::kStages;
  constexpr int RF = F::RF;
  constexpr int kBatch = F::kBatch;
  constexpr int kCkBytes = F::kCkBytes;
  const Mamba2Params& p = c.p;
  const typename T::Smem& sm = c.sm;
  const int w = c.w;
  const int tid = c.tid;
  const int64_t slot = c.slot;
  const bool scalar_warp = c.scalar_warp;
  const bool producer = c.producer;
  const bool row_owner = c.row_owner;  // thread p owns output row p
  // The first x window copied before the cursor was known lands in the area the fold reuses.
  if constexpr (T::kTensorReplay) {
    if (c.speculative_x) mbarrier_wait(sm.x_full(0), 0);
  }
  const int col0 = Shape::col0();
  RoundingKey rounding_key{};
  if constexpr (T::kRound) rounding_key = RoundingKey::load(p.rounding_seed);
  const unsigned char* checkpoint = static_cast<const unsigned char*>(p.checkpoint);
  auto checkpoint_tile = [&](int head) {
    return checkpoint + (slot * p.ck_slot_stride + head * p.ck_head_stride) * kCkBytes;
  };
  auto issue_checkpoint = [&](int head) {  // into the ring's start, counted on barrier 0
    bulk_copy_tile_to_shared<kP, kN * kCkBytes>(sm.tile(0), checkpoint_tile(head), p.ck_row_stride * kCkBytes, sm.full(0));
  };
  if constexpr (T::kCopy) {
    // Every thread sees the read-copy tiles' phase (0) complete before the checkpoint tile is issued on
    // barrier 0. A parity wait names the current phase or the one before it, so a thread that waited
    // for the checkpoint (parity 1) while barrier 0's read-copy tile was still landing would pass at
    // once and could read the checkpoint tile before it arrives.
    for (int s = 0; s < c.first_stages; ++s) mbarrier_wait(sm.full(s), 0);
    __syncthreads();
    if (producer) {
      issue_checkpoint(c.head0);  // barrier 0's second phase
    }
  }
  if constexpr (Layout::kFoldBFloat32) {
    stage_B_fp32<kN, T::kAct>(sm.B_window(), c.B_buf, p.Bb_entry_stride, c.B_now, w);
  } else {
    stage_rows<kN, true>(sm.B_window(), c.B_buf, p.Bb_entry_stride, c.B_now, w);
    cp_async_commit();
  }
  // The window's x values are read once per head, when the coefficients are written; they were
  // requested into L2 one head earlier (bulk prefetch: no registers held across the fold), or, in the
  // copy folds at P <= 80, copied into the ring beside the checkpoint tile (kFoldStagedX).
  const int window_elems = (w + 1) * kP;
  auto load_x = [&](int head, int e) {
    const int j = e / kP, pr = e - j * kP;
    return j < w ? c.x_buf[head * p.xb_head_stride + j * p.xb_entry_stride + pr] : c.x_now(head)[pr];
  };
  auto prefetch_x = [&](int head) {  // entries 0 .. w - 1, contiguous when entry_stride == P
    if (p.xb_entry_stride == kP) prefetch_l2_if_aligned(c.x_buf + head * p.xb_head_stride, w * kP * sizeof(Act));
  };
  Act* const fold_x = reinterpret_cast<Act*>(sm.tile(0) + F::kCkTileBytes);  // after the checkpoint tile
  auto issue_fold_x = [&](int head) { c.issue_x_entries(fold_x, sm.x_full(1), head, w); };  // the token in slot w
  if (producer) {
    if constexpr (F::kFoldStagedX) {
      issue_fold_x(c.head0);  // into the ring, drained above
    } else {
      prefetch_x(c.head0);
    }
  }
  float c4[4];
  load_act4<T::kAct>(c.C_now, col0, c4);
  RowOperands<T::kAct> next_row;
  HeadDt next_dt{};
  if (row_owner) next_row = load_row_operands<T::kAct, false>(p, c.row, slot, c.head0, tid);
  if (scalar_warp) next_dt = load_head_dt(p, c.row, slot, c.head0, w);

  for (int i = 0; i < c.num_heads; ++i) {
    const int head = c.head0 + i;
    const int b = i & 1;
    const int stage = T::kCopy ? 0 : i % S;
    const RowOperands<T::kAct> cur = next_row;
    const HeadDt cur_dt = next_dt;
    if (i + 1 < c.num_heads) {
      if (row_owner) next_row = load_row_operands<T::kAct, false>(p, c.row, slot, head + 1, tid);
      if (scalar_warp) next_dt = load_head_dt(p, c.row, slot, head + 1, w);
    }
    if (scalar_warp) window_weights(cur_dt, current_dt(p, cur_dt), w, sm.wgt(b), sm.decay(b));
    cp_async_wait<0>();  // the B window (head 0), where it is staged by cp.async
    __syncthreads();     // the window weights of this head are in; the previous head's fold is done
    if (T::kTwoGroups && i == c.heads_per_group) {
      // The CTA's second group: its B window replaces the first's (no fold reads it now; the barrier
      // after the coefficients publishes it), and its C.
      if constexpr (Layout::kFoldBFloat32) {
        stage_B_fp32<kN, T::kAct>(sm.B_window(), c.B_buf1(), p.Bb_entry_stride, c.B_now1(), w);
      } else {
        stage_rows<kN, true>(sm.B_window(), c.B_buf1(), p.Bb_entry_stride, c.B_now1(), w);
        cp_async_commit();
        cp_async_wait<0>();
      }
      load_act4<T::kAct>(c.C_now1(), col0, c4);
    }

    // The coefficients wgt_j x_j[p]: all loads first (up to L = 16 at once), then the products: one L2
    // round trip, not one per element (none where kFoldStagedX: the window is in shared memory).
    float* coef = sm.fold_coef();
    if constexpr (F::kFoldStagedX) mbarrier_wait(sm.x_full(1), i & 1);
    {
      const float* wgt = sm.wgt(b);
      constexpr int kBatchElems = (16 * kP + kThreads - 1) / kThreads;
      for (int e0 = tid; e0 < window_elems; e0 += kBatchElems * kThreads) {
        Act xv[kBatchElems];
#pragma unroll
        for (int k = 0; k < kBatchElems; ++k) {
          const int e = e0 + k * kThreads;
          if (e < window_elems) xv[k] = F::kFoldStagedX ? fold_x[e] : load_x(head, e);
        }
#pragma unroll
        for (int k = 0; k < kBatchElems; ++k) {
          const int e = e0 + k * kThreads;
          if (e < window_elems) coef[Coef::index(e / kP, e % kP)] = wgt[e / kP] * to_float(xv[k]);
        }
      }
    }
    if (!F::kFoldStagedX && producer && i + 1 < c.num_heads) prefetch_x(head + 1);
    __syncthreads();  // the coefficients are in
    if (F::kFoldStagedX && producer && i + 1 < c.num_heads) {  // the x window is read: the next head's goes in
      fence_proxy_async();
      issue_fold_x(head + 1);
    }
    // The tile is waited for only now, so that the coefficients' x loads (an L2 round trip) overlap its
    // copy. With a read copy that copy is issued at the end of the previous head (waiting for it at the
    // head's start, the nano4b fp8-copy fold had 10% of its samples on that wait).
    mbarrier_wait(sm.full(stage), T::kCopy ? (i + 1) & 1 : (i / S) & 1);
    if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineItem0 + i);

    const float decay = *sm.decay(b);
    const typename Layout::FoldB* Bw = sm.B_window();
    unsigned char* const ck_smem = sm.tile(stage);
    auto ck_row = [&](int r) { return reinterpret_cast<typename V::Raw*>(ck_smem + (Shape::row(r) * kN + col0) * kCkBytes); };
    const int64_t tile = slot * p.ck_slot_stride + head * p.ck_head_stride;
    RoundingWords rounding_words;  // kRound: rows drawn in pairs, which kBatch (even) never splits
    uint32_t row_max = 0;          // kFp8CopyAtEnd: max|v| (abs_bits) of row lane_in_row (< RF)
#pragma unroll
    for (int r0 = 0; r0 < RF; r0 += kBatch) {
      float s[kBatch][4];
      FoldOperands<kBatch> operands;
      fold_rows<kP, kN, T::kCkpt, T::kAct, kBatch, F::kBByWords>(s, operands, ck_smem, r0, decay, coef, Bw, w + 1);
      if constexpr (F::kFoldYPairs) {  // no read copy here, an fp32 checkpoint
        // The output dots y_p = S_p . C over a row's lanes two rows at a time (reduce_scatter_rows,
        // bitwise row_sum's): 6 shuffles and adds per pair of rows at N = 128 instead of 10.
        constexpr int kSpan = Shape::kLanesPerRow / 2;  // the lanes that hold one row's y after it
#pragma unroll
        for (int g0 = 0; g0 < kBatch; g0 += 2) {  // kBatch is even
          float y[2] = {0.0f, 0.0f};               // a row past RF takes part as 0
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int rb = g0 + q;
            const int r = r0 + rb;
            if (r >= RF) continue;
#pragma unroll
            for (int k = 0; k < 4; ++k) y[q] += s[rb][k] * c4[k];
            if constexpr (T::kRound) {  // stochastic rounding
              uint32_t rw[2];
              rounding_words.get<RF>(rounding_key, slot, head, r, [](int k) { return Shape::row(k); }, col0, rw);
              stochastic_round4<T::kCkpt>(s[rb], rw);
            }
            store4<T::kCkpt>(p.checkpoint, tile + Shape::row(r) * p.ck_row_stride + col0, s[rb]);
          }
          const float y_own = reduce_scatter_rows<Shape::kLanesPerRow, 2>(y, SumOp{});
          const int own = Shape::lane_in_row() / kSpan;  // the pair's row whose y this lane holds
          if (Shape::lane_in_row() % kSpan == 0 && r0 + g0 + own < RF) sm.ydot(b)[Shape::row(r0 + g0 + own)] = y_own;
        }
      } else {
#pragma unroll
        for (int rb = 0; rb < kBatch; ++rb) {
          const int r = r0 + rb;
          if (r >= RF) break;
          const int pr = Shape::row(r);
          float y = 0.0f;
#pragma unroll
          for (int k = 0; k < 4; ++k) y += s[rb][k] * c4[k];
          if constexpr (T::kRound) {  // stochastic rounding; the read copy below is made from the rounded value
            uint32_t rw[2];
            rounding_words.get<RF>(rounding_key, slot, head, r, [](int k) { return Shape::row(k); }, col0, rw);
            stochastic_round4<T::kCkpt>(s[rb], rw);
          }
          store4<T::kCkpt>(p.checkpoint, tile + pr * p.ck_row_stride + col0, s[rb]);  // one whole store (store4)
          if constexpr (F::kFp8CopyAtEnd) {
            uint32_t bits = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) bits = max(bits, abs_bits(V::round_trip(s[rb][k])));
            bits = row_max_bits<Shape::kLanesPerRow>(bits);
            if (Shape::lane_in_row() == r) row_max = bits;
            *ck_row(r) = V::pack(s[rb]);
          } else if constexpr (T::kCopy && !F::kFp8CopyByBatch) {
            store_read_copy4<T::kCkpt, T::kRead, Shape::kLanesPerRow>(p, slot, head, pr, col0, s[rb]);
          }
          y = row_sum<Shape::kLanesPerRow>(y);
          if (Shape::lane_in_row() == 0) sm.ydot(b)[pr] = y;
        }
      }
      if constexpr (T::kCopy && F::kFp8CopyByBatch) {  // the batch's rows quantised together
        store_fp8_copy_rows<T::kCkpt, Shape::kLanesPerRow, kBatch>(p, slot, head, [&](int q) { return Shape::row(r0 + q); },
                                                                   col0, s);
      }
    }
    if constexpr (F::kFp8CopyAtEnd) {  // each thread reads back only the elements it wrote: no barrier
      const float amax = __uint_as_float(row_max);
      const float inv = fp8_inverse_scale(amax);
      const int own = Shape::lane_in_row();
      float* const scales = p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride;
      if (own < RF) scales[Shape::row(own)] = fp8_scale(amax);
#pragma unroll
      for (int r = 0; r < RF; ++r) {
        const float inv_r = __shfl_sync(kFullMask, inv, r, Shape::kLanesPerRow);
        float v[4];
        V::to_float(*ck_row(r), v);
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = fp8_scaled(v[k], inv_r);
        store4<DType::kFloat8E4M3>(p.read_copy,
                                   slot * p.rc_slot_stride + head * p.rc_head_stride + Shape::row(r) * p.rc_row_stride + col0, v);
      }
    }
    __syncthreads();
    // The checkpoint tile just folded is free: the next one goes in.
    if (producer) {
      if constexpr (T::kCopy) {
        if (i + 1 < c.num_heads) {
          fence_proxy_async();
          issue_checkpoint(head + 1);
        }
      } else if (i + S < c.num_heads) {
        fence_proxy_async();
        c.issue_tile(stage, head + S);
      }
    }
    if (row_owner) store_output<T::kAct>(p, c.row, head, tid, sm.ydot(b)[tid], cur);
  }
}

}  // namespace mamba2
}  // namespace replayssm
