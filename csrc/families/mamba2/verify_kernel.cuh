// Mamba-2 verify: outputs of T draft tokens per row from the read state and the buffer, their entries
// appended at positions w .. w+T-1 (w = num_committed[slot]). One CTA of 256 threads per (batch row,
// group, block of the group's heads); it takes its heads one after the other, the step kernel's
// design (step_kernel.cuh) with T drafts instead of one token.
//
// With the window of E = w + T entries (committed history, then the drafts), Lambda_j = A sum_{i<=j} dt_i
// and t = w + i the position of draft i:
//   y_i = e^{Lambda_t} s_p (S_read C_i)_p + sum_{j<=t} coef[j][i] x_j + D x_t  (times silu(z_i)),
//   coef[j][i] = dt_j e^{Lambda_t - Lambda_j} (B_j . C_i).
// Verify reads the state (read copy or checkpoint) once and writes none of it, so like the replay step
// it is decided by latency and instruction count. Hence, as in the step:
//   - a ring of source tiles filled by bulk copies (TMA) on one mbarrier per stage, the first ones issued
//     before the cursor is known, a stage refilled right after the per-head barrier that ends its use;
//   - what depends only on the group is done once per CTA: the B window and the drafts' C rows staged
//     in shared memory, B_j . C_i for every (draft, entry) pair, the C values a thread multiplies kept
//     in registers;
//   - the x windows staged two heads ahead (cp.async, three buffers).
// Roles: the last warp (the scalar warp) derives head h + 1's coefficients and decays and stages its D
// and fp8 row scales while the others work on head h (double-buffered, handed over on an mbarrier per
// buffer), appends the drafts' x and dt, and refills the ring. The other 7 warps (reduce warps) take
// the tile's rows in units of 32 / (N / 8) rows, two units at a time: each thread reduces its 8
// elements of a row against 4 drafts at a time (32 FMA), the row's lanes reduce-scatter the 4 sums so
// that each draft's sum ends on N / 32 lanes, and those lanes add their shares of the window term
// (sum_j coef[j][i] x_j) before the last shuffles: each lane then holds one (row, draft) output and
// the first of its draft's lanes gates and stores it (z loaded a head ahead, its silu parked in shared
// memory at the end of the head before). One barrier per head. With an fp32 source (the checkpoint,
// no read copy) or a bf16 / fp16 copy of the activations' type, the reduce warps instead take 16 rows
// each on tensor cores (mma.sync, below), and the scalar warp's per-head work is then what sets the
// head period (see draft_weights).
// (With all 8 warps reducing and 4 of them forming the outputs after the per-head barrier, those 4
// carried the epilogue on top of their rows while the rest waited at the barrier: 35% of the warp
// samples. docs/EXPERIMENTS.md has what was tried and lost.)
// Verify never writes the checkpoint, the read copy or the cursor: a row whose cursor leaves no room
// for T tokens (or a pad row) gets zero output and touches no buffer. It appends the drafts' x and dt
// (every CTA, its heads) and B (the group's first CTA), and the row's first CTA records in
// num_verified[slot] how many entries it appended (T, or 0 without room; nothing for a pad row).
// docs/TUNING.md has its launch rule and what it measured.
#pragma once

#include "cache/error_word.cuh"
#include "families/mamba2/tensor_dot.cuh"
#include "families/mamba2/spec_common.cuh"

namespace replayssm {
namespace mamba2_spec {

// Drafts reduced together against a state row: their C values sit in registers (4 x 8 floats).
constexpr int kDraftBatch = 4;
// Warps that reduce state rows: all but the last (the scalar warp).
constexpr int kReduceWarps = kThreads / 32 - 1;

// The 8 elements of a state row a verify thread multiplies (kN / 8 lanes per row, so a row's sums need
// few shuffles and the C values of 4 drafts fit in 32 registers). fp32: two 16-byte vectors half a row
// apart (each load instruction of a warp then reads whole rows, no bank conflicts); 16-bit: one 16-byte
// vector; fp8: one 8-byte vector.
template <int kN, DType T>
struct VerifyChunk {
  static constexpr int kElems = 8;
  static constexpr int kLanes = kN / kElems;
  static_assert(kLanes >= 4 && kLanes <= 32 && 32 % kLanes == 0, "a state row must sit inside one warp");

