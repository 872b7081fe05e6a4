// Conventional speculative Mamba-2 step writing one state snapshot per token (snapshots.h).
//
// One CTA of 256 threads per (batch row, head). A state row (N elements) is covered by N / kVec lanes
// holding kVec elements each, kVec = 16 bytes of the state type (4 fp32, 8 bf16/fp16), so every
// state load and snapshot store is one 16-byte access. The whole (P, N) tile is loaded once, before
// anything else, and stays in fp32 registers for the T tokens; the per-token inputs of the CTA
// (x, z, B, C, dt) are staged once in shared memory while those loads are in flight; outputs are
// reduced into shared memory and written coalesced at the end.
//
// Its tile is its own: tile.cuh's TileShape uses 4-element vectors (8-byte accesses for
// 16-bit states); the small helpers (row sums, activation loads/stores, softplus/silu) are shared.
#include "families/mamba2/snapshots.h"

#include "common/convert.cuh"
#include "families/mamba2/tile.cuh"
#include "families/mamba2/variants.h"

namespace replayssm {
namespace mamba2_snapshots {
namespace {

constexpr int kThreads = 256;

// 16-byte state vectors of each storage type, converted to and from fp32.
template <DType T> struct Vec16;

template <> struct Vec16<DType::kFloat32> {
  static constexpr int kVec = 4;
  using Raw = float4;
  __device__ static Raw load(const void* base, int64_t offset) {
    return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(base) + offset));
  }
  __device__ static void to_float(const Raw& r, float (&v)[kVec]) { v[0] = r.x; v[1] = r.y; v[2] = r.z; v[3] = r.w; }
  __device__ static void store(void* base, int64_t offset, const float (&v)[kVec]) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + offset) = make_float4(v[0], v[1], v[2], v[3]);
  }
  __device__ static void store_zero(void* base, int64_t offset) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + offset) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __device__ static float round_trip(float v) { return v; }
};

template <DType T>
struct Vec16Half {  // bf16 and fp16: 8 elements in a uint4
  using S = typename Storage<T>::type;
  static constexpr int kVec = 8;
  using Raw = uint4;
  __device__ static Raw load(const void* base, int64_t offset) {
    return __ldg(reinterpret_cast<const uint4*>(static_cast<const S*>(base) + offset));
  }
  __device__ static void to_float(const Raw& r, float (&v)[kVec]) {
    const S* h = reinterpret_cast<const S*>(&r);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = to_float_(h[i]);
  }
  __device__ static void store(void* base, int64_t offset, const float (&v)[kVec]) {
    uint4 raw;
    S* h = reinterpret_cast<S*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) h[i] = from_float_(v[i]);
    *reinterpret_cast<uint4*>(static_cast<S*>(base) + offset) = raw;
  }
  __device__ static void store_zero(void* base, int64_t offset) {
    *reinterpret_cast<uint4*>(static_cast<S*>(base) + offset) = make_uint4(0u, 0u, 0u, 0u);
  }
  __device__ static float round_trip(float v) { return to_float_(from_float_(v)); }

 private:
  __device__ static float to_float_(S h) { return ::replayssm::to_float(h); }
  // The rounding of mamba2_update's state store: bf16 round-to-nearest-even, fp16 saturating.
  __device__ static S from_float_(float v) {
    if constexpr (T == DType::kBFloat16) {
      return from_float_bf16(v);
    } else {
      return from_float_fp16(v);
    }
  }
};
template <> struct Vec16<DType::kBFloat16> : Vec16Half<DType::kBFloat16> {};
template <> struct Vec16<DType::kFloat16> : Vec16Half<DType::kFloat16> {};

template <int kP, int kN, DType kState>
struct Tile {
  static constexpr int kVec = Vec16<kState>::kVec;
  static constexpr int kLanesPerRow = kN / kVec;
  static constexpr int kRowsPerPass = kThreads / kLanesPerRow;
  // bf16 with N = 64 covers 32 rows a pass, which does not divide P = 80: the last pass is partial.
  static constexpr int kRowsPerThread = (kP + kRowsPerPass - 1) / kRowsPerPass;
  static constexpr bool kPartialPass = kP % kRowsPerPass != 0;
  static_assert(kN % kVec == 0, "a state row must be whole 16-byte vectors");
  static_assert(kLanesPerRow <= 32 && 32 % kLanesPerRow == 0, "a state row must sit inside one warp");

