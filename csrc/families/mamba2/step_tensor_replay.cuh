// The replay step on tensor cores (fp8 copies, 16-bit copies of the activations' type, the fp32
// checkpoint in tf32 pairs): a warp-specialised CTA (TensorReplay's roles) with no CTA barrier per head.
//   y_p = e^{Lambda_w} s_p (S_read C)_p + sum_{j<=w} wgt_j (B_j . C) x_j[p] + D x_p
// The consumer warps reduce each head's tile against C on tensor cores (TensorDot) and finish their
// rows (or, kSplitEpilogue, hand the dots to the epilogue warps); one thread refills the ring, each
// stage's x window beside its tile; the scalar warp derives the window weights one head ahead.
#pragma once

#include "families/mamba2/step_cta.cuh"

namespace replayssm {
namespace mamba2 {

// A thread's place among TensorReplay's roles.
struct ReplayWarp {
  int warp;
  int lane;
  bool consumer;  // one of the first kConsumers warps
  int first_row;  // a consumer's rows: first_row .. first_row + kRowsPerWarp - 1
};

// The set-up after the cursor: the first stages' x windows, the window dots, C's fragments (and the
// second group's, kTwoGroups), one barrier, then the CTA's cursor ticket.
template <class T>
__device__ __forceinline__ void tensor_replay_set_up(const StepCta<T>& c, StepEarly<T>& e) {
  using Roles = typename T::Roles;
  using Dot = TensorDot<T::kN, T::kSrc, T::kAct>;
  const Mamba2Params& p = c.p;
  const typename T::Smem& sm = c.sm;
  const int tid = c.tid;
  // The first stages' tiles went in before the cursor was known; their x windows go in now (the
  // first head's already did where speculative_x), the current token in slot L - 1.
  if (tid == Roles::kProducerThread) {
    for (int s = c.speculative_x ? 1 : 0; s < c.first_stages; ++s) {
      c.issue_x_entries(sm.x_window(s), sm.x_full(s), c.head0 + s, c.L - 1);
    }
  }
  e.dots_in.finish(c.w, sm.dots());
  if (tid < 32) Dot::write_c(c.C_now, sm.c_frags());
  if constexpr (T::kTwoGroups) {  // the second group's, from L2: by then the first tile is still in flight
    WindowDots<T::kN, T::kAct> dots1;
    dots1.issue(c.B_buf1(), p.Bb_entry_stride, c.B_now1(), c.C_now1(), c.L);
    dots1.finish(c.w, sm.dots(1));
    if (tid >= 32 && tid < 64) Dot::write_c(c.C_now1(), sm.c_frags(1));
  }
  __syncthreads();  // the dots and C's fragments are in
  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineSetUp);
  if (tid == Roles::kTicketThread) c.take_ticket();
}

// kSplitEpilogue's consumers: (S C) of the warp's 16 rows, head after head, into the head dots of the
// head's parity; the tile goes back to the ring as soon as it is reduced (its x window is the
// epilogue's).
template <class T>
__device__ __forceinline__ void tensor_replay_split_consumer(const StepCta<T>& c, const ReplayWarp& rw) {
  using Roles = typename T::Roles;
  using Dot = TensorDot<T::kN, T::kSrc, T::kAct>;
  constexpr int S = T::kStages;
  const Mamba2Params& p = c.p;
  const typename T::Smem& sm = c.sm;
  const int tid = c.tid;
  const int first_row = rw.first_row;
  const uint32_t* cfrag0 = sm.c_frags();
  const int g = rw.lane >> 2;
  for (int i = 0; i < c.num_heads; ++i) {
    const int stage = i % S;
    const int b = i & 1;
    mbarrier_wait(sm.full(stage), (i / S) & 1);
    if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineItem0 + i);
    float y_g, y_g8;
    // The two-group kernels keep the plain load order (kFlip = false): with the conflict-free one
    // nano4b's fp8 step at b64 (the batches these kernels run) was 1% slower, a ptxas layout effect.
    Dot::template dot<!T::kTwoGroups>(sm.tile(stage), first_row, T::kTwoGroups ? sm.c_frags(c.group_of(i)) : cfrag0, y_g,
                                      y_g8);
    mbarrier_arrive(sm.empty(stage));
    if (i >= 2) mbarrier_wait(sm.dots_free(b), ((i >> 1) - 1) & 1);  // head i - 2's dots are read
    if ((rw.lane & 3) == 0) {  // rows g and g + 8 of the tile: every lane of a quad holds them
      float* const dots = sm.head_dots(b);
      dots[first_row + g] = y_g;
      dots[first_row + g + 8] = y_g8;
    }
    mbarrier_arrive(sm.dots_ready(b));
  }
  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineConsumerEnd);
}

