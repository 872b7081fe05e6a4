// Mamba-2 verify: outputs of T draft tokens per row from the read state and the buffer, their entries
// appended at positions w .. w+T-1 (w = num_committed[slot]). One CTA of 256 threads per (row, head).
//
// With the window of E = w + T entries (committed history, then the drafts), Lambda_j = A sum_{i<=j} dt_i
// and t = w + i the position of draft i:
//   y_i = e^{Lambda_t} (S_read C_i) + sum_{j<=t} coef[i][j] x_j + D x_i  (times silu(z_i)),
//   coef[i][j] = dt_j e^{Lambda_t - Lambda_j} (B_j . C_i).
// Work split, so that nothing is computed twice inside the CTA and each phase is one pass:
//   1. state loads (read copy or checkpoint) issued first, before the cursor is known; the window's
//      x, B rows and the T C rows staged in shared memory with cp.async; warp 0 scans dt over the window.
//   2. (one barrier) every thread takes (i, j) pairs for coef (a whole B_j . C_i from shared memory,
//      16-byte reads, B rows padded so the lanes of a warp hit distinct banks); meanwhile every thread
//      takes the T dot products S[p,:] . C_i of the state elements it holds (T FMAs per element while
//      they sit in registers), reduced over the 16 lanes of a row.
//   3. (one barrier) one thread per (i, p): the buffer term from shared memory, the epilogue and a
//      coalesced store; the same threads append x; the group's first head appends B.
// Verify never writes the checkpoint, the read copy or the cursor: a row whose cursor leaves no room
// for T tokens (or a pad row) gets zero output and touches no cache memory.
#pragma once

#include "mamba2_spec_common.cuh"

namespace replayssm {
namespace mamba2_spec {

// Verify's state tile: 16 lanes per state row with N/16 consecutive elements each, 16 rows per pass
// (16 divides every compiled P), so a row's dot product needs only 4 shuffle steps.
template <int kP, int kN>
struct VerifyTile {
  static constexpr int kLanesPerRow = 16;
  static constexpr int kElems = kN / kLanesPerRow;
  static constexpr int kRowsPerPass = kThreads / kLanesPerRow;
  static constexpr int kRowsPerThread = kP / kRowsPerPass;
  static_assert(kN % (8 * kLanesPerRow / 2) == 0 && kElems >= 4, "state_dim must be a multiple of 64");
  static_assert(kP % kRowsPerPass == 0, "head_dim must be a multiple of 16");