  __device__ static int lane_in_row() { return threadIdx.x % kLanesPerRow; }
  __device__ static int row(int r) { return static_cast<int>(threadIdx.x) / kLanesPerRow + r * kRowsPerPass; }
  __device__ static bool has_row(int r) { return !kPartialPass || row(r) < kP; }
  __device__ static int col0() { return lane_in_row() * kVec; }
};


__device__ __forceinline__ float load_dt(const Mamba2SnapshotsParams& p, int64_t off, int head) {
  float dt;
  switch (p.dt_dtype) {
    case DType::kFloat32: dt = __ldg(static_cast<const float*>(p.dt) + off); break;
    case DType::kBFloat16: dt = load_act<DType::kBFloat16>(p.dt, off); break;
    default: dt = load_act<DType::kFloat16>(p.dt, off); break;
  }
  if (p.dt_bias != nullptr) dt += __ldg(p.dt_bias + head);
  return p.dt_softplus ? softplus(dt) : dt;
}

// Shared-memory staging of one CTA's per-token inputs (floats), T tokens:
//   dt[T] decay[T] | x[T][P] z[T][P] y[T][P] | B[T][N] C[T][N]
__host__ __device__ constexpr int smem_floats(int T, int P, int N) { return 2 * T + 3 * T * P + 2 * T * N; }

template <int kP, int kN, DType kState, DType kAct>
__global__ void __launch_bounds__(kThreads) snapshots_kernel(const Mamba2SnapshotsParams p) {
  using Shape = Tile<kP, kN, kState>;
  using V = Vec16<kState>;
  constexpr int R = Shape::kRowsPerThread;
  constexpr int kVec = Shape::kVec;
  const int head = blockIdx.x;
  const int row = blockIdx.y;
  const int T = p.tokens;
  const int64_t sn_base = row * p.sn_row_stride + head * p.sn_head_stride;

  const int64_t slot_raw = p.slots == nullptr ? row : load_index(p.slots, p.slots_dtype, row, p.slots_stride);
  if (slot_raw == p.pad_slot_id || slot_raw < 0 || slot_raw >= p.num_slots) {
    // Pad row: zero snapshots and output (the reference's semantics), nothing read.
    for (int t = 0; t < T; ++t) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (Shape::has_row(r)) V::store_zero(p.snapshots, sn_base + t * p.sn_token_stride + Shape::row(r) * p.sn_prow_stride + Shape::col0());
      }
    }
    for (int i = threadIdx.x; i < T * kP; i += kThreads) {
      const int t = i / kP, pr = i - t * kP;
      store_act<kAct>(p.out, row * p.out_row_stride + t * p.out_token_stride + head * p.out_head_stride + pr, 0.0f);
    }
    return;
  }

  // Every state load of the thread first: the CTA keeps P * N * s bytes in flight.
  const int64_t tile = slot_raw * p.st_slot_stride + head * p.st_head_stride;
  typename V::Raw raw[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (Shape::has_row(r)) raw[r] = V::load(p.state, tile + Shape::row(r) * p.st_row_stride + Shape::col0());
  }

  extern __shared__ float smem[];
  float* dts = smem;
  float* decays = dts + T;
  float* xs = decays + T;
  float* zs = xs + T * kP;
  float* ys = zs + T * kP;
  float* Bs = ys + T * kP;
  float* Cs = Bs + T * kN;
  const int group = head / (p.heads / p.groups);
  for (int i = threadIdx.x; i < T * kP; i += kThreads) {
    const int t = i / kP, pr = i - t * kP;
    xs[i] = load_act<kAct>(p.x, row * p.x_row_stride + t * p.x_token_stride + head * p.x_head_stride + pr);
    zs[i] = p.z != nullptr ? load_act<kAct>(p.z, row * p.z_row_stride + t * p.z_token_stride + head * p.z_head_stride + pr) : 0.0f;
  }
  for (int i = threadIdx.x; i < T * kN; i += kThreads) {
    const int t = i / kN, n = i - t * kN;
    Bs[i] = load_act<kAct>(p.B, row * p.B_row_stride + t * p.B_token_stride + group * p.B_group_stride + n);
    Cs[i] = load_act<kAct>(p.C, row * p.C_row_stride + t * p.C_token_stride + group * p.C_group_stride + n);
  }
  if (threadIdx.x < T) {
    const int t = threadIdx.x;
    const float dt = load_dt(p, row * p.dt_row_stride + t * p.dt_token_stride + head * p.dt_head_stride, head);
    dts[t] = dt;
    decays[t] = expf(dt * __ldg(p.A + head));
  }
  __syncthreads();

  float s[R][kVec];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (Shape::has_row(r)) {
      V::to_float(raw[r], s[r]);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) s[r][i] = 0.0f;
    }
  }

  for (int t = 0; t < T; ++t) {
    const float dt = dts[t];
    const float decay = decays[t];
    float b[kVec], c[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      b[i] = Bs[t * kN + Shape::col0() + i];
      c[i] = Cs[t * kN + Shape::col0() + i];
    }
    const int64_t sn_token = sn_base + t * p.sn_token_stride;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int pr = Shape::row(r);
      const bool has = Shape::has_row(r);
      const float dtx = has ? dt * xs[t * kP + pr] : 0.0f;
      float y = 0.0f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        s[r][i] = decay * s[r][i] + dtx * b[i];
        y += s[r][i] * c[i];  // from the fp32 state, before it is rounded to the storage type
      }
      if (has) V::store(p.snapshots, sn_token + pr * p.sn_prow_stride + Shape::col0(), s[r]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) s[r][i] = V::round_trip(s[r][i]);  // the next token starts from the snapshot
      y = row_sum<Shape::kLanesPerRow>(y);
      if (has && Shape::lane_in_row() == 0) ys[t * kP + pr] = y;
    }
  }
  __syncthreads();

  // y + D x, times silu(z): coalesced over the P outputs of each token.
  const float skip = p.D != nullptr ? __ldg(p.D + head) : 0.0f;
  for (int i = threadIdx.x; i < T * kP; i += kThreads) {
    const int t = i / kP, pr = i - t * kP;
    float y = ys[i] + skip * xs[i];
    if (p.z != nullptr) y *= silu(zs[i]);
    store_act<kAct>(p.out, row * p.out_row_stride + t * p.out_token_stride + head * p.out_head_stride + pr, y);
  }
}

