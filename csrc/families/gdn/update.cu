// Conventional Gated DeltaNet decode (T = 1): read the state, update it, write it, output. Our baseline
// and the L = 1 path. Per (row, v-head hv, value channel v), with S the old state's row v:
//   alpha = exp(g); u = beta (v[v] - alpha (S . k)); S' = alpha S + u k; o[v] = alpha (S . q) + u (k . q)
// (o = S' q with both dots taken on the old row, so one pass over the row gives everything).
// KDA (kVectorGate): alpha is a K-vector; the row is decayed column by column first (S <- S diag(alpha)),
// then u = beta (v[v] - S . k); S' = S + u k; o[v] = S . q + u (k . q).
//
// Byte model per (row, hv): V K s read + V K s written (s = state bytes), plus q, k (K each, shared by
// the HV / H v-heads of a k-head), v and out (V each): the kernel should stream at copy bandwidth.
//
// Design: the rows of the delta rule are independent, so a CTA owns a block of rows of one (row, hv)
// (kRows rows a thread, 128 bytes of state a thread, 16 KB a CTA, several small CTAs per SM; the split
// kernel, for the smallest batches: 32 bytes a thread, 4 KB a CTA, launch/gdn_policy.cpp) and has no
// barrier: a thread issues all its state loads (16-byte chunks, 8 lanes a row, tile.cuh) at once as
// cp.async copies into its own shared-memory slots (so what is in flight is bounded by shared memory,
// not by registers), takes the norms of q and k over its row's lanes while they fly, then updates and
// stores each row as whole 16-byte vectors. Many small CTAs interleave the
// reads and writes of different tiles, the property that lets flash-linear-attention's fused_recurrent
// (8 rows a program) stream at 96-99% of copy with this [V, K] layout.
#include <cuda_runtime.h>

#include "cache/slot_map.cuh"
#include "common/bulk_copy.cuh"
#include "common/device_info.h"
#include "common/programmatic_launch.cuh"
#include "common/reduce.cuh"
#include "families/gdn/gates.cuh"
#include "families/gdn/params.h"
#include "families/gdn/tile.cuh"
#include "families/gdn/variants.h"
#include "launch/gdn_policy.h"
#include "launch/pdl.h"