// kSplitEpilogue's epilogue warps, thread pr for output row pr: the window term sum_{j<=w} wgt_j (B_j .
// C) x_j[pr] from the stage's x window, then the head's dot, D, the gate, the output and the append.
// kWindowMma: the window term of the warp's 32 rows on tensor cores (two 16-row tiles), lane 4 g + c
// then taking row 16 (c / 2) + g + 8 (c % 2) of them (WindowMma::row_term).
template <class T>
__device__ __forceinline__ void tensor_replay_split_epilogue(const StepCta<T>& c, const ReplayWarp& rw) {
  using Act = typename T::Act;
  using Roles = typename T::Roles;
  using Dot = TensorDot<T::kN, T::kSrc, T::kAct>;
  constexpr int kP = T::kP, S = T::kStages;
  const Mamba2Params& p = c.p;
  const typename T::Smem& sm = c.sm;
  const int L = c.L, w = c.w;
  const int tid = c.tid;
  const int lane = rw.lane;
  const int epilogue_row0 = 32 * (rw.warp - Roles::kConsumers);
  const int pr = T::kWindowMma ? epilogue_row0 + 16 * ((lane >> 1) & 1) + (lane >> 2) + 8 * (lane & 1)
                               : tid - 32 * Roles::kConsumers;
  const float c_unscale0 = Dot::c_unscale(sm.c_frags());
  // z and the fp8 scale of the row, loaded two heads ahead (as the consumers do without the split).
  auto load_row = [&](RowOperands<T::kAct>& o, int head) {
    if (p.z != nullptr) o.z = static_cast<const Act*>(p.z)[c.row * p.z_row_stride + head * p.z_head_stride + pr];
    if constexpr (T::kScaled) o.scale = __ldg(p.read_scale + c.slot * p.rs_slot_stride + head * p.rs_head_stride + pr);
  };
  auto one_head = [&](int i, RowOperands<T::kAct>& cur) {
    const int head = c.head0 + i;
    const int stage = i % S;
    const int b = i & 1;
    mbarrier_wait(sm.x_full(stage), (i / S) & 1);
    mbarrier_wait(sm.weights_written(b), (i >> 1) & 1);
    const Act* xw = sm.x_window(stage);
    const float decay = *sm.decay(b);
    cur.D = *sm.head_D(b);
    cur.x = xw[(L - 1) * kP + pr];  // the current token (entry w), in slot L - 1
    float y;
    if constexpr (T::kWindowMma) {
      static_assert(kP % 32 == 0, "an epilogue warp's rows: two whole 16-row tiles");
      const uint16_t* wf = sm.wfrag(b);
      float acc[2][4] = {};
#pragma unroll 1
      for (int k0 = 0; k0 <= w; k0 += 16) {
        const uint2 bw = WindowMma::b_frag(wf, k0);
        const Act* a_row = WindowMma::a_row<kP>(xw, k0, w, L, epilogue_row0);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          uint32_t a[4];
          ldmatrix_x4_trans(a, a_row + 16 * t);
          mma_m16n8k16<true>(acc[t], a[0], a[1], a[2], a[3], bw.x, bw.y);
        }
      }
      const float tile0 = WindowMma::row_term(acc[0]);
      const float tile1 = __shfl_xor_sync(kFullMask, WindowMma::row_term(acc[1]), 2);  // to lanes c = 2, 3
      y = (lane & 2) ? tile1 : tile0;
    } else {
      // Entries in groups of 4 (window_group4), a thread per row.
      const float* wd = sm.wgt(b);  // wgt_j (B_j . C), zeros past w
      float y_odd = 0.0f;
      y = 0.0f;
#pragma unroll 1
      for (int j0 = 0; j0 <= w; j0 += 4) {
        const WindowGroup4 g = window_group4<kP>(wd, xw, j0, w, L, pr);
        y += g.wgt.x * g.x[0];
        y_odd += g.wgt.y * g.x[1];
        y += g.wgt.z * g.x[2];
        y_odd += g.wgt.w * g.x[3];
      }
      y += y_odd;
    }
    mbarrier_arrive(sm.empty(stage));  // the stage's x window is read
    mbarrier_arrive(sm.weights_read(b));
    mbarrier_wait(sm.dots_ready(b), (i >> 1) & 1);
    const float dot = sm.head_dots(b)[pr];
    mbarrier_arrive(sm.dots_free(b));
    y += decay * cur.scale * (dot * (T::kTwoGroups ? Dot::c_unscale(sm.c_frags(c.group_of(i))) : c_unscale0));
    store_output<T::kAct>(p, c.row, head, pr, y, cur);
    c.append_x(head, pr, cur.x);
    if (i + 2 < c.num_heads) load_row(cur, head + 2);
  };
  RowOperands<T::kAct> even, odd;
  load_row(even, c.head0);
  if (c.num_heads > 1) load_row(odd, c.head0 + 1);
  for (int i = 0; i < c.num_heads; i += 2) {
    one_head(i, even);
    if (i + 1 < c.num_heads) one_head(i + 1, odd);
  }
  if (pr == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineOtherEnd);
}

