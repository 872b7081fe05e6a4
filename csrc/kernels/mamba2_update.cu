// Conventional Mamba-2 decode (T=1): read the state, update it, write it, output. One CTA per
// (batch row, head); the state tile streams through registers once each way, so the kernel moves
// 2 * P * N * sizeof(state) bytes per (row, head) and should run at copy bandwidth.
#include "mamba2.cuh"
#include "mamba2_tile.cuh"
#include "stochastic_rounding.cuh"

namespace replayssm {
namespace mamba2 {
namespace {

// kRound: stochastic rounding of a 16-bit state (p.rounding_seed); false compiles to the kernel as it
// was before rounding existed.
template <int kP, int kN, DType kState, DType kAct, bool kRound>
__global__ void __launch_bounds__(kThreads) update_kernel(const Mamba2Params p) {
  using Shape = TileShape<kP, kN>;
  using V = Vec4<kState>;
  constexpr int R = Shape::kRowsPerThread;
  const int head = blockIdx.x;
  const int row = blockIdx.y;
  const int64_t slot = resolve_slot(p, row);
  if (slot < 0) {
    write_zero_output<kAct>(p, row, head);
    return;
  }

  const int64_t tile = slot * p.ck_slot_stride + head * p.ck_head_stride;
  typename V::Raw raw[R];
#pragma unroll
  for (int r = 0; r < R; ++r) raw[r] = V::load(p.checkpoint, tile + Shape::row(r) * p.ck_row_stride + Shape::col0());

  float x[R];
  const int64_t x_base = row * p.x_row_stride + head * p.x_head_stride;
#pragma unroll
  for (int r = 0; r < R; ++r) x[r] = load_act<kAct>(p.x, x_base + Shape::row(r));
  RowEpilogue<R> epilogue;
  epilogue.template load<kAct, Shape>(p, row, head);

  const int group = head / (p.heads / p.groups);
  const float dt = load_dt(p, row, head);
  const float decay = expf(dt * __ldg(p.A + head));
  float b[4], c[4];
  load_act4<kAct>(p.B, row * p.B_row_stride + group * p.B_group_stride + Shape::col0(), b);
  load_act4<kAct>(p.C, row * p.C_row_stride + group * p.C_group_stride + Shape::col0(), c);
  static_assert(!kRound || kState != DType::kFloat32, "stochastic rounding is for 16-bit states");
  RoundingKey key{};
  RoundingWords words;
  if constexpr (kRound) key = RoundingKey::load(p.rounding_seed);

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int pr = Shape::row(r);
    const float dtx = dt * x[r];
    float s[4];
    V::to_float(raw[r], s);
    float y = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[i] = decay * s[i] + dtx * b[i];
      y += s[i] * c[i];  // from the fp32 state, before it is rounded to the storage type
    }
    if constexpr (kRound) {
      uint32_t w[2];
      words.get<R>(key, slot, head, r, [](int k) { return Shape::row(k); }, Shape::col0(), w);
      stochastic_round4<kState>(s, w);
    }
    V::store(p.checkpoint, tile + pr * p.ck_row_stride + Shape::col0(), s);
    y = row_sum<Shape::kLanesPerRow>(y);
    if (Shape::lane_in_row() == 0) epilogue.template store<kAct>(p, row, head, r, pr, y, x[r]);
  }
}

template <int kP, int kN, DType kState, DType kAct>
cudaError_t launch(const Mamba2Params& p, cudaStream_t stream) {
  const dim3 grid(p.heads, p.batch);
  if constexpr (kState != DType::kFloat32) {
    if (p.rounding_seed != nullptr) {
      update_kernel<kP, kN, kState, kAct, true><<<grid, kThreads, 0, stream>>>(p);
      return cudaGetLastError();
    }
  }
  update_kernel<kP, kN, kState, kAct, false><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <int kP, int kN>
cudaError_t dispatch_dtypes(const Mamba2Params& p, cudaStream_t stream) {
#define REPLAYSSM_UPDATE_CASE(STATE, ACT) \
  if (p.checkpoint_dtype == DType::STATE && p.act_dtype == DType::ACT) return launch<kP, kN, DType::STATE, DType::ACT>(p, stream);
  REPLAYSSM_UPDATE_CASE(kFloat32, kBFloat16)
  REPLAYSSM_UPDATE_CASE(kFloat32, kFloat16)
  REPLAYSSM_UPDATE_CASE(kBFloat16, kBFloat16)
  REPLAYSSM_UPDATE_CASE(kBFloat16, kFloat16)
  REPLAYSSM_UPDATE_CASE(kFloat16, kBFloat16)
  REPLAYSSM_UPDATE_CASE(kFloat16, kFloat16)
#undef REPLAYSSM_UPDATE_CASE
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace mamba2

namespace mamba2 {
namespace {

cudaError_t dispatch_shape(const Mamba2Params& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (p.heads < 1 || p.groups < 1 || p.heads % p.groups != 0 || p.heads > 65535 || p.batch > 65535) {
    return cudaErrorInvalidValue;
  }
  const int P = p.head_dim, N = p.state_dim;
  if (P == 64 && N == 64) return dispatch_dtypes<64, 64>(p, stream);
  if (P == 64 && N == 128) return dispatch_dtypes<64, 128>(p, stream);
  if (P == 80 && N == 64) return dispatch_dtypes<80, 64>(p, stream);
  if (P == 80 && N == 128) return dispatch_dtypes<80, 128>(p, stream);
  if (P == 128 && N == 64) return dispatch_dtypes<128, 64>(p, stream);
  if (P == 128 && N == 128) return dispatch_dtypes<128, 128>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace mamba2

cudaError_t launch_mamba2_update(const Mamba2Params& p, cudaStream_t stream) {
  if (p.rounding_seed != nullptr && p.checkpoint_dtype == DType::kFloat32) return cudaErrorInvalidValue;
  const cudaError_t err = mamba2::dispatch_shape(p, stream);
  // Every launch with a seed moves the offset, even one with no rows: the reference does the same.
  if (err != cudaSuccess || p.rounding_seed == nullptr) return err;
  return launch_rounding_offset_advance(p.rounding_seed, stream);
}

}  // namespace replayssm