namespace replayssm {
namespace gdn {
namespace {

constexpr int kUpdateThreads = 128;

// kSplit: 32 bytes of state a thread (4 KB a CTA) instead of 128 (16 KB).
template <int kK, int kV, DType kState, bool kSplit = false>
struct UpdateShape {
  // At most 8 elements a lane (16 lanes a row at K = 128): the thread's q and k stay few registers.
  using Lanes = RowLanes<kK, kState, kUpdateThreads, kK / 8>;
  static constexpr int kChunks = Lanes::kChunksPerLane;
  // Rows a thread: 128 (kSplit: 32) bytes of state in flight, within one tile.
  static constexpr int kThreadChunks = kSplit ? 2 : 8;
  static_assert(kThreadChunks % kChunks == 0, "whole rows a thread");
  static constexpr int kMaxRows = kV / Lanes::kRowsPerPass;
  static constexpr int kRows = kThreadChunks / kChunks < kMaxRows ? kThreadChunks / kChunks : kMaxRows;
  static constexpr int kRowsPerCta = kRows * Lanes::kRowsPerPass;
  static constexpr int kCtasPerHead = kV / kRowsPerCta;
  static_assert(kMaxRows >= 1 && kV % kRowsPerCta == 0, "a tile is whole CTAs of whole passes");
};

template <int kK, int kV, DType kState, DType kAct, bool kVectorGate, bool kSplit>
// pdl_wait: launched with programmatic dependent launch (launch/pdl.h); pdl_trigger: let the next kernel
// start early.
__global__ void __launch_bounds__(kUpdateThreads, 8) update_kernel(const GdnParams p, const bool pdl_wait,
                                                                   const bool pdl_trigger) {
  using Shape = UpdateShape<kK, kV, kState, kSplit>;
  using Lanes = typename Shape::Lanes;
  constexpr int R = Shape::kRows;
  constexpr int C = Shape::kChunks;
  constexpr int E = Lanes::kElemsPerChunk;
  constexpr int kLanes = Lanes::kLanes;
  const GdnTokens& tk = p.tokens;
  const int hv = static_cast<int>(blockIdx.x) / Shape::kCtasPerHead;
  const int v0 = (static_cast<int>(blockIdx.x) % Shape::kCtasPerHead) * Shape::kRowsPerCta + Lanes::first_row();
  const int row = blockIdx.y;
  const int h = hv / (p.v_heads / p.heads);
  auto value_row = [&](int r) { return v0 + r * Lanes::kRowsPerPass; };
  auto out_at = [&](int r) { return row * tk.out_row_stride + hv * tk.out_head_stride + value_row(r); };

  // Launched with PDL (common/programmatic_launch.cuh), the CTA may have started before the kernel ahead
  // of it ended: nothing global is read or written before the wait.
  wait_for_prior_grids(pdl_wait);
  if (pdl_trigger && threadIdx.x == 0) launch_dependent_grids();
  // The token's inputs do not depend on the slot: in flight while slots[row] comes back.
  const int64_t slot = resolve_slot(p, row);
  ActFrag<kAct, E> kf[C], qf[C];  // raw; normalised through the dot products and u below
#pragma unroll
  for (int i = 0; i < C; ++i) {
    kf[i].load(tk.k, row * tk.k_row_stride + h * tk.k_head_stride + Lanes::col(i));
    qf[i].load(tk.q, row * tk.q_row_stride + h * tk.q_head_stride + Lanes::col(i));
  }
  float vv[R];
#pragma unroll
  for (int r = 0; r < R; ++r) vv[r] = load_act<kAct>(tk.v, row * tk.v_row_stride + hv * tk.v_head_stride + value_row(r));
  const float a = load_gate_input(tk.a, tk.a_dtype, row * tk.a_row_stride + hv * tk.a_head_stride);
  const float b = load_gate_input(tk.b, tk.b_dtype, row * tk.b_row_stride + hv * tk.b_head_stride);
  const float A_log = __ldg(tk.A_log + hv), dt_bias = kVectorGate ? 0.0f : __ldg(tk.dt_bias + hv);
  // KDA: the decay of each of the thread's key channels.
  float alpha_c[kVectorGate ? C : 1][kVectorGate ? E : 1];
  if constexpr (kVectorGate) {
    channel_decays(alpha_c, p, row * tk.a_row_stride + hv * tk.a_head_stride, hv, A_log,
                   [](int i) { return Lanes::col(i); });
  }

  if (slot < 0) {  // touches nothing, zero output
    if (Lanes::lane() == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) store_act<kAct>(tk.out, out_at(r), 0.0f);
    }
    return;
  }

  // Every state chunk of the thread in flight at once, into its own shared-memory slots (cp.async):
  // the bytes in flight are bounded by shared memory, not by registers.
  const GdnCache& c = p.cache;
  const int64_t tile = slot * c.ck_slot_stride + hv * c.ck_head_stride;
  __shared__ uint4 staged[R * C][kUpdateThreads];
  const unsigned char* state = static_cast<const unsigned char*>(c.checkpoint);
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < C; ++i) {
      cp_async16(&staged[r * C + i][threadIdx.x],
                 state + (tile + value_row(r) * c.ck_row_stride + Lanes::col(i)) * dtype_size(kState));
    }
  }
  cp_async_commit();

  // The norms of q and k over the row's lanes (each lane group holds the whole vectors).
  float ss_k = 0.0f, ss_q = 0.0f, kq = 0.0f;
#pragma unroll
  for (int i = 0; i < C; ++i) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      ss_k += kf[i][e] * kf[i][e];
      ss_q += qf[i][e] * qf[i][e];
      kq += kf[i][e] * qf[i][e];
    }
  }
  ss_k = row_sum<kLanes>(ss_k);
  ss_q = row_sum<kLanes>(ss_q);
  kq = row_sum<kLanes>(kq);
  const float rk = key_scale(ss_k, tk.use_qk_l2norm);
  const float rq = key_scale(ss_q, tk.use_qk_l2norm) * tk.scale;
  const float kq_hat = kq * rk * rq;
  const float alpha = kVectorGate ? 1.0f : expf(log_decay(a, A_log, dt_bias));
  const float beta = beta_gate(b);
  cp_async_wait_all();  // a thread reads back only the chunks it copied: no barrier