  // Column of element e of lane `lane`.
  __device__ static int col(int lane, int e) {
    if constexpr (T == DType::kFloat32) {
      return (e < 4 ? 0 : kN / 2) + lane * 4 + (e & 3);
    } else {
      return lane * 8 + e;
    }
  }
  // Elements of the row at `row` (shared memory, the row's first byte) as floats.
  __device__ static void load(const unsigned char* row, int lane, float (&v)[kElems]) {
    if constexpr (T == DType::kFloat32) {
      const uint4 lo = *reinterpret_cast<const uint4*>(row + lane * 16);
      const uint4 hi = *reinterpret_cast<const uint4*>(row + kN * 2 + lane * 16);
      const uint32_t word[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = __uint_as_float(word[e]);
    } else if constexpr (T == DType::kFloat8E4M3) {
      const uint2 raw = *reinterpret_cast<const uint2*>(row + lane * 8);
      const uint32_t word[2] = {raw.x, raw.y};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>((word[i / 2] >> (16 * (i % 2))) & 0xffffu), __NV_E4M3);
        const float2 f = __half22float2(__half2(h));
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
      }
    } else {
      Chunk16<T>::to_float(*reinterpret_cast<const uint4*>(row + lane * 16), v);
    }
  }
};

// The 4 partial dot products (one per draft of a batch) of each lane, reduce-scattered over the kLanes
// lanes of a row: after the exchanges at offsets kLanes / 2 and kLanes / 4 (half the values cross at
// each), lane l holds a partial sum of draft draft_of(l). The kLanes / 4 lanes of one draft differ only
// in their low bits; finish_draft_sum adds their partials (log2(kLanes / 4) shuffles), so that each
// may first add its share of the window term (2 + 1 + log2(kLanes / 4) shuffles instead of 4 log2(kLanes)).
template <int kLanes>
__device__ __forceinline__ float scatter_drafts4(const float (&d)[4], int lane) {
  constexpr int kHalf = kLanes / 2, kQuarter = kLanes / 4;
  const bool hi = (lane & kHalf) != 0;
  float keep0 = hi ? d[2] : d[0], keep1 = hi ? d[3] : d[1];
  keep0 += __shfl_xor_sync(kFullMask, hi ? d[0] : d[2], kHalf);
  keep1 += __shfl_xor_sync(kFullMask, hi ? d[1] : d[3], kHalf);
  const bool odd = (lane & kQuarter) != 0;
  float v = odd ? keep1 : keep0;
  v += __shfl_xor_sync(kFullMask, odd ? keep0 : keep1, kQuarter);
  return v;
}
template <int kLanes>
__device__ __forceinline__ float finish_draft_sum(float v) {
#pragma unroll
  for (int offset = kLanes / 8; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
template <int kLanes>
__device__ __forceinline__ int draft_of(int lane) {
  return 2 * ((lane / (kLanes / 2)) & 1) + ((lane / (kLanes / 4)) & 1);
}

// ---- Shared memory of a verify CTA -------------------------------------------------------------
// The mbarriers, the ring of source tiles (its stage count chosen at launch), then what grows with L
// and T: B_j . C_i, and per head (double-buffered by head parity: the scalar warp writes head h + 1's
// while the others read head h's) the coefficients, decays, D and the fp8 row scales; then three x
// windows, the B window and the drafts' C rows.
template <int kP, int kN, DType kSrc, DType kAct>
struct VerifyLayout {
  using Act = typename Storage<kAct>::type;
  static constexpr int kTileBytes = kP * kN * dtype_size(kSrc);
  static constexpr int kWindows = 3;
  static constexpr bool kScaled = kSrc == DType::kFloat8E4M3;
  // A reduce warp's units (kUnitRows rows each, see verify_kernel) and the most any warp takes.
  static constexpr int kUnitRows = 32 / VerifyChunk<kN, kSrc>::kLanes;
  static constexpr int kUnits = kP / kUnitRows;
  static constexpr int kMaxUnits = (kUnits + kReduceWarps - 1) / kReduceWarps;
  static constexpr size_t kRingOffset = 128;  // uint64_t barriers: coef_ready[2], full[kStages]
  static_assert(kTileBytes % 128 == 0, "tiles keep the ring 128-byte aligned");

  __host__ __device__ static constexpr int padded(int T) { return (T + kDraftBatch - 1) / kDraftBatch * kDraftBatch; }
  // Coefficient rows: the window's entries rounded up to 4, so that the lanes of a draft (2 or 4) take
  // the same number of entries (the padding entries' coefficients are 0).
  __host__ __device__ static constexpr int coef_rows(int L) { return (L + 3) / 4 * 4; }
  __host__ __device__ static constexpr size_t align16(size_t b) { return (b + 15) / 16 * 16; }
  __host__ __device__ static constexpr size_t dots(int stages) { return kRingOffset + static_cast<size_t>(stages) * kTileBytes; }
  __host__ __device__ static constexpr size_t coef(int stages, int L, int T) { return dots(stages) + align16(4 * static_cast<size_t>(T) * L); }
  __host__ __device__ static constexpr size_t decay(int stages, int L, int T) { return coef(stages, L, T) + 2 * 4 * static_cast<size_t>(coef_rows(L)) * padded(T); }
  __host__ __device__ static constexpr size_t skip(int stages, int L, int T) { return decay(stages, L, T) + 2 * 4 * static_cast<size_t>(padded(T)); }
  __host__ __device__ static constexpr size_t scale(int stages, int L, int T) { return skip(stages, L, T) + 16; }
  __host__ __device__ static constexpr size_t gates(int stages, int L, int T) { return scale(stages, L, T) + (kScaled ? 2 * 4 * kP : 0); }
  __host__ __device__ static constexpr size_t window(int stages, int L, int T) {
    return gates(stages, L, T) + 4 * static_cast<size_t>(kMaxUnits) * kThreads;
  }
  __host__ __device__ static constexpr size_t window_bytes(int L) { return sizeof(Act) * static_cast<size_t>(L) * kP; }
  __host__ __device__ static constexpr size_t B_window(int stages, int L, int T) { return window(stages, L, T) + kWindows * window_bytes(L); }
  __host__ __device__ static constexpr size_t C_rows(int stages, int L, int T) { return B_window(stages, L, T) + sizeof(Act) * static_cast<size_t>(L) * kN; }
  __host__ __device__ static constexpr size_t bytes(int stages, int L, int T) { return C_rows(stages, L, T) + sizeof(Act) * static_cast<size_t>(T) * kN; }
  // As many stages as two CTAs per SM leave room for at L = 16, T = 4 (228 KB per SM, 1 KB reserved per
  // CTA), from 2 to 8. The ring is what keeps source bytes in flight while a CTA works on a head: at
  // P = 64 with an fp32 source that is 3 tiles of 32 KB (an "about 64 KB" rule would stop at 2 and leave
  // 35 KB of each SM unused).
  static constexpr size_t kFixedBytes = bytes(0, 16, 4);
  static constexpr int kRoomStages = static_cast<int>((228 * 1024 / 2 - 1024 - kFixedBytes) / kTileBytes);
  static constexpr int kStages = kRoomStages < 2 ? 2 : (kRoomStages > 8 ? 8 : kRoomStages);
  static_assert((2 + kStages) * sizeof(uint64_t) <= kRingOffset, "barriers fit before the ring");
  // CTAs per SM the shared memory allows at L = 16, T = 4 (228 KB per SM, 1 KB reserved per CTA), at
  // most 2: the register budget is sized to match, so that registers never limit occupancy below it.
  static constexpr int kSmemCtas = static_cast<int>(228 * 1024 / (bytes(kStages, 16, 4) + 1024));
  static constexpr int kCtasPerSm = kSmemCtas > 2 ? 2 : (kSmemCtas < 1 ? 1 : kSmemCtas);
};

template <int kP, int kN, DType kSrc, DType kAct>
struct VerifySmem {
  using Layout = VerifyLayout<kP, kN, kSrc, kAct>;
  using Act = typename Storage<kAct>::type;
  unsigned char* base;
  int stages, L, T, Tp;
  __device__ VerifySmem(unsigned char* b, int s, int buffer_len, int tokens)
      : base(b), stages(s), L(buffer_len), T(tokens), Tp(Layout::padded(tokens)) {}
  // Head parity b's coefficients, decays, D and scales are written (32 arrivals: the scalar warp).
  __device__ uint64_t* coef_ready(int b) const { return reinterpret_cast<uint64_t*>(base) + b; }
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base) + 2 + s; }
  __device__ unsigned char* tile(int s) const { return base + Layout::kRingOffset + static_cast<size_t>(s) * Layout::kTileBytes; }
  __device__ float* dots() const { return reinterpret_cast<float*>(base + Layout::dots(stages)); }  // [T][L]
  __device__ float* coef(int b) const {  // [coef_rows(L)][Tp]
    return reinterpret_cast<float*>(base + Layout::coef(stages, L, T)) + static_cast<size_t>(b) * Layout::coef_rows(L) * Tp;
  }
  __device__ float* decay(int b) const { return reinterpret_cast<float*>(base + Layout::decay(stages, L, T)) + b * Tp; }
  __device__ float* skip(int b) const { return reinterpret_cast<float*>(base + Layout::skip(stages, L, T)) + b; }
  __device__ float* scale(int b) const { return reinterpret_cast<float*>(base + Layout::scale(stages, L, T)) + b * kP; }  // [P], fp8
  __device__ float* gates() const { return reinterpret_cast<float*>(base + Layout::gates(stages, L, T)); }  // [kMaxUnits][kThreads]
  __device__ Act* x_window(int k) const {  // [L][P]
    return reinterpret_cast<Act*>(base + Layout::window(stages, L, T) + k * Layout::window_bytes(L));
  }
  __device__ Act* B_window() const { return reinterpret_cast<Act*>(base + Layout::B_window(stages, L, T)); }  // [L][N]
  __device__ Act* C_rows() const { return reinterpret_cast<Act*>(base + Layout::C_rows(stages, L, T)); }      // [T][N]
};

// Two consecutive 16-bit activations at a 4-byte aligned address as floats (one 32-bit load).
template <class Act>
__device__ __forceinline__ void act2_to_float(const Act* p, float (&v)[2]) {
  static_assert(sizeof(Act) == 2, "16-bit activations expected");
  const uint32_t raw = *reinterpret_cast<const uint32_t*>(p);
  const Act* h = reinterpret_cast<const Act*>(&raw);
  v[0] = to_float(h[0]);
  v[1] = to_float(h[1]);
}

template <DType kAct>
__device__ __forceinline__ void write_zero_outputs(const Mamba2SpecParams& p, int64_t row, int head) {
  const int total = p.num_tokens * p.head_dim;
  for (int k = threadIdx.x; k < total; k += blockDim.x) {
    const int i = k / p.head_dim;
    const int pr = k - i * p.head_dim;
    store_act<kAct>(p.out, row * p.out_row_stride + i * p.out_token_stride + head * p.out_head_stride + pr, 0.0f);
  }
}

// Copy window rows first .. last-1 of one kind (x or B) to shared memory with cp.async (no commit):
// entries < w from the buffer, the drafts from the inputs. Threads 0 .. kCopiers - 1 copy, from the
// last of them down: the first warps have the most other work (the CUDA-core epilogue, the tensor-core
// m-tiles). The per-head x windows leave the scalar warp out (kCopiers = 224): its work is the
// tensor-core verify's critical path.
template <int kElems, int kCopiers = kThreads, class Act>
__device__ __forceinline__ void stage_rows(Act* dst, const Act* buffer, int64_t entry_stride, const Act* drafts,
                                           int64_t token_stride, int w, int count) {
  constexpr int kPerChunk = 16 / sizeof(Act);
  constexpr int kChunks = kElems / kPerChunk;
  static_assert(kElems % kPerChunk == 0, "rows must be whole 16-byte chunks");
  const int total = count * kChunks;
  if (static_cast<int>(threadIdx.x) >= kCopiers) return;
  for (int k = kCopiers - 1 - static_cast<int>(threadIdx.x); k < total; k += kCopiers) {
    const int j = k / kChunks;
    const int c = (k - j * kChunks) * kPerChunk;
    const Act* src = j < w ? buffer + j * entry_stride : drafts + (j - w) * token_stride;
    cp_async16(dst + j * kElems + c, src + c);
  }
}

// What the scalar warp (the last) needs of a head, loaded one head ahead and kept raw (no instruction
// consumes a load before the next head: a conversion or softplus right after it would stall the warp
// on the load's latency every head): the bits of dt_j for its lanes' entries j = lane, lane + 32
// (fp32 from the buffer below w, the drafts' dt in dt's dtype from w to E - 1), A and dt_bias.
struct WindowDt {
  uint32_t bits[kMamba2SpecMaxBufferLen / 32];
  float A;
  float bias;
};

__device__ __forceinline__ WindowDt load_window_dt(const Mamba2SpecParams& p, int64_t row, int64_t slot, int head,
                                                   int w, int E) {
  const int lane = threadIdx.x & 31;
  const uint32_t* dt_buf = reinterpret_cast<const uint32_t*>(p.dt_buf + slot * p.dtb_slot_stride + head * p.dtb_head_stride);
  WindowDt d;
#pragma unroll
  for (int h = 0; h < kMamba2SpecMaxBufferLen / 32; ++h) {
    const int j = lane + 32 * h;
    uint32_t bits = 0;
    if (j < w) {
      bits = dt_buf[j];
    } else if (j < E) {
      const int64_t off = row * p.dt_row_stride + (j - w) * p.dt_token_stride + head * p.dt_head_stride;
      bits = p.dt_dtype == DType::kFloat32 ? __ldg(static_cast<const uint32_t*>(p.dt) + off)
                                           : static_cast<uint32_t>(__ldg(static_cast<const unsigned short*>(p.dt) + off));
    }
    d.bits[h] = bits;
  }
  d.A = __ldg(p.A + head);
  d.bias = p.dt_bias != nullptr ? __ldg(p.dt_bias + head) : 0.0f;
  return d;
}

// dt_j of the window: the buffer's as stored, a draft's after bias and softplus.
__device__ __forceinline__ float window_dt(const Mamba2SpecParams& p, const WindowDt& d, int h, int j, int w, int E) {
  if (j < w) return __uint_as_float(d.bits[h]);
  if (j >= E) return 0.0f;
  float dt;
  switch (p.dt_dtype) {
    case DType::kFloat32: dt = __uint_as_float(d.bits[h]); break;
    case DType::kBFloat16: dt = __uint_as_float(d.bits[h] << 16); break;
    default: dt = __half2float(__ushort_as_half(static_cast<unsigned short>(d.bits[h]))); break;
  }
  dt += d.bias;
  return p.dt_softplus ? softplus(dt) : dt;
}

// The scalar warp: coef[j][i] = dt_j exp(Lambda_{w+i} - Lambda_j) (B_j . C_i) for j <= w + i (0 above,
// up to entry E_pad - 1, and in the padding drafts), and decay[i] = exp(Lambda_{w+i}), into shared memory.
// dt[h] holds the window's dt_j of the lane's entries j = lane + 32 h.
// The pairs (j, i) are spread over the lanes: lane l takes entries j = l % 16 + 16 a and drafts
// i = l / 16 + 2 b, so at L = 16, T = 4 each lane forms 2 coefficients, independent of each other, and
// every lane < Tp one decay. Why: this warp's work per head is the critical path of the tensor-core
// verify (the reduce warps with an m-tile are busy about half of each head, the scalar warp all of it,
// rarely at the barrier). An entry per lane with a loop over drafts runs the drafts one after another:
// half the lanes idle at E <= 16, four exps in a chain; spread, verify takes ~16% less time.
__device__ __forceinline__ void draft_weights(const float (&dt)[kMamba2SpecMaxBufferLen / 32], float A, int w, int T,
                                              int E, int E_pad, int L, int Tp, const float* dots, float* coef, float* decay) {
  constexpr int kEntriesPerLane = kMamba2SpecMaxBufferLen / 32;
  static_assert(kEntriesPerLane == 2, "entries j = lane, lane + 32");
  const int lane = threadIdx.x & 31;
  float prefix[kEntriesPerLane] = {};
  float carry = 0.0f;
#pragma unroll
  for (int h = 0; h < kEntriesPerLane; ++h) {
    if (h * 32 >= E) break;  // warp-uniform: no entry of this half is in the window
    const float v = warp_inclusive_sum(dt[h]);
    prefix[h] = v + carry;
    carry += __shfl_sync(kFullMask, v, 31);
  }
  // Lambda_{w+i} of draft i = lane (Tp <= 16 lanes), and its decay.
  const int t_lane = w + lane;
  const float at0 = __shfl_sync(kFullMask, prefix[0], t_lane & 31);
  const float at1 = __shfl_sync(kFullMask, prefix[1], t_lane & 31);
  const float lambda = A * (t_lane < 32 ? at0 : at1);
  if (lane < Tp) decay[lane] = lane < T ? expf(lambda) : 0.0f;

  const int jl = lane & 15, q = lane >> 4;
  // Not unrolled: unrolled, the fp8 P = 128, N = 128 kernels spilled 56 bytes at 128 registers.
#pragma unroll 1
  for (int a = 0; 16 * a < E_pad; ++a) {  // warp-uniform
    const int j = jl + 16 * a;
    const float pj = __shfl_sync(kFullMask, a < 2 ? prefix[0] : prefix[1], j & 31);
    const float dtj = __shfl_sync(kFullMask, a < 2 ? dt[0] : dt[1], j & 31);
    // Tp is a multiple of 4: drafts i0 + q and i0 + q + 2 of each four.
#pragma unroll 1
    for (int i0 = 0; i0 < Tp; i0 += 4) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int i = i0 + q + 2 * k;
        const float total = __shfl_sync(kFullMask, lambda, i);  // Lambda_t, t = w + i
        // dots is [T][L]: clamped so that a pair whose coefficient is 0 reads inside it.
        const float dot = dots[min(i, T - 1) * L + min(j, L - 1)];
        const float v = dtj * expf(total - A * pj) * dot;
        if (j < E_pad) coef[j * Tp + i] = i < T && j <= w + i ? v : 0.0f;
      }
    }
  }
}