// The consumers without the split: each warp reduces its kTilesPerWarp tiles of 16 rows, then adds the
// window term and finishes its rows: two lanes per row and half the lanes storing (part 0), or,
// kWindowMma, lanes 4 g + c with c = 0, 1 taking row g + 8 c of a tile (WindowMma::row_term).
template <class T>
__device__ __forceinline__ void tensor_replay_consumer(const StepCta<T>& c, const ReplayWarp& rw) {
  using Act = typename T::Act;
  using Roles = typename T::Roles;
  using Dot = TensorDot<T::kN, T::kSrc, T::kAct>;
  constexpr int kP = T::kP, S = T::kStages;
  constexpr int kTiles = Roles::kTilesPerWarp;
  const Mamba2Params& p = c.p;
  const typename T::Smem& sm = c.sm;
  const int L = c.L, w = c.w;
  const int tid = c.tid;
  const int lane = rw.lane;
  const int first_row = rw.first_row;
  const int row_in_tile = T::kWindowMma ? (lane >> 2) + 8 * (lane & 1) : lane >> 1;
  const int part = T::kWindowMma ? (lane >> 1) & 1 : lane & 1;
  const uint32_t* cfrag0 = sm.c_frags();
  const float c_unscale0 = Dot::c_unscale(cfrag0);
  // The only per-head global loads of a consumer: z and the fp8 scales of its rows (x is in the
  // stage's x window, D in shared memory). Loaded right after head i - 2 used the same registers:
  // two heads of latency, and no register copy that waits for them.
  auto load_rows = [&](RowOperands<T::kAct>(&rows)[kTiles], int head) {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      if (part == 0) {
        const int pr = first_row + 16 * t + row_in_tile;
        if (p.z != nullptr) rows[t].z = static_cast<const Act*>(p.z)[c.row * p.z_row_stride + head * p.z_head_stride + pr];
        if constexpr (T::kScaled) rows[t].scale = __ldg(p.read_scale + c.slot * p.rs_slot_stride + head * p.rs_head_stride + pr);
      }
    }
  };
  auto one_head = [&](int i, RowOperands<T::kAct>(&cur)[kTiles]) {
    const int head = c.head0 + i;
    const int stage = i % S;
    const int b = i & 1;
    const uint32_t phase = (i / S) & 1;

    mbarrier_wait(sm.full(stage), phase);
    if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineItem0 + i);
    const uint32_t* cfrag = T::kTwoGroups ? sm.c_frags(c.group_of(i)) : cfrag0;
    const float c_unscale = T::kTwoGroups ? Dot::c_unscale(cfrag) : c_unscale0;
    float y_g[kTiles], y_g8[kTiles];