  __device__ static int lane_in_row() { return threadIdx.x % kLanesPerRow; }
  __device__ static int row(int r) { return threadIdx.x / kLanesPerRow + r * kRowsPerPass; }
  __device__ static int col0() { return lane_in_row() * kElems; }
};

template <int kP, int kN, DType kAct>
struct VerifySmem {
  using Act = typename Storage<kAct>::type;
  // B rows padded by 16 bytes: lane-per-entry 16-byte reads of consecutive rows then fall into
  // distinct bank groups.
  static constexpr int kBStride = kN + 16 / static_cast<int>(sizeof(Act));
  static size_t bytes(int L, int T) {
    return sizeof(Act) * (static_cast<size_t>(L) * kP + static_cast<size_t>(L) * kBStride + static_cast<size_t>(T) * kN) +
           sizeof(float) * (2 * static_cast<size_t>(kMamba2SpecMaxBufferLen) + static_cast<size_t>(T) * L +
                            static_cast<size_t>(T) * kP);
  }
  Act* x;       // [L][P]    window x rows (entries >= w are the drafts)
  Act* B;       // [L][kBStride]
  Act* C;       // [T][N]
  float* dt;    // [64]      dt_j
  float* cum;   // [64]      sum_{i<=j} dt_i
  float* coef;  // [T][L]
  float* sdot;  // [T][P]    S_read[p,:] . C_i (read scale applied)
  __device__ VerifySmem(void* base, int L, int T) {
    x = static_cast<Act*>(base);
    B = x + static_cast<size_t>(L) * kP;
    C = B + static_cast<size_t>(L) * kBStride;
    dt = reinterpret_cast<float*>(C + static_cast<size_t>(T) * kN);
    cum = dt + kMamba2SpecMaxBufferLen;
    coef = cum + kMamba2SpecMaxBufferLen;
    sdot = coef + static_cast<size_t>(T) * L;
  }
};

__device__ __forceinline__ float load_draft_dt(const Mamba2SpecParams& p, int64_t row, int token, int head) {
  const int64_t off = row * p.dt_row_stride + token * p.dt_token_stride + head * p.dt_head_stride;
  float dt;
  switch (p.dt_dtype) {
    case DType::kFloat32: dt = __ldg(static_cast<const float*>(p.dt) + off); break;
    case DType::kBFloat16: dt = to_float(__ldg(static_cast<const __nv_bfloat16*>(p.dt) + off)); break;
    default: dt = to_float(__ldg(static_cast<const __half*>(p.dt) + off)); break;
  }
  if (p.dt_bias != nullptr) dt += __ldg(p.dt_bias + head);
  return p.dt_softplus ? softplus(dt) : dt;
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

// Copy the window's rows of one kind (x or B) to shared memory: entries < w from the buffer, the
// drafts from the inputs. All 16-byte chunks of the thread are in flight at once.
template <int kElems, int kDstStride, class Act>
__device__ __forceinline__ void stage_window(Act* dst, const Act* buffer, int64_t entry_stride, const Act* drafts,
                                             int64_t token_stride, int w, int E) {
  constexpr int kPerChunk = 16 / sizeof(Act);
  constexpr int kChunks = kElems / kPerChunk;
  static_assert(kElems % kPerChunk == 0, "rows must be whole 16-byte chunks");
  const int total = E * kChunks;
  for (int k = threadIdx.x; k < total; k += kThreads) {
    const int j = k / kChunks;
    const int c = (k - j * kChunks) * kPerChunk;
    const Act* src = j < w ? buffer + j * entry_stride : drafts + (j - w) * token_stride;
    cp_async16(dst + j * kDstStride + c, src + c);
  }
}

template <int kP, int kN, DType kSrc, DType kAct>
__global__ void __launch_bounds__(kThreads, 2) verify_kernel(const Mamba2SpecParams p) {
  using Tile = VerifyTile<kP, kN>;
  using Smem = VerifySmem<kP, kN, kAct>;
  using Act = typename Storage<kAct>::type;
  constexpr int R = Tile::kRowsPerThread;
  constexpr int kE = Tile::kElems;
  extern __shared__ __align__(16) unsigned char smem_base[];

  const int head = blockIdx.x;
  const int64_t row = blockIdx.y;
  const int T = p.num_tokens;
  const int L = p.buffer_len;
  const int64_t slot = resolve_slot(p, row);
  if (slot < 0) {
    write_zero_outputs<kAct>(p, row, head);
    return;
  }

  // ---- the state loads, issued before anything that depends on the cursor ----
  const bool copy = p.read_copy != nullptr;
  const void* src = copy ? p.read_copy : p.checkpoint;
  const int64_t src_tile = copy ? slot * p.rc_slot_stride + head * p.rc_head_stride
                                : slot * p.ck_slot_stride + head * p.ck_head_stride;
  const int64_t src_row_stride = copy ? p.rc_row_stride : p.ck_row_stride;
  StateChunk<kSrc, kE> raw[R];
#pragma unroll
  for (int r = 0; r < R; ++r) raw[r].load(src, src_tile + Tile::row(r) * src_row_stride + Tile::col0());
  float row_scale[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    row_scale[r] = kSrc == DType::kFloat8E4M3
                       ? __ldg(p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride + Tile::row(r))
                       : 1.0f;
  }

  const int w = p.num_committed[slot];
  if (w < 0 || w > L - T) {  // no room for T entries: touch nothing
    write_zero_outputs<kAct>(p, row, head);
    return;
  }
  const int E = w + T;
  const int heads_per_group = p.heads / p.groups;
  const int group = head / heads_per_group;
  const Smem sm(smem_base, L, T);

  const Act* x_buf = static_cast<const Act*>(p.x_buf) + slot * p.xb_slot_stride + head * p.xb_head_stride;
  const Act* B_buf = static_cast<const Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride;
  const Act* x_in = static_cast<const Act*>(p.x) + row * p.x_row_stride + head * p.x_head_stride;
  const Act* B_in = static_cast<const Act*>(p.B) + row * p.B_row_stride + group * p.B_group_stride;
  const Act* C_in = static_cast<const Act*>(p.C) + row * p.C_row_stride + group * p.C_group_stride;
  stage_window<kP, kP>(sm.x, x_buf, p.xb_entry_stride, x_in, p.x_token_stride, w, E);
  stage_window<kN, Smem::kBStride>(sm.B, B_buf, p.Bb_entry_stride, B_in, p.B_token_stride, w, E);
  stage_window<kN, kN>(sm.C, C_in, 0, C_in, p.C_token_stride, 0, T);

  // Warp 0: dt over the window and its inclusive prefix sum; the drafts' dt go into the buffer.
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float* dt_buf = p.dt_buf + slot * p.dtb_slot_stride + head * p.dtb_head_stride;
    float carry = 0.0f;
#pragma unroll
    for (int h = 0; h < kMamba2SpecMaxBufferLen / 32; ++h) {
      const int j = lane + 32 * h;
      const float dt = j < w ? dt_buf[j] : (j < E ? load_draft_dt(p, row, j - w, head) : 0.0f);
      float v = dt;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const float other = __shfl_up_sync(kFullMask, v, offset);
        if (lane >= offset) v += other;
      }
      if (j < E) {
        sm.dt[j] = dt;
        sm.cum[j] = v + carry;
        if (j >= w) dt_buf[j] = dt;
      }
      carry += __shfl_sync(kFullMask, v, 31);
    }
  }
  cp_async_wait_all();
  __syncthreads();