#pragma unroll
  for (int r = 0; r < R; ++r) {
    float s[C][E];
    float dk = 0.0f, dq = 0.0f;
#pragma unroll
    for (int i = 0; i < C; ++i) {
      Chunk16<kState>::to_float(staged[r * C + i][threadIdx.x], s[i]);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        if constexpr (kVectorGate) s[i][e] *= alpha_c[i][e];
        dk += s[i][e] * kf[i][e];
        dq += s[i][e] * qf[i][e];
      }
    }
    dk = scaled_sum(row_sum<kLanes>(dk), rk);
    dq = scaled_sum(row_sum<kLanes>(dq), rq);
    // KDA: s, dk and dq are already decayed (alpha = 1 here). Rounded in a fixed order (gates.cuh): the
    // 16 KB and 4 KB CTAs give the same bits.
    const float u = corrected_value<kVectorGate>(vv[r], dk, alpha, beta);
    const float uk = u * rk;  // u k_hat = (u rk) k
    const int64_t at = tile + value_row(r) * c.ck_row_stride;
#pragma unroll
    for (int i = 0; i < C; ++i) {
#pragma unroll
      for (int e = 0; e < E; ++e) s[i][e] = decayed_plus<kVectorGate>(alpha, s[i][e], uk, kf[i][e]);
      store_chunk16<kState>(c.checkpoint, at + Lanes::col(i), s[i]);
    }
    if (Lanes::lane() == 0) {
      store_act<kAct>(tk.out, out_at(r), decayed_plus<kVectorGate>(alpha, dq, u, kq_hat));
    }
  }
}

template <int kK, int kV, DType kState, DType kAct, bool kVectorGate>
cudaError_t launch(const GdnParams& p, cudaStream_t stream) {
  launch::DeviceInfo device;
  const cudaError_t info = current_device_info(&device);  // cached after the first call
  if (info != cudaSuccess) return info;
  const launch::LaunchOverrides& overrides = launch::launch_overrides();
  const launch::GdnUpdatePlan plan = launch::plan_gdn_update(
      launch::GdnUpdateProblem{p.batch, p.v_heads, UpdateShape<kK, kV, kState>::kCtasPerHead,
                               UpdateShape<kK, kV, kState, true>::kCtasPerHead},
      device.sm_count, overrides);
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y));
  const launch::ProgrammaticLaunch pdl = launch::programmatic_launch(overrides, p.batch * p.v_heads, device.sm_count);
  auto kernel = plan.split ? update_kernel<kK, kV, kState, kAct, kVectorGate, true>
                           : update_kernel<kK, kV, kState, kAct, kVectorGate, false>;
  return launch_grid(kernel, grid, dim3(kUpdateThreads), 0, stream, pdl.wait, p, pdl.wait, pdl.trigger);
}

}  // namespace
}  // namespace gdn

cudaError_t launch_gdn_update(const GdnParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (p.batch < 0 || p.batch > 65535 || p.heads < 1 || p.v_heads < 1 || p.v_heads % p.heads != 0 ||
      p.tokens.num_tokens != 1) {
    return cudaErrorInvalidValue;
  }
  auto run = [&](auto vector_gate) {
    return REPLAYSSM_GDN_SHAPE_SWITCH(p.head_k_dim, p.head_v_dim, [&](auto K, auto V) {
      return REPLAYSSM_GDN_STATE_SWITCH(p.cache.checkpoint_dtype, [&](auto S) {
        return REPLAYSSM_GDN_ACTIVATION_SWITCH(p.act_dtype, [&](auto A) {
          return gdn::launch<decltype(K)::value, decltype(V)::value, decltype(S)::value, decltype(A)::value,
                             decltype(vector_gate)::value>(p, stream);
        });
      });
    });
  };
  return p.gate == GdnGate::kVector ? run(std::true_type{}) : run(std::false_type{});
}

}  // namespace replayssm