// B_j . C_i for every draft i and window entry j, once per CTA: a group of N/8 lanes per pair (one
// 16-byte vector of B_j and of C_i each), the groups splitting the pairs.
template <int kN, class Act>
__device__ __forceinline__ void window_dots(const Act* B_window, const Act* C_rows, int T, int E, int L, float* dots) {
  constexpr int kLanes = kN / 8;
  constexpr int kGroups = kThreads / kLanes;
  const int lane = threadIdx.x % kLanes;
  const int first = threadIdx.x / kLanes;
  const int pairs = T * E;
  for (int k0 = 0; k0 < pairs; k0 += kGroups) {  // CTA-uniform trip count: the sums shuffle
    const int k = k0 + first;
    float d = 0.0f;
    int i = 0, j = 0;
    if (k < pairs) {
      i = k / E;
      j = k - i * E;
      float b[8], c[8];
      act8_to_float(B_window + j * kN + lane * 8, b);
      act8_to_float(C_rows + i * kN + lane * 8, c);
#pragma unroll
      for (int e = 0; e < 8; ++e) d += b[e] * c[e];
    }
    d = row_sum<kLanes>(d);
    if (lane == 0 && k < pairs) dots[i * L + j] = d;
  }
}

template <int kP, int kN, DType kSrc, DType kAct>
__global__ void __launch_bounds__(kThreads, (VerifyLayout<kP, kN, kSrc, kAct>::kCtasPerSm)) verify_kernel(const Mamba2SpecParams p, const Mamba2VerifyLaunch launch) {
  using Act = typename Storage<kAct>::type;
  using Layout = VerifyLayout<kP, kN, kSrc, kAct>;
  using Chunk = VerifyChunk<kN, kSrc>;
  constexpr int kLanes = Chunk::kLanes;
  constexpr int kDraftLanes = kLanes / 4;  // lanes that share a draft's sum after the scatter
  constexpr int kUnitRows = Layout::kUnitRows;  // state rows a warp reduces at once: a unit
  static_assert(kP % kUnitRows == 0, "whole units");
  constexpr int kUnits = Layout::kUnits;
  constexpr int kMaxUnits = Layout::kMaxUnits;
  constexpr int kSrcBytes = dtype_size(kSrc);
  constexpr bool kScaled = Layout::kScaled;
  extern __shared__ __align__(128) unsigned char smem_base[];

  const int L = p.buffer_len;
  const int T = p.num_tokens;
  const int S = launch.ring_stages;
  const VerifySmem<kP, kN, kSrc, kAct> sm(smem_base, S, L, T);
  const int Tp = sm.Tp;
  const int64_t row = blockIdx.y;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const bool scalar_warp = warp == kReduceWarps;
  const int heads_per_group = p.heads / p.groups;
  const int num_heads = launch.heads_per_cta;  // this CTA's heads: head0 .. head0 + num_heads - 1, one group
  const int ctas_per_group = heads_per_group / num_heads;
  const int group = blockIdx.x / ctas_per_group;
  const int head0 = group * heads_per_group + (blockIdx.x % ctas_per_group) * num_heads;
  const int64_t slot = resolve_slot(p, row);
  if (slot < 0 && blockIdx.x == 0 && tid == 0 && slot_out_of_range(p, named_slot(p, row))) {
    record_error(p.error_word, kErrorVerifySlot, row, named_slot(p, row), p.num_slots);
  }
  if (slot < 0) {
    for (int i = 0; i < num_heads; ++i) write_zero_outputs<kAct>(p, row, head0 + i);
    return;
  }

  // ---- issued before the cursor is known: the first source tiles, by bulk copy ----
  const bool copy = p.read_copy != nullptr;
  const unsigned char* src = static_cast<const unsigned char*>(copy ? p.read_copy : p.checkpoint);
  const int64_t src_slot = copy ? slot * p.rc_slot_stride : slot * p.ck_slot_stride;
  const int64_t src_head_stride = copy ? p.rc_head_stride : p.ck_head_stride;
  const int64_t src_row_stride = copy ? p.rc_row_stride : p.ck_row_stride;
  auto issue_tile = [&](int stage, int head) {
    bulk_copy_tile_to_shared<kP, kN * kSrcBytes>(sm.tile(stage), src + (src_slot + head * src_head_stride) * kSrcBytes,
                                                 src_row_stride * kSrcBytes, sm.full(stage));
  };
  const int first_stages = num_heads < S ? num_heads : S;
  if (tid == 0) {
    mbarrier_init(sm.coef_ready(0), 32);
    mbarrier_init(sm.coef_ready(1), 32);
    for (int s = 0; s < S; ++s) mbarrier_init(sm.full(s), 1);
    fence_barrier_init();
    for (int s = 0; s < first_stages; ++s) issue_tile(s, head0 + s);
  }
  const int w = p.num_committed[slot];
  // What this verify appends to the slot, the most its commit may accept (cache/fold_rows.cuh).
  if (blockIdx.x == 0 && tid == 0) p.num_verified[slot] = (w < 0 || w > L - T) ? 0 : T;
  __syncthreads();  // the barriers are initialised; every thread has read the cursor

  if (w < 0 || w > L - T) {  // no room for T entries: touch nothing (but let the copies land first)
    if (tid == 0) {
      for (int s = 0; s < first_stages; ++s) mbarrier_wait(sm.full(s), 0);
    }
    for (int i = 0; i < num_heads; ++i) write_zero_outputs<kAct>(p, row, head0 + i);
    return;
  }
  const int E = w + T;
  const Act* x_buf = static_cast<const Act*>(p.x_buf) + slot * p.xb_slot_stride;
  const Act* B_buf = static_cast<const Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride;
  const Act* B_in = static_cast<const Act*>(p.B) + row * p.B_row_stride + group * p.B_group_stride;
  const Act* C_in = static_cast<const Act*>(p.C) + row * p.C_row_stride + group * p.C_group_stride;
  auto stage_x_window = [&](int k, int head) {
    stage_rows<kP, kReduceWarps * 32>(sm.x_window(k), x_buf + head * p.xb_head_stride, p.xb_entry_stride,
                   static_cast<const Act*>(p.x) + row * p.x_row_stride + head * p.x_head_stride, p.x_token_stride, w, E);
  };

  // ---- once per CTA: the B window, the drafts' C rows, B_j . C_i; two x windows ahead ----
  stage_rows<kN>(sm.B_window(), B_buf, p.Bb_entry_stride, B_in, p.B_token_stride, w, E);
  stage_rows<kN>(sm.C_rows(), C_in, 0, C_in, p.C_token_stride, 0, T);
  stage_x_window(0, head0);
  cp_async_commit();
  if (num_heads > 1) stage_x_window(1, head0 + 1);
  cp_async_commit();
  WindowDt next_dt{};
  if (scalar_warp) next_dt = load_window_dt(p, row, slot, head0, w, E);
  cp_async_wait<1>();  // the B window, the C rows and the first x window
  __syncthreads();
  window_dots<kN>(sm.B_window(), sm.C_rows(), T, E, L, sm.dots());
  const int row_lane = lane % kLanes;
  auto load_c = [&](int i0, float (&c)[kDraftBatch][Chunk::kElems]) {
#pragma unroll
    for (int k = 0; k < kDraftBatch; ++k) {
#pragma unroll
      for (int e = 0; e < Chunk::kElems; ++e) {
        c[k][e] = i0 + k < T ? to_float(sm.C_rows()[(i0 + k) * kN + Chunk::col(row_lane, e)]) : 0.0f;
      }
    }
  };
  __syncthreads();  // B_j . C_i is in shared memory

  // The scalar warp's part of head h (buffers h & 1): the coefficients and decays (from the window's
  // dt, loaded a head earlier), D and the fp8 row scales into shared memory, the drafts' dt appended to
  // the buffer; then each lane arrives on coef_ready(h & 1) after its stores. The scales and D are
  // requested first and stored last: their latency hides behind the exps.
  const int E_pad = (E + kDraftLanes - 1) / kDraftLanes * kDraftLanes;
  auto prepare_head = [&](int h, const WindowDt& d) {
    const int head = head0 + h;
    const int b = h & 1;
    constexpr int kScalesPerLane = (kP + 31) / 32;
    float sv[kScalesPerLane];
    if constexpr (kScaled) {
#pragma unroll
      for (int k = 0; k < kScalesPerLane; ++k) {
        const int pr = lane + 32 * k;
        if (pr < kP) sv[k] = __ldg(p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride + pr);
      }
    }
    const float skip = p.D != nullptr ? __ldg(p.D + head) : 0.0f;

    float dt[kMamba2SpecMaxBufferLen / 32];
#pragma unroll
    for (int k = 0; k < kMamba2SpecMaxBufferLen / 32; ++k) dt[k] = window_dt(p, d, k, lane + 32 * k, w, E);
    draft_weights(dt, d.A, w, T, E, E_pad, L, Tp, sm.dots(), sm.coef(b), sm.decay(b));
    // The drafts' dt become entries w .. E - 1 of this head's buffer.
    float* dt_dst = p.dt_buf + slot * p.dtb_slot_stride + head * p.dtb_head_stride;
#pragma unroll
    for (int k = 0; k < kMamba2SpecMaxBufferLen / 32; ++k) {
      const int j = lane + 32 * k;
      if (j >= w && j < E) dt_dst[j] = dt[k];
    }

    if constexpr (kScaled) {
#pragma unroll
      for (int k = 0; k < kScalesPerLane; ++k) {
        const int pr = lane + 32 * k;
        if (pr < kP) sm.scale(b)[pr] = sv[k];
      }
    }
    if (lane == 0) *sm.skip(b) = skip;
    mbarrier_arrive(sm.coef_ready(b));
  };

  // The scalar warp: the drafts' x of head h (from its x window) become entries w .. E - 1 of the buffer.
  auto append_x = [&](int h) {
    constexpr int kPerChunk = 16 / sizeof(Act);
    constexpr int kChunks = kP / kPerChunk;
    const Act* xw = sm.x_window(h % 3);
    Act* dst = static_cast<Act*>(p.x_buf) + slot * p.xb_slot_stride + (head0 + h) * p.xb_head_stride;
    for (int k = lane; k < T * kChunks; k += 32) {
      const int i = k / kChunks;
      const int c = (k - i * kChunks) * kPerChunk;
      *reinterpret_cast<uint4*>(dst + (w + i) * p.xb_entry_stride + c) = *reinterpret_cast<const uint4*>(xw + (w + i) * kP + c);
    }
  };

  // A reduce warp's units of the tile against the drafts i0 .. i0 + 3 (C values c), each lane then
  // forming one (row, draft) output with the other lanes of its draft:
  //   y_i[p] = e^{Lambda_t} s_p (S_read C_i)_p + sum_j coef[j][i] x_j[p] + D x_t[p], times silu(z_i[p]).
  // The lanes of a draft split the window's entries between them before their partial state sums
  // are added, so the window term costs no shuffle; the first of them stores.
  // A warp's units are consecutive rows, taken two at a time: in a pair a lane's two rows are adjacent
  // (rows 2 g, 2 g + 1 of the pair's block, g = lane / kLanes), so one 32-bit load reads both rows' x.
  constexpr int kBaseUnits = kUnits / kReduceWarps, kExtraUnits = kUnits % kReduceWarps;
  const int my_units = kBaseUnits + (warp < kExtraUnits ? 1 : 0);
  const int first_row = (warp * kBaseUnits + (warp < kExtraUnits ? warp : kExtraUnits)) * kUnitRows;
  const int g = lane / kLanes;
  auto row_of = [&](int r) {  // this lane's row of the warp's unit r
    const bool paired = (r | 1) < my_units;
    return first_row + (paired ? (r & ~1) * kUnitRows + 2 * g + (r & 1) : r * kUnitRows + g);
  };
  // The gates silu(z) of a lane's outputs in the first batch of drafts (the first lane of each draft's
  // lanes stores): z requested at the start of the head before and kept raw in registers through it,
  // then its silu parked in this lane's own slots of shared memory (read back by the same lane: no
  // barrier).
  float* const gate_park = sm.gates() + tid;
  auto load_z = [&](int h, Act (&z)[kMaxUnits]) {
    const int i = draft_of<kLanes>(lane);
    if (p.z == nullptr || lane % kDraftLanes != 0 || i >= T) return;
    const Act* z_src = static_cast<const Act*>(p.z) + row * p.z_row_stride + i * p.z_token_stride + (head0 + h) * p.z_head_stride;
#pragma unroll
    for (int r = 0; r < kMaxUnits; ++r) {
      if (r < my_units) z[r] = __ldg(z_src + row_of(r));
    }
  };
  auto park_gates = [&](const Act (&z)[kMaxUnits]) {
    if (p.z == nullptr || lane % kDraftLanes != 0 || draft_of<kLanes>(lane) >= T) return;
#pragma unroll
    for (int r = 0; r < kMaxUnits; ++r) gate_park[r * kThreads] = gate(to_float(z[r]));
  };
  auto reduce_units = [&](const unsigned char* tile, const float (&c)[kDraftBatch][Chunk::kElems], int i0, int h) {
    const int b = h & 1;
    const int i = i0 + draft_of<kLanes>(lane);
    const int q = lane % kDraftLanes;
    const float* coef = sm.coef(b) + i;
    const Act* xw = sm.x_window(h % 3);
    const float decay = sm.decay(b)[i];  // 0 for the padding drafts i >= T
    const float skip = *sm.skip(b);
    Act* const out_i = static_cast<Act*>(p.out) + row * p.out_row_stride + i * p.out_token_stride + (head0 + h) * p.out_head_stride;
    // The lane's K rows from row0 (units r0 .. r0 + K - 1; K = 2: adjacent rows), reduced, completed
    // and stored; two units at once so that their loads, FMAs and shuffles interleave (one at a time
    // left each warp waiting on its own latency chain).
    auto units = [&](int r0, auto count) {
      constexpr int K = decltype(count)::value;
      const int row0 = row_of(r0);
      float y[K];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        float v[Chunk::kElems];
        Chunk::load(tile + (row0 + k) * kN * kSrcBytes, row_lane, v);
        float d[kDraftBatch] = {};
#pragma unroll
        for (int m = 0; m < kDraftBatch; ++m) {
#pragma unroll
          for (int e = 0; e < Chunk::kElems; ++e) d[m] += v[e] * c[m][e];
        }
        y[k] = scatter_drafts4<kLanes>(d, lane) * (kScaled ? decay * sm.scale(b)[row0 + k] : decay);
      }
      // Entries q, q + kDraftLanes, ... < E_pad: the same count for every lane (coefficients 0 from E
      // on, x read at entry E - 1 there). Unrolled twice: at the default ptxas spilled at 128 registers.
#pragma unroll 2
      for (int jj = 0; jj < E_pad / kDraftLanes; ++jj) {
        const int j = jj * kDraftLanes + q;
        const float cf = coef[j * Tp];
        const Act* xj = xw + min(j, E - 1) * kP + row0;
        if constexpr (K == 2) {
          float x2[2];
          act2_to_float(xj, x2);
          y[0] += cf * x2[0];
          y[1] += cf * x2[1];
        } else {
          y[0] += cf * to_float(xj[0]);
        }
      }
#pragma unroll
      for (int k = 0; k < K; ++k) {
        y[k] = finish_draft_sum<kLanes>(y[k]);
        if (q == 0 && i < T) {
          float out = y[k] + skip * to_float(xw[(w + i) * kP + row0 + k]);
          if (p.z != nullptr) {
            out *= i0 == 0 ? gate_park[(r0 + k) * kThreads]
                           : gate(load_act<kAct>(p.z, row * p.z_row_stride + i * p.z_token_stride +
                                                          (head0 + h) * p.z_head_stride + row0 + k));
          }
          store_act<kAct>(out_i, row0 + k, out);
        }
      }
    };
    int r = 0;
#pragma unroll 1
    for (; r + 1 < my_units; r += 2) units(r, std::integral_constant<int, 2>{});
    if (r < my_units) units(r, std::integral_constant<int, 1>{});
  };

  // ---- an fp32 source (and a 16-bit copy of the activations' type, below): the reduce warps on tensor cores ----
  // S C_i for 8 drafts at a time as an m16n8k8 tf32 product, one warp per 16 state rows (an m-tile):
  // each state element is split into two tf32 parts (split_tf32) and C (a bf16 or fp16 activation) is
  // tf32-exact, so two mma per k-step give S C_i within 2^-21 of each product, summed in fp32. The window
  // term sum_j coef[j][i] x_j is a second product, x_j^T (exact) times coef (split): D = 8 drafts x 16
  // rows, and each lane finishes its 4 outputs (rows g, g + 8; drafts 2c, 2c + 1). Why: the CUDA-core
  // reduction above costs ~6,500 warp instructions per head and CTA (FFMA 20% of them, the rest
  // address arithmetic, shuffles and branches; IPC 2.2, 65% of DRAM).
  // Physical columns per k-step as in tensor_dot.cuh: lane c of a quad loads columns 16 G + 4 c .. + 3
  // of its rows (one 16-byte load per row), which are k = c, c + 4 of k-step 2 G (the first two) and of
  // k-step 2 G + 1 (the last two); C's fragments take the same columns.
  // A 16-bit read copy of the activations' type (bf16 with bf16, fp16 with fp16) takes the same path with
  // mma.sync m16n8k16 in that type: products exact, no split, one mma per 16 columns. Its k-steps are
  // tensor_dot.cuh's: lane c of a quad loads 16 bytes (8 elements) of its rows at chunk 4 G + c, whose
  // words 0-1 are k-step 2 G and words 2-3 k-step 2 G + 1. Other pairings keep the CUDA-core path.
  constexpr bool kTf32 = kSrc == DType::kFloat32;
  constexpr bool kTensorRead =
      kTf32 || (kSrc == kAct && (kSrc == DType::kBFloat16 || kSrc == DType::kFloat16));
  constexpr int kKSteps = kTf32 ? kN / 8 : kN / 16;
  constexpr int kMTiles = kP / 16;
  static_assert(kP % 16 == 0 && kN % 16 == 0, "whole m16n8k8 / m16n8k16 tiles");
  const int quad_g = lane >> 2, quad_c = lane & 3;
  // C of drafts n0 + g as B fragments (tf32 bit patterns, or 16-bit pairs; zero for drafts >= T).
  auto load_c_frags = [&](int n0, uint32_t (&cf)[kKSteps][2]) {
    const int i = n0 + quad_g;
    if constexpr (kTf32) {
#pragma unroll
      for (int G = 0; G < kKSteps / 2; ++G) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float v = i < T ? to_float(sm.C_rows()[i * kN + 16 * G + 4 * quad_c + e]) : 0.0f;
          cf[2 * G + e / 2][e % 2] = __float_as_uint(v);
        }
      }
    } else {
#pragma unroll
      for (int G = 0; G < kKSteps / 2; ++G) {
        uint4 v{};
        if (i < T) v = *reinterpret_cast<const uint4*>(sm.C_rows() + i * kN + 8 * (4 * G + quad_c));
        cf[2 * G][0] = v.x;
        cf[2 * G][1] = v.y;
        cf[2 * G + 1][0] = v.z;
        cf[2 * G + 1][1] = v.w;
      }
    }
  };
  // z of a lane's 4 outputs of m-tile mt, drafts n0 + 2c, n0 + 2c + 1, kept raw so that nothing waits on
  // the load before the outputs. Drafts 0 .. 7 are requested a head ahead: requested at the start of
  // the products instead, this path was slower than the CUDA-core one (a head ahead, 4% faster).
  auto load_z_frag = [&](int h, int mt, int n0, Act (&zr)[4]) {
    if (p.z == nullptr) return;
    const int i0 = n0 + 2 * quad_c;
    const Act* z = static_cast<const Act*>(p.z) + row * p.z_row_stride + (head0 + h) * p.z_head_stride + 16 * mt + quad_g;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = i0 + (k & 1);
      if (i < T) zr[k] = __ldg(z + i * p.z_token_stride + (k < 2 ? 0 : 8));
    }
  };
  auto mma_tile = [&](const unsigned char* tile, const uint32_t (&cf)[kKSteps][2], int mt, int n0, int h,
                      const Act (&zr)[4]) {
    const int b = h & 1;
    const int r0 = 16 * mt + quad_g, r1 = r0 + 8;
    const int i0 = n0 + 2 * quad_c;  // this lane's drafts i0, i0 + 1
    const int head = head0 + h;
    float hi_acc[4] = {}, lo_acc[4] = {};  // 16-bit sources: hi_acc only
    if constexpr (kTf32) {
      const float* s0 = reinterpret_cast<const float*>(tile) + r0 * kN + 4 * quad_c;
      const float* s1 = s0 + 8 * kN;
#pragma unroll
      for (int G = 0; G < kKSteps / 2; ++G) {
        const float4 v = *reinterpret_cast<const float4*>(s0 + 16 * G);
        const float4 u = *reinterpret_cast<const float4*>(s1 + 16 * G);
        const Tf32Pair a[2][4] = {
            {split_tf32(v.x), split_tf32(u.x), split_tf32(v.y), split_tf32(u.y)},
            {split_tf32(v.z), split_tf32(u.z), split_tf32(v.w), split_tf32(u.w)}};
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const uint32_t(&c)[2] = cf[2 * G + k];
          mma_m16n8k8_tf32(hi_acc, a[k][0].hi, a[k][1].hi, a[k][2].hi, a[k][3].hi, c[0], c[1]);
          mma_m16n8k8_tf32(lo_acc, a[k][0].lo, a[k][1].lo, a[k][2].lo, a[k][3].lo, c[0], c[1]);
        }
      }
    } else {
      constexpr int kRowBytes = kN * 2;
      const unsigned char* s0 = tile + r0 * kRowBytes + 16 * quad_c;
      const unsigned char* s1 = s0 + 8 * kRowBytes;
#pragma unroll
      for (int G = 0; G < kKSteps / 2; ++G) {
        const uint4 v = *reinterpret_cast<const uint4*>(s0 + 64 * G);  // row g
        const uint4 u = *reinterpret_cast<const uint4*>(s1 + 64 * G);  // row g + 8
        mma_m16n8k16<kSrc == DType::kBFloat16>(hi_acc, v.x, u.x, v.y, u.y, cf[2 * G][0], cf[2 * G][1]);
        mma_m16n8k16<kSrc == DType::kBFloat16>(hi_acc, v.z, u.z, v.w, u.w, cf[2 * G + 1][0], cf[2 * G + 1][1]);
      }
    }
    // The window term: A = x_j[p] (rows p, k = entry j), B = coef[j][i]. Entries from E on have zero
    // coefficients; their x is read at entry E - 1 (a finite value) instead.
    float win_acc[4] = {};
    const Act* xw = sm.x_window(h % 3);
    const float* coef = sm.coef(b);
    const int ci = n0 + quad_g;  // the draft of this lane's B fragment
    for (int k0 = 0; k0 < E; k0 += 8) {  // CTA-uniform trip count: mma.sync needs the whole warp
      const int j0 = k0 + quad_c, j1 = j0 + 4;
      const int x0 = min(j0, E - 1) * kP, x1 = min(j1, E - 1) * kP;
      const uint32_t a0 = __float_as_uint(to_float(xw[x0 + r0])), a1 = __float_as_uint(to_float(xw[x0 + r1]));
      const uint32_t a2 = __float_as_uint(to_float(xw[x1 + r0])), a3 = __float_as_uint(to_float(xw[x1 + r1]));
      const Tf32Pair c0 = split_tf32(ci < Tp && j0 < E ? coef[j0 * Tp + ci] : 0.0f);
      const Tf32Pair c1 = split_tf32(ci < Tp && j1 < E ? coef[j1 * Tp + ci] : 0.0f);
      mma_m16n8k8_tf32(win_acc, a0, a1, a2, a3, c0.hi, c1.hi);
      mma_m16n8k8_tf32(win_acc, a0, a1, a2, a3, c0.lo, c1.lo);
    }
    const float skip = *sm.skip(b);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = i0 + (k & 1);
      const int r = k < 2 ? r0 : r1;
      if (i < T) {
        float y = (hi_acc[k] + lo_acc[k]) * sm.decay(b)[i] + win_acc[k] + skip * to_float(xw[(w + i) * kP + r]);
        if (p.z != nullptr) y *= gate(to_float(zr[k]));
        store_act<kAct>(p.out, row * p.out_row_stride + i * p.out_token_stride + head * p.out_head_stride + r, y);
      }
    }
  };

  // The head loop, one per role (the reduce warps' C values must not be live in the scalar warp's code,
  // nor its temporaries in theirs), the same barriers in both: at the end of head h every reduce warp
  // is done with its stage and x window, and x window h + 1 has landed.
  auto end_of_head = [&]() {
    cp_async_wait<1>();  // x window h + 1 (this thread's copies; h + 2's may still be in flight)
    __syncthreads();
  };
  auto stage_ahead = [&](int h) {  // x window h + 2 goes where head h - 1's was: free since the last barrier
    if (h + 2 < num_heads) stage_x_window((h + 2) % 3, head0 + h + 2);
    cp_async_commit();
  };
  if (scalar_warp) {
    const WindowDt first = next_dt;
    if (num_heads > 1) next_dt = load_window_dt(p, row, slot, head0 + 1, w, E);
    prepare_head(0, first);
    int refill = 0;  // (h - 1) % S, counted: a division by the runtime S costs this warp ~50 instructions
    for (int h = 0; h < num_heads; ++h) {
      stage_ahead(h);
      // Head h - 1's stage is free since the last barrier: the tile S heads on goes in.
      if (h > 0) {
        if (lane == 0 && h - 1 + S < num_heads) {
          fence_proxy_async();
          issue_tile(refill, head0 + h - 1 + S);
        }
        if (++refill == S) refill = 0;
      }
      if (h + 1 < num_heads) {
        const WindowDt cur = next_dt;
        if (h + 2 < num_heads) next_dt = load_window_dt(p, row, slot, head0 + h + 2, w, E);
        prepare_head(h + 1, cur);
      }
      append_x(h);
      end_of_head();
    }
  } else if constexpr (kTensorRead) {
    uint32_t cf[kKSteps][2];  // this warp's C fragments: drafts 0 .. 7 between heads
    load_c_frags(0, cf);
    constexpr int kMaxMTiles = (kMTiles + kReduceWarps - 1) / kReduceWarps;  // a warp's m-tiles: warp, warp + 7
    Act z_next[kMaxMTiles][4] = {};  // head h + 1's, drafts 0 .. 7
#pragma unroll
    for (int m = 0; m < kMaxMTiles; ++m) {
      if (warp + m * kReduceWarps < kMTiles) load_z_frag(0, warp + m * kReduceWarps, 0, z_next[m]);
    }
    int stage = 0;
    uint32_t phase = 0;
    for (int h = 0; h < num_heads; ++h) {
      Act z_now[kMaxMTiles][4];
#pragma unroll
      for (int m = 0; m < kMaxMTiles; ++m) {
#pragma unroll
        for (int k = 0; k < 4; ++k) z_now[m][k] = z_next[m][k];
        if (h + 1 < num_heads && warp + m * kReduceWarps < kMTiles) load_z_frag(h + 1, warp + m * kReduceWarps, 0, z_next[m]);
      }
      stage_ahead(h);
      mbarrier_wait(sm.full(stage), phase);
      mbarrier_wait(sm.coef_ready(h & 1), (h >> 1) & 1);
      const unsigned char* tile = sm.tile(stage);
#pragma unroll
      for (int m = 0; m < kMaxMTiles; ++m) {
        const int mt = warp + m * kReduceWarps;
        if (mt >= kMTiles) break;
        mma_tile(tile, cf, mt, 0, h, z_now[m]);
        for (int n0 = 8; n0 < T; n0 += 8) {  // drafts 8 .. 15: their fragments in the same registers
          Act z_more[4] = {};
          load_z_frag(h, mt, n0, z_more);
          load_c_frags(n0, cf);
          mma_tile(tile, cf, mt, n0, h, z_more);
          load_c_frags(0, cf);
        }
      }
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }
      end_of_head();
    }
  } else {
    float c[kDraftBatch][Chunk::kElems];  // this warp's C values: the first batch's between heads
    load_c(0, c);
    int stage = 0;
    uint32_t phase = 0;
    Act z_next[kMaxUnits] = {};
    load_z(0, z_next);
    park_gates(z_next);
    for (int h = 0; h < num_heads; ++h) {
      if (h + 1 < num_heads) load_z(h + 1, z_next);
      stage_ahead(h);
      mbarrier_wait(sm.full(stage), phase);
      mbarrier_wait(sm.coef_ready(h & 1), (h >> 1) & 1);
      const unsigned char* tile = sm.tile(stage);
      reduce_units(tile, c, 0, h);
      if (T > kDraftBatch) {  // the further batches' C from shared memory, in the same registers
        for (int i0 = kDraftBatch; i0 < T; i0 += kDraftBatch) {
          load_c(i0, c);
          reduce_units(tile, c, i0, h);
        }
        load_c(0, c);  // the first batch's again, for the next head
      }
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }
      if (h + 1 < num_heads) park_gates(z_next);
      end_of_head();
    }
  }
  // The drafts' B rows, once per group, by its first head's CTA (the others read only entries < w).
  if (head0 == group * heads_per_group) {
    constexpr int kPerChunk = 16 / sizeof(Act);
    constexpr int kChunks = kN / kPerChunk;
    Act* B_dst = static_cast<Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride;
    for (int k = tid; k < T * kChunks; k += kThreads) {
      const int i = k / kChunks;
      const int c = (k - i * kChunks) * kPerChunk;
      *reinterpret_cast<uint4*>(B_dst + (w + i) * p.Bb_entry_stride + c) =
          *reinterpret_cast<const uint4*>(sm.B_window() + (w + i) * kN + c);
    }
  }
}

}  // namespace mamba2_spec
}  // namespace replayssm