  const float A = __ldg(p.A + head);
  // coef[i][j], one (i, j) pair per thread; j runs fastest, so a warp shares C_i (a broadcast).
  for (int k = threadIdx.x; k < T * E; k += kThreads) {
    const int i = k / E;
    const int j = k - i * E;
    const int t = w + i;
    float c = 0.0f;
    if (j <= t) {
      const Act* Bj = sm.B + j * Smem::kBStride;
      const Act* Ci = sm.C + i * kN;
      float dot = 0.0f;
#pragma unroll 4
      for (int n = 0; n < kN; n += 8) {
        float b[8], cc[8];
        act8_to_float(Bj + n, b);
        act8_to_float(Ci + n, cc);
#pragma unroll
        for (int e = 0; e < 8; ++e) dot += b[e] * cc[e];
      }
      c = sm.dt[j] * expf(A * sm.cum[t] - A * sm.cum[j]) * dot;
    }
    sm.coef[i * L + j] = c;
  }

  // S_read[p,:] . C_i for every draft while the state elements sit in registers.
  float s[R][kE];
#pragma unroll
  for (int r = 0; r < R; ++r) raw[r].to_float(s[r]);
  for (int i = 0; i < T; ++i) {
    float c[kE];
    if constexpr (kE == 8) {
      act8_to_float(sm.C + i * kN + Tile::col0(), c);
    } else {
      act4_to_float(sm.C + i * kN + Tile::col0(), c);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float d = 0.0f;
#pragma unroll
      for (int e = 0; e < kE; ++e) d += s[r][e] * c[e];
      d = row_sum<Tile::kLanesPerRow>(d);
      if (Tile::lane_in_row() == 0) sm.sdot[i * kP + Tile::row(r)] = d * row_scale[r];
    }
  }
  __syncthreads();

  // One thread per (draft i, row p): buffer term, epilogue, coalesced store; append x_t.
  const float skip = p.D != nullptr ? __ldg(p.D + head) : 0.0f;
  Act* x_dst = static_cast<Act*>(p.x_buf) + slot * p.xb_slot_stride + head * p.xb_head_stride;
  for (int k = threadIdx.x; k < T * kP; k += kThreads) {
    const int i = k / kP;
    const int pr = k - i * kP;
    const int t = w + i;
    float y = expf(A * sm.cum[t]) * sm.sdot[k];
    const float* coef = sm.coef + i * L;
    for (int j = 0; j <= t; ++j) y += coef[j] * to_float(sm.x[j * kP + pr]);
    const Act x_t = sm.x[t * kP + pr];
    y += skip * to_float(x_t);
    if (p.z != nullptr) {
      y *= silu(to_float(__ldg(static_cast<const Act*>(p.z) + row * p.z_row_stride + i * p.z_token_stride +
                               head * p.z_head_stride + pr)));
    }
    store_act<kAct>(p.out, row * p.out_row_stride + i * p.out_token_stride + head * p.out_head_stride + pr, y);
    x_dst[t * p.xb_entry_stride + pr] = x_t;
  }
  // The drafts' B rows, once per group (other heads of the group read only entries < w).
  if (head % heads_per_group == 0) {
    constexpr int kPerChunk = 16 / sizeof(Act);
    constexpr int kChunks = kN / kPerChunk;
    Act* B_dst = static_cast<Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride;
    for (int k = threadIdx.x; k < T * kChunks; k += kThreads) {
      const int i = k / kChunks;
      const int c = (k - i * kChunks) * kPerChunk;
      *reinterpret_cast<uint4*>(B_dst + (w + i) * p.Bb_entry_stride + c) =
          *reinterpret_cast<const uint4*>(sm.B + (w + i) * Smem::kBStride + c);
    }
  }
}

template <int kP, int kN, DType kSrc, DType kAct>
cudaError_t launch_verify(const Mamba2SpecParams& p, cudaStream_t stream) {
  auto kernel = verify_kernel<kP, kN, kSrc, kAct>;
  const size_t smem = VerifySmem<kP, kN, kAct>::bytes(p.buffer_len, p.num_tokens);
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(p.heads, p.batch);
  kernel<<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <int kP, int kN, DType kAct>
cudaError_t dispatch_verify_state(const Mamba2SpecParams& p, cudaStream_t stream) {
  const DType src = p.read_copy != nullptr ? p.read_copy_dtype : p.checkpoint_dtype;
  switch (src) {
    case DType::kFloat32: return launch_verify<kP, kN, DType::kFloat32, kAct>(p, stream);
    case DType::kBFloat16: return launch_verify<kP, kN, DType::kBFloat16, kAct>(p, stream);
    case DType::kFloat16: return launch_verify<kP, kN, DType::kFloat16, kAct>(p, stream);
    case DType::kFloat8E4M3: return launch_verify<kP, kN, DType::kFloat8E4M3, kAct>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

// All dtype combinations of one (P, N); instantiated once per shape file.
template <int kP, int kN>
cudaError_t launch_verify_shape(const Mamba2SpecParams& p, cudaStream_t stream) {
  if (p.act_dtype == DType::kBFloat16) return dispatch_verify_state<kP, kN, DType::kBFloat16>(p, stream);
  if (p.act_dtype == DType::kFloat16) return dispatch_verify_state<kP, kN, DType::kFloat16>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace mamba2_spec
}  // namespace replayssm
