// The replay step on CUDA cores: a 16-bit source of the other 16-bit type than the activations (there
// C is not in the source's type, so the tensor-core product does not apply: tile_on_tensor_cores).
//   y_p = e^{Lambda_w} s_p (S_read C)_p + sum_{j<=w} wgt_j (B_j . C) x_j[p] + D x_p
// Per head each thread reduces its 16-byte chunks of the tile against C (8 elements a chunk) into
// shared memory, one barrier, then the first warps finish the output rows (two threads per row where
// P <= 112) and store them coalesced; the last warp derives the next head's window weights meanwhile.
#pragma once

#include "families/mamba2/step_cta.cuh"

namespace replayssm {
namespace mamba2 {

// How the CTA covers a (P, N) tile of type T in 16-byte chunks: a row is N / kElems consecutive lanes,
// a pass covers kThreads / that many rows, and the last pass may be partial (fp8, P = 80).
template <int kP, int kN, DType T>
struct ChunkTile {
  static constexpr int kElems = Chunk16<T>::kElems;
  static constexpr int kLanesPerRow = kN / kElems;
  static constexpr int kRowsPerPass = kThreads / kLanesPerRow;
  static constexpr int kPasses = (kP + kRowsPerPass - 1) / kRowsPerPass;
  static_assert(kLanesPerRow >= 1 && kLanesPerRow <= 32 && 32 % kLanesPerRow == 0, "a row must sit inside one warp");

  __device__ static int lane_in_row() { return threadIdx.x % kLanesPerRow; }
  __device__ static int row(int r) { return static_cast<int>(threadIdx.x) / kLanesPerRow + r * kRowsPerPass; }
  __device__ static int col0() { return lane_in_row() * kElems; }
  __device__ static bool valid(int r) { return kP % kRowsPerPass == 0 || row(r) < kP; }
};

// The roles are StepCta's; the x windows are staged from the CTA's last thread down (three of them, two
// heads ahead, by cp.async).
template <class T>
__device__ __forceinline__ void step_core_replay(const StepCta<T>& c, StepEarly<T>& e) {
  using Act = typename T::Act;
  using Tile = ChunkTile<T::kP, T::kN, T::kSrc>;
  using Src = Chunk16<T::kSrc>;
  constexpr int kP = T::kP, kN = T::kN, S = T::kStages;
  constexpr int E = Tile::kElems;
  constexpr int R = Tile::kPasses;
  constexpr int kSplit = StepCta<T>::kSplit;
  // The CTA's cursor ticket: after its first per-head barrier, in a warp with no epilogue rows, so that
  // the round trip overlaps the first epilogue and the second head's reduction.
  constexpr int kCoreTicketThread = kThreads - 96;
  static_assert(kP * kSplit <= kCoreTicketThread, "the ticket's warp has no epilogue rows");
  const Mamba2Params& p = c.p;
  const typename T::Smem& sm = c.sm;
  const int L = c.L, w = c.w;
  const int tid = c.tid;
  const bool scalar_warp = c.scalar_warp;
  const bool producer = c.producer;
  const bool epilogue_thread = c.epilogue_thread;
  const int epilogue_row = c.epilogue_row;
  const int epilogue_part = c.epilogue_part;
  // Head `head`'s x window into window k: entries 0..w - 1, the current token in slot L - 1.
  auto stage_x_window = [&](int k, int head) {
    stage_rows<kP, false>(sm.x_window(k), c.x_buf + head * p.xb_head_stride, p.xb_entry_stride, c.x_now(head), w, L - 1);
  };
  stage_x_window(0, c.head0);
  cp_async_commit();
  if (c.num_heads > 1) stage_x_window(1, c.head0 + 1);
  cp_async_commit();
  float cv[E];
#pragma unroll
  for (int k = 0; k < E / 4; ++k) {
    float q[4];
    Vec4<T::kAct>::to_float(Vec4<T::kAct>::load(c.C_now, Tile::col0() + 4 * k), q);
#pragma unroll
    for (int u = 0; u < 4; ++u) cv[4 * k + u] = q[u];
  }
  const bool loads_row = epilogue_thread && epilogue_part == 0;
  RowOperands<T::kAct> next_row;
  if (loads_row) next_row = load_row_operands<T::kAct, T::kScaled>(p, c.row, c.slot, c.head0, epilogue_row);
  HeadDt next_dt{};
  if (scalar_warp) next_dt = load_head_dt(p, c.row, c.slot, c.head0, w);
  // The first head's barrier publishes the dots before any epilogue reads them.
  e.dots_in.finish(w, sm.dots());

  for (int i = 0; i < c.num_heads; ++i) {
    const int head = c.head0 + i;
    const int stage = i % S;
    const int b = i & 1;
    const RowOperands<T::kAct> cur = next_row;
    const HeadDt cur_dt = next_dt;
    if (i + 1 < c.num_heads) {
      if (loads_row) next_row = load_row_operands<T::kAct, T::kScaled>(p, c.row, c.slot, head + 1, epilogue_row);
      if (scalar_warp) next_dt = load_head_dt(p, c.row, c.slot, head + 1, w);
    }
    float dt_now = 0.0f;
    if (scalar_warp) {
      dt_now = current_dt(p, cur_dt);
      window_weights(cur_dt, dt_now, w, sm.wgt(b), sm.decay(b));
    }

    mbarrier_wait(sm.full(stage), (i / S) & 1);
    if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineItem0 + i);
    const unsigned char* tile = sm.tile(stage);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float d = 0.0f;
      if (Tile::valid(r)) {
        float v[E];
        Src::to_float(*reinterpret_cast<const uint4*>(tile + (Tile::row(r) * kN + Tile::col0()) * T::kSrcBytes), v);
#pragma unroll
        for (int k = 0; k < E; ++k) d += v[k] * cv[k];
      }
      d = row_sum<Tile::kLanesPerRow>(d);
      if (Tile::lane_in_row() == 0 && Tile::valid(r)) sm.ydot(b)[Tile::row(r)] = d;
    }
    cp_async_wait<1>();  // this head's x window (the next head's may still be in flight)
    __syncthreads();

    // Stage `stage` and x window (i + 2) % 3 (last read by head i - 1) are free again.
    if (producer && i + S < c.num_heads) {
      fence_proxy_async();
      c.issue_tile(stage, head + S);
    }
    if (i + 2 < c.num_heads) stage_x_window((i + 2) % 3, head + 2);
    cp_async_commit();
    if (i == 0 && tid == kCoreTicketThread) c.take_ticket();

    if (epilogue_thread) {
      const int pr = epilogue_row;
      const Act* xw = sm.x_window(i % 3);
      const float* wgt = sm.wgt(b);
      const float* dots = sm.dots();
      float y = 0.0f;
      for (int j = epilogue_part; j < w; j += kSplit) y += wgt[j] * dots[j] * to_float(xw[j * kP + pr]);
      if (epilogue_part == w % kSplit) y += wgt[w] * dots[w] * to_float(xw[(L - 1) * kP + pr]);  // the token
      if constexpr (kSplit == 2) y += __shfl_xor_sync(kFullMask, y, 1);
      if (epilogue_part == 0) {
        y += *sm.decay(b) * cur.scale * sm.ydot(b)[pr];
        store_output<T::kAct>(p, c.row, head, pr, y, cur);
        c.append_x(head, pr, cur.x);
      }
    }
    if (scalar_warp && (tid & 31) == 0) p.dt_buf[c.slot * p.dtb_slot_stride + head * p.dtb_head_stride + w] = dt_now;
  }
  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineConsumerEnd);
}

}  // namespace mamba2
}  // namespace replayssm