#pragma unroll
    // Two-group kernels: the plain load order (kFlip = false), as in the split consumers.
    for (int t = 0; t < kTiles; ++t) Dot::template dot<!T::kTwoGroups>(sm.tile(stage), first_row + 16 * t, cfrag, y_g[t], y_g8[t]);

    mbarrier_wait(sm.x_full(stage), phase);
    mbarrier_wait(sm.weights_written(b), (i >> 1) & 1);
    const Act* xw = sm.x_window(stage);
    const float decay = *sm.decay(b);
    const float head_D = *sm.head_D(b);
    if constexpr (T::kWindowMma) {
      // The window term of the warp's tiles on tensor cores, then lanes c = 0, 1 of each quad finish
      // rows g and g + 8: their dots are y_g and y_g8 in their own lanes.
      const uint16_t* wf = sm.wfrag(b);
      float acc[kTiles][4] = {};
#pragma unroll 1
      for (int k0 = 0; k0 <= w; k0 += 16) {
        const uint2 bw = WindowMma::b_frag(wf, k0);
        const Act* a_row = WindowMma::a_row<kP>(xw, k0, w, L, first_row);
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          uint32_t a[4];
          ldmatrix_x4_trans(a, a_row + 16 * t);
          mma_m16n8k16<true>(acc[t], a[0], a[1], a[2], a[3], bw.x, bw.y);
        }
      }
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const float term = WindowMma::row_term(acc[t]);
        if (part == 0) {
          const int pr = first_row + 16 * t + row_in_tile;
          cur[t].D = head_D;
          cur[t].x = xw[(L - 1) * kP + pr];  // the current token (entry w), in slot L - 1
          const float y = term + decay * cur[t].scale * (((lane & 1) == 0 ? y_g[t] : y_g8[t]) * c_unscale);
          store_output<T::kAct>(p, c.row, head, pr, y, cur[t]);
          c.append_x(head, pr, cur[t].x);
        }
      }
    } else {
      const float* wd = sm.wgt(b);  // wgt_j (B_j . C)
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const int pr = first_row + 16 * t + row_in_tile;
        cur[t].D = head_D;
        cur[t].x = xw[(L - 1) * kP + pr];  // the current token (entry w), in slot L - 1
        // The window term sum_{j<=w} wgt_j x_j over entries 0 .. w in groups of 8, lane `part` taking
        // 4 of each (window_group4; the scalar warp writes the weights zero past w, up to the end of
        // w's 32-entry half, which covers every group of 8 read here).
        float y = 0.0f, y_odd = 0.0f;
#pragma unroll 1
        for (int j0 = 0; j0 <= w; j0 += 8) {
          const WindowGroup4 g = window_group4<kP>(wd, xw, j0 + 4 * part, w, L, pr);
          y += g.wgt.x * g.x[0];
          y_odd += g.wgt.y * g.x[1];
          y += g.wgt.z * g.x[2];
          y_odd += g.wgt.w * g.x[3];
        }
        y += y_odd;
        y += __shfl_xor_sync(kFullMask, y, 1);
        // Row g's dot sits in the lanes of quad g: y_g for rows 0..7 of the tile, y_g8 for 8..15.
        const int quad_lane = 4 * (row_in_tile & 7);
        const float dot_g = __shfl_sync(kFullMask, y_g[t], quad_lane);
        const float dot_g8 = __shfl_sync(kFullMask, y_g8[t], quad_lane);
        if (part == 0) {
          y += decay * cur[t].scale * ((row_in_tile < 8 ? dot_g : dot_g8) * c_unscale);
          store_output<T::kAct>(p, c.row, head, pr, y, cur[t]);
          c.append_x(head, pr, cur[t].x);
        }
      }
    }
    mbarrier_arrive(sm.empty(stage));  // the stage's tile and x window are read
    mbarrier_arrive(sm.weights_read(b));
    if (i + 2 < c.num_heads) load_rows(cur, head + 2);
  };
  RowOperands<T::kAct> even[kTiles], odd[kTiles];
  load_rows(even, c.head0);
  if (c.num_heads > 1) load_rows(odd, c.head0 + 1);
  for (int i = 0; i < c.num_heads; i += 2) {
    one_head(i, even);
    if (i + 1 < c.num_heads) one_head(i + 1, odd);
  }
  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineConsumerEnd);
}