template <int kP, int kN, DType kState, DType kAct>
cudaError_t launch(const Mamba2SnapshotsParams& p, cudaStream_t stream) {
  const dim3 grid(p.heads, p.batch);
  const size_t smem = sizeof(float) * smem_floats(p.tokens, kP, kN);
  snapshots_kernel<kP, kN, kState, kAct><<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

// The largest staging area (T = 16, P = N = 128) is 41 KB: under the 48 KB a launch gets without an
// opt-in attribute.
static_assert(sizeof(float) * smem_floats(kMamba2SnapshotsMaxTokens, 128, 128) <= 48 * 1024,
              "the per-token staging must fit the default dynamic shared memory");

}  // namespace
}  // namespace mamba2_snapshots

cudaError_t launch_mamba2_update_snapshots(const Mamba2SnapshotsParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (p.tokens < 1 || p.tokens > kMamba2SnapshotsMaxTokens || p.heads < 1 || p.groups < 1 ||
      p.heads % p.groups != 0 || p.heads > 65535 || p.batch > 65535 || p.batch < 0) {
    return cudaErrorInvalidValue;
  }
  // The variants table's shapes x state dtypes x activation dtypes (the update's).
  return REPLAYSSM_MAMBA2_SHAPE_SWITCH(p.head_dim, p.state_dim, [&](auto P, auto N) {
    return REPLAYSSM_MAMBA2_STATE_SWITCH(p.state_dtype, [&](auto state) {
      return REPLAYSSM_MAMBA2_ACTIVATION_SWITCH(p.act_dtype, [&](auto act) {
        return mamba2_snapshots::launch<decltype(P)::value, decltype(N)::value, decltype(state)::value,
                                        decltype(act)::value>(p, stream);
      });
    });
  });
}

}  // namespace replayssm
