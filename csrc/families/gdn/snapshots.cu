// Conventional speculative Gated DeltaNet step (the baseline of verify + commit): T tokens per row from
// the state of its slot, which is only read, and the state after every token written to
// snapshots[row, t] (the engine keeps the accepted one). Token by token it is gdn_update: the output
// of token t from the fp32 state, then the state rounded to its dtype (the snapshot), and token t + 1
// starts from the rounded value, exactly as T calls of gdn_update would (KDA, kVectorGate: of
// kda_update, the row decayed column by column as in update.cu). Pad and out-of-range rows
// read nothing and get zero snapshots and zero output.
//
// Byte model per (row, hv): V K s read once + T V K s written (s = state bytes), plus the T tokens'
// q, k, v and out: a write stream at copy bandwidth.
//
// Design: update.cu's (rows independent, a CTA owns a block of rows of one (row, hv), 8 lanes a row,
// 16-byte vectors), with the thread's rows kept in fp32 registers for all T tokens (32 values a
// thread) and each token's q, k, v, a, b read as the token comes (L2-resident, shared by the CTAs of a
// row). No shared memory, no barrier.
#include <cuda_runtime.h>

#include "cache/slot_map.cuh"
#include "common/reduce.cuh"
#include "families/gdn/gates.cuh"
#include "families/gdn/params.h"
#include "families/gdn/tile.cuh"
#include "families/gdn/variants.h"
#include "launch/gdn_policy.h"

namespace replayssm {
namespace gdn {
namespace {

constexpr int kSnapshotThreads = 128;

template <int kK, int kV, DType kState>
struct SnapshotShape {
  using Lanes = RowLanes<kK, kState, kSnapshotThreads, kK / 8>;  // 8 elements a lane
  // Rows a thread: 32 fp32 state values kept across the tokens, within one tile.
  static constexpr int kMaxRows = kV / Lanes::kRowsPerPass;
  static constexpr int kRows = 32 / Lanes::kElemsPerLane < kMaxRows ? 32 / Lanes::kElemsPerLane : kMaxRows;
  static constexpr int kRowsPerCta = kRows * Lanes::kRowsPerPass;
  static constexpr int kCtasPerHead = kV / kRowsPerCta;
  static_assert(kRows >= 1 && kV % kRowsPerCta == 0, "a tile is whole CTAs of whole passes");
};

template <int kK, int kV, DType kState, DType kAct, bool kVectorGate>
__global__ void __launch_bounds__(kSnapshotThreads, 4) snapshots_kernel(const GdnParams p) {
  using Shape = SnapshotShape<kK, kV, kState>;
  using Lanes = typename Shape::Lanes;
  constexpr int R = Shape::kRows;
  constexpr int C = Lanes::kChunksPerLane;
  constexpr int E = Lanes::kElemsPerChunk;
  constexpr int kLanes = Lanes::kLanes;
  const GdnTokens& tk = p.tokens;
  const int T = tk.num_tokens;
  const int hv = static_cast<int>(blockIdx.x) / Shape::kCtasPerHead;
  const int v0 = (static_cast<int>(blockIdx.x) % Shape::kCtasPerHead) * Shape::kRowsPerCta + Lanes::first_row();
  const int row = blockIdx.y;
  const int h = hv / (p.v_heads / p.heads);
  auto value_row = [&](int r) { return v0 + r * Lanes::kRowsPerPass; };
  auto snapshot_at = [&](int t, int r) {
    return row * p.sn_row_stride + t * p.sn_token_stride + hv * p.sn_head_stride + value_row(r) * p.sn_v_stride;
  };
  auto out_at = [&](int t, int r) {
    return row * tk.out_row_stride + t * tk.out_token_stride + hv * tk.out_head_stride + value_row(r);
  };

  const int64_t slot = resolve_slot(p, row);
  if (slot < 0) {
    const float zero[E] = {};
    for (int t = 0; t < T; ++t) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int i = 0; i < C; ++i) store_chunk16<kState>(p.snapshots, snapshot_at(t, r) + Lanes::col(i), zero);
        if (Lanes::lane() == 0) store_act<kAct>(tk.out, out_at(t, r), 0.0f);
      }
    }
    return;
  }