// The producer's thread: stage i % S refilled with head i's tile and x window once every consumer warp
// is done with head i - S. Besides those, a head's small operands are asked into L2 as early as its
// tile: a consumer warp finishes a head in well under a DRAM round trip, so the row operands it loads
// two heads ahead (z, fp8 scales) and the scalar warp's dt window would otherwise each cost one on the
// critical path.
template <class T>
__device__ __forceinline__ void tensor_replay_producer(const StepCta<T>& c) {
  using Act = typename T::Act;
  constexpr int kP = T::kP, S = T::kStages;
  const Mamba2Params& p = c.p;
  const typename T::Smem& sm = c.sm;
  auto prefetch_operands = [&](int head) {
    if (p.z != nullptr) {
      prefetch_l2_if_aligned(static_cast<const Act*>(p.z) + c.row * p.z_row_stride + head * p.z_head_stride, kP * sizeof(Act));
    }
    if constexpr (T::kScaled) {
      prefetch_l2_if_aligned(p.read_scale + c.slot * p.rs_slot_stride + head * p.rs_head_stride, kP * sizeof(float));
    }
    prefetch_l2_if_aligned(p.dt_buf + c.slot * p.dtb_slot_stride + head * p.dtb_head_stride, c.L * sizeof(float));
  };
  for (int i = 0; i < c.first_stages; ++i) prefetch_operands(c.head0 + i);
  for (int i = S; i < c.num_heads; ++i) {
    const int stage = i % S;
    mbarrier_wait(sm.empty(stage), (i / S - 1) & 1);  // every consumer warp is done with head i - S
    fence_proxy_async();
    c.issue_tile(stage, c.head0 + i);
    c.issue_x_entries(sm.x_window(stage), sm.x_full(stage), c.head0 + i, c.L - 1);
    prefetch_operands(c.head0 + i);
  }
}

// The scalar warp: head i's window weights times the window dots (window_weights<true>), its decay and
// D into the buffers of parity i & 1, one head ahead of the readers; and the current token's dt
// appended.
template <class T>
__device__ __forceinline__ void tensor_replay_scalar_warp(const StepCta<T>& c, const ReplayWarp& rw, const StepEarly<T>& e) {
  const Mamba2Params& p = c.p;
  const typename T::Smem& sm = c.sm;
  const int w = c.w;
  const int lane = rw.lane;
  const int end = c.head0 + c.num_heads;
  HeadScalars batch = e.scalars_first;      // heads i .. i + 31
  HeadScalars next_batch = e.scalars_next;  // the 32 after
  // The current token's dt of head i + lane (bias, softplus), computed once per 32 heads, all lanes at
  // once, when the batch comes into use: its loads were issued 32 heads before. Per head it was about a
  // quarter of the scalar warp's instructions, on the path of every head's weights.
  float batch_dt = 0.0f;
  // The window dots into registers before the first fragments go over them (kWindowMma).
  const LaneDots dots0 = load_lane_dots(sm.dots(0));
  LaneDots dots1{};
  if constexpr (T::kTwoGroups) dots1 = load_lane_dots(sm.dots(1));
  __syncwarp();
  auto one_head = [&](int i, const DtWindow& window) {
    const int head = c.head0 + i;
    const int b = i & 1;
    if (i % 32 == 0) {
      if (i > 0) {
        batch = next_batch;
        next_batch = load_head_scalars(p, c.row, head + 32 + lane, end);
      }
      batch_dt = current_dt(p, batch.now_bits, batch.bias);
      // Appended as entry w of heads i .. i + 31 at once (nothing in this launch reads entry w).
      if (head + lane < end) p.dt_buf[c.slot * p.dtb_slot_stride + (head + lane) * p.dtb_head_stride + w] = batch_dt;
    }
    HeadDt cur_dt;  // now_bits and bias unset: the current dt is batch_dt's
#pragma unroll
    for (int h = 0; h < kMamba2MaxBufferLen / 32; ++h) cur_dt.buffered[h] = window.buffered[h];
    cur_dt.A = __shfl_sync(kFullMask, batch.A, i & 31);
    const float dt_now = __shfl_sync(kFullMask, batch_dt, i & 31);
    const float head_D = __shfl_sync(kFullMask, batch.D, i & 31);
    if (i >= 2) mbarrier_wait(sm.weights_read(b), ((i >> 1) - 1) & 1);  // head i - 2 is done with buffer b
    LaneDots dots = dots0;
#pragma unroll
    for (int h = 0; h < kMamba2MaxBufferLen / 32; ++h) dots.v[h] = c.group_of(i) ? dots1.v[h] : dots0.v[h];  // no local copy
    window_weights<true, T::kWindowMma>(cur_dt, dt_now, w, sm.wgt(b), sm.decay(b), dots, sm.wfrag(b));
    if (lane == 0) *sm.head_D(b) = head_D;
    mbarrier_arrive(sm.weights_written(b));
  };
  // Heads in pairs, each window register set refilled right after its use: a window is loaded two
  // heads before it is needed, with no register copy (which would wait for the load) in between.
  DtWindow even = e.dt_even;
  DtWindow odd = e.dt_odd;
  for (int i = 0; i < c.num_heads; i += 2) {
    one_head(i, even);
    if (i + 2 < c.num_heads) even = load_dt_window(p, c.slot, c.head0 + i + 2, w);
    if (i + 1 < c.num_heads) {
      one_head(i + 1, odd);
      if (i + 3 < c.num_heads) odd = load_dt_window(p, c.slot, c.head0 + i + 3, w);
    }
  }
}

// ---- The tensor-core replay: the set-up, then each warp its role --------------------------------
template <class T>
__device__ __forceinline__ void step_tensor_replay(const StepCta<T>& c, StepEarly<T>& e) {
  using Roles = typename T::Roles;
  using Dot = TensorDot<T::kN, T::kSrc, T::kAct>;
  static_assert(Dot::kCWords * 4 <= 2 * 4 * T::kP, "C's fragments fit in the ydot area");
  static_assert(Dot::kCWords * 4 <= 4 * T::kN, "the second group's C fragments fit in theirs (StepLayout)");
  ReplayWarp rw;
  rw.warp = c.tid / 32;
  rw.lane = c.tid & 31;
  rw.consumer = rw.warp < Roles::kConsumers;
  rw.first_row = rw.warp * Roles::kRowsPerWarp;
  tensor_replay_set_up(c, e);
  if constexpr (T::kSplitEpilogue) {
    if (rw.consumer) {
      tensor_replay_split_consumer(c, rw);
    } else if (rw.warp < Roles::kConsumers + Roles::kEpilogueWarps) {
      tensor_replay_split_epilogue(c, rw);
    }
  }
  if (rw.consumer && !T::kSplitEpilogue) {
    tensor_replay_consumer(c, rw);
  } else if (c.tid == Roles::kProducerThread) {
    tensor_replay_producer(c);
  } else if (c.scalar_warp) {
    tensor_replay_scalar_warp(c, rw, e);
  }
}

}  // namespace mamba2
}  // namespace replayssm