  const GdnCache& c = p.cache;
  const int64_t tile = slot * c.ck_slot_stride + hv * c.ck_head_stride;
  float s[R][C][E];
  {
    uint4 raw[R][C];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < C; ++i) raw[r][i] = Chunk16<kState>::load(c.checkpoint, tile + value_row(r) * c.ck_row_stride + Lanes::col(i));
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < C; ++i) Chunk16<kState>::to_float(raw[r][i], s[r][i]);
    }
  }
  const float A_log = __ldg(tk.A_log + hv), dt_bias = kVectorGate ? 0.0f : __ldg(tk.dt_bias + hv);

  for (int t = 0; t < T; ++t) {
    ActFrag<kAct, E> kf[C], qf[C];  // raw; normalised through the dot products and u below
    float vv[R];
#pragma unroll
    for (int i = 0; i < C; ++i) {
      kf[i].load(tk.k, row * tk.k_row_stride + t * tk.k_token_stride + h * tk.k_head_stride + Lanes::col(i));
      qf[i].load(tk.q, row * tk.q_row_stride + t * tk.q_token_stride + h * tk.q_head_stride + Lanes::col(i));
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      vv[r] = load_act<kAct>(tk.v, row * tk.v_row_stride + t * tk.v_token_stride + hv * tk.v_head_stride + value_row(r));
    }
    const float a = load_gate_input(tk.a, tk.a_dtype, row * tk.a_row_stride + t * tk.a_token_stride + hv * tk.a_head_stride);
    const float b = load_gate_input(tk.b, tk.b_dtype, row * tk.b_row_stride + t * tk.b_token_stride + hv * tk.b_head_stride);

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
    // KDA: the token's decay of each of the thread's key channels.
    float alpha_c[kVectorGate ? C : 1][kVectorGate ? E : 1];
    if constexpr (kVectorGate) {
      channel_decays(alpha_c, p, row * tk.a_row_stride + t * tk.a_token_stride + hv * tk.a_head_stride, hv, A_log,
                     [](int i) { return Lanes::col(i); });
    }

#pragma unroll
    for (int r = 0; r < R; ++r) {
      float dk = 0.0f, dq = 0.0f;
#pragma unroll
      for (int i = 0; i < C; ++i) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          if constexpr (kVectorGate) s[r][i][e] *= alpha_c[i][e];
          dk += s[r][i][e] * kf[i][e];
          dq += s[r][i][e] * qf[i][e];
        }
      }
      dk = scaled_sum(row_sum<kLanes>(dk), rk);
      dq = scaled_sum(row_sum<kLanes>(dq), rq);
      // KDA: s, dk and dq are already decayed (alpha = 1 here). The update's arithmetic (gates.cuh).
      const float u = corrected_value<kVectorGate>(vv[r], dk, alpha, beta);
      const float uk = u * rk;  // u k_hat = (u rk) k
#pragma unroll
      for (int i = 0; i < C; ++i) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          s[r][i][e] = decayed_plus<kVectorGate>(alpha, s[r][i][e], uk, kf[i][e]);
        }
        store_chunk16<kState>(p.snapshots, snapshot_at(t, r) + Lanes::col(i), s[r][i]);
#pragma unroll
        for (int e = 0; e < E; ++e) s[r][i][e] = state_round_trip<kState>(s[r][i][e]);  // the next token starts from the snapshot
      }
      if (Lanes::lane() == 0) {
        store_act<kAct>(tk.out, out_at(t, r), decayed_plus<kVectorGate>(alpha, dq, u, kq_hat));
      }
    }
  }
}

template <int kK, int kV, DType kState, DType kAct, bool kVectorGate>
cudaError_t launch(const GdnParams& p, cudaStream_t stream) {
  using Shape = SnapshotShape<kK, kV, kState>;
  // The update's grid of 16 KB CTAs: no split kernel here (split_ctas_per_head 0), so no device is asked.
  const launch::GdnUpdateProblem problem{p.batch, p.v_heads, Shape::kCtasPerHead, /*split_ctas_per_head=*/0};
  const launch::GdnUpdatePlan plan = launch::plan_gdn_update(problem, /*sm_count=*/0, launch::launch_overrides());
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y));
  snapshots_kernel<kK, kV, kState, kAct, kVectorGate><<<grid, kSnapshotThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace
}  // namespace gdn

cudaError_t launch_gdn_update_snapshots(const GdnParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (p.batch < 0 || p.batch > 65535 || p.heads < 1 || p.v_heads < 1 || p.v_heads % p.heads != 0 ||
      p.tokens.num_tokens < 1 || p.tokens.num_tokens > kGdnMaxDraftTokens || p.snapshots == nullptr) {
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
