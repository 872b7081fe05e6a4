// ReplaySSM Mamba-2 step (T=1), one CTA per (batch row, head), one launch per decode step.
//
// Let w = num_committed[slot] buffered tokens precede the current one (entry w), Lambda_j =
// A * sum_{i<=j} dt_i and wgt_j = dt_j exp(Lambda_w - Lambda_j).
//   replay step (the buffer still has room after this token):
//     y = e^{Lambda_w} (S_read C) + sum_{j<=w} wgt_j (B_j . C) x_j + D x;   append x, B, dt at entry w
//     reads the read copy (or the checkpoint) once; writes nothing of the state.
//   fold step (w + 1 + max_draft_tokens > L):
//     S = e^{Lambda_w} S_c + sum_{j<=w} (wgt_j x_j) (outer) B_j;  y = S C + D x;  write S and its read copy
//     reads the fp32 checkpoint once and writes it once, like the conventional update, plus the copy.
//
// The cursor of a slot is shared by its H head-CTAs, so none may change it before all have read it:
// each CTA adds a ticket (1 << 16) to num_committed[slot] when it is done, and the CTA that draws the
// last ticket writes the new cursor, which also clears the tickets. Nothing crosses launches.
//
// This header holds the kernel template; mamba2_step_p<P>_n<N>.cu instantiate it per shape (so the
// shapes compile in parallel) and mamba2_step.cu picks the shape at run time.
#pragma once

#include "mamba2.cuh"
#include "mamba2_tile.cuh"

namespace replayssm {
namespace mamba2 {

constexpr int32_t kTicket = 1 << 16;
constexpr int32_t kCursorMask = kTicket - 1;

// Shared memory of one CTA: the window (entries 0..w) staged once, read by every thread.
template <int kP, int kN, DType kAct>
struct StepSmem {
  using Act = typename Storage<kAct>::type;
  // The float region is padded to whole 16-byte vectors so the activation rows after it, which are
  // filled with 16-byte copies, start aligned.
  __host__ __device__ static int float_count(int L) { return (3 * L + kN + 1 + 3) / 4 * 4; }
  static size_t bytes(int L) {
    return sizeof(float) * float_count(L) + sizeof(Act) * static_cast<size_t>(L) * (kP + kN);
  }
  float* dt;     // [L] dt_j
  float* wgt;    // [L] dt_j exp(Lambda_w - Lambda_j)
  float* bc;     // [L] B_j . C
  float* C;      // [N]
  float* decay;  // [1] exp(Lambda_w)
  Act* x;        // [L][P]
  Act* B;        // [L][N]
  __device__ StepSmem(float* base, int L) {
    dt = base;
    wgt = dt + L;
    bc = wgt + L;
    C = bc + L;
    decay = C + kN;
    x = reinterpret_cast<Act*>(base + float_count(L));
    B = x + static_cast<size_t>(L) * kP;
  }
};

// One 16-byte global -> shared copy that completes asynchronously (cp.async, sm_80+): a thread can
// have all of its window copies in flight at once instead of one load latency per entry.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* global_src) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Copy entries 0..w of one kind of buffer row (x or B) to shared memory: entries < w from the
// buffer, entry w from the current token.
template <int kChunksPerEntry, int kElems, class Act>
__device__ __forceinline__ void stage_rows(Act* dst, const Act* buffer, int64_t entry_stride, const Act* current, int w) {
  constexpr int kPerChunk = 16 / sizeof(Act);
  const int total = (w + 1) * kChunksPerEntry;
  for (int i = threadIdx.x; i < total; i += kThreads) {
    const int j = i / kChunksPerEntry;
    const int c = (i - j * kChunksPerEntry) * kPerChunk;
    cp_async16(dst + j * kElems + c, (j < w ? buffer + j * entry_stride : current) + c);
  }
}

// Stage the window (buffered entries 0..w-1 and the current token as entry w), then in one phase:
// warp 0 scans dt into the fold weights and the total decay, the other warps compute B_j . C for the
// replay path (need_bc). Two barriers in all.
template <int kP, int kN, DType kAct>
__device__ void stage_window(const Mamba2Params& p, const StepSmem<kP, kN, kAct>& sm, int row, int head,
                             int group, int64_t slot, int w, float dt_now, bool need_bc) {
  using Act = typename Storage<kAct>::type;
  static_assert(kP * sizeof(Act) % 16 == 0 && kN * sizeof(Act) % 16 == 0, "rows must be whole 16-byte chunks");
  const Act* x_buf = static_cast<const Act*>(p.x_buf) + slot * p.xb_slot_stride + head * p.xb_head_stride;
  const Act* B_buf = static_cast<const Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride;
  stage_rows<kP * sizeof(Act) / 16, kP>(sm.x, x_buf, p.xb_entry_stride,
                                        static_cast<const Act*>(p.x) + row * p.x_row_stride + head * p.x_head_stride, w);
  stage_rows<kN * sizeof(Act) / 16, kN>(sm.B, B_buf, p.Bb_entry_stride,
                                        static_cast<const Act*>(p.B) + row * p.B_row_stride + group * p.B_group_stride, w);
  const float* dt_buf = p.dt_buf + slot * p.dtb_slot_stride + head * p.dtb_head_stride;
  for (int j = threadIdx.x; j <= w; j += kThreads) sm.dt[j] = j < w ? __ldg(dt_buf + j) : dt_now;
  const Act* C = static_cast<const Act*>(p.C) + row * p.C_row_stride + group * p.C_group_stride;
  for (int n = threadIdx.x; n < kN; n += kThreads) sm.C[n] = to_float(__ldg(C + n));
  cp_async_wait_all();
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0) {
    const float A = __ldg(p.A + head);
    float prefix[2];
    float carry = 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = lane + 32 * half;
      float v = j <= w ? sm.dt[j] : 0.0f;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const float other = __shfl_up_sync(0xffffffffu, v, offset);
        if (lane >= offset) v += other;
      }
      prefix[half] = v + carry;
      carry += __shfl_sync(0xffffffffu, v, 31);
    }
    const float total = A * __shfl_sync(0xffffffffu, prefix[w / 32], w % 32);  // Lambda_w
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = lane + 32 * half;
      if (j <= w) sm.wgt[j] = sm.dt[j] * expf(total - A * prefix[half]);
    }
    if (lane == 0) sm.decay[0] = expf(total);
  } else if (need_bc) {
    for (int j = warp - 1; j <= w; j += kThreads / 32 - 1) {
      float d = 0.0f;
#pragma unroll
      for (int n = lane; n < kN; n += 32) d += to_float(sm.B[j * kN + n]) * sm.C[n];
      d = row_sum<32>(d);
      if (lane == 0) sm.bc[j] = d;
    }
  }
  __syncthreads();
}

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct>
__global__ void __launch_bounds__(kThreads) step_kernel(const Mamba2Params p) {
  using Shape = TileShape<kP, kN>;
  using Act = typename Storage<kAct>::type;
  constexpr int R = Shape::kRowsPerThread;
  constexpr int kLanes = Shape::kLanesPerRow;
  extern __shared__ float smem_base[];

  const int head = blockIdx.x;
  const int row = blockIdx.y;
  const int64_t slot = resolve_slot(p, row);
  const int L = p.buffer_len;
  const int w = slot < 0 ? -1 : (p.num_committed[slot] & kCursorMask);
  if (slot < 0 || w >= L) {  // pad row, out-of-range slot, or a cursor with no room: touch nothing
    write_zero_output<kAct>(p, row, head);
    return;
  }
  const bool fold = w + 1 + p.max_draft_tokens > L;
  const int group = head / (p.heads / p.groups);
  const int col0 = Shape::col0();
  const StepSmem<kP, kN, kAct> sm(smem_base, L);
  RowEpilogue<R> epilogue;
  epilogue.template load<kAct, Shape>(p, row, head);

  if (fold) {
    using V = Vec4<kCkpt>;
    const int64_t tile = slot * p.ck_slot_stride + head * p.ck_head_stride;
    typename V::Raw raw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) raw[r] = V::load(p.checkpoint, tile + Shape::row(r) * p.ck_row_stride + col0);
    stage_window<kP, kN, kAct>(p, sm, row, head, group, slot, w, load_dt(p, row, head), false);

    const float decay = sm.decay[0];
    float s[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      V::to_float(raw[r], s[r]);
#pragma unroll
      for (int i = 0; i < 4; ++i) s[r][i] *= decay;
    }
    for (int j = 0; j <= w; ++j) {
      float b[4];
      Vec4<kAct>::to_float(*reinterpret_cast<const typename Vec4<kAct>::Raw*>(sm.B + j * kN + col0), b);
      const float wgt = sm.wgt[j];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float coef = wgt * to_float(sm.x[j * kP + Shape::row(r)]);
#pragma unroll
        for (int i = 0; i < 4; ++i) s[r][i] += coef * b[i];
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int pr = Shape::row(r);
      float y = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) y += s[r][i] * sm.C[col0 + i];
      V::store(p.checkpoint, tile + pr * p.ck_row_stride + col0, s[r]);
      if constexpr (kCopy) {
        // The read copy is made from the checkpoint as stored, exactly like make_read_copy.
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = V::round_trip(s[r][i]);
        const int64_t rc = slot * p.rc_slot_stride + head * p.rc_head_stride + pr * p.rc_row_stride + col0;
        if constexpr (kRead == DType::kFloat8E4M3) {
          float amax = 0.0f;
#pragma unroll
          for (int i = 0; i < 4; ++i) amax = max_keep_nan(amax, fabsf(v[i]));
          amax = row_max_keep_nan<kLanes>(amax);
          const bool nonzero = amax > 0.0f;
          const float inv = nonzero ? __fdiv_rn(kFp8E4M3Max, amax) : 1.0f;
#pragma unroll
          for (int i = 0; i < 4; ++i) v[i] = clamp_keep_nan(__fmul_rn(v[i], inv), -kFp8E4M3Max, kFp8E4M3Max);
          if (Shape::lane_in_row() == 0) {
            p.read_scale[slot * p.rs_slot_stride + head * p.rs_head_stride + pr] =
                nonzero ? __fdiv_rn(amax, kFp8E4M3Max) : 1.0f;
          }
        }
        Vec4<kRead>::store(p.read_copy, rc, v);
      }
      y = row_sum<kLanes>(y);
      if (Shape::lane_in_row() == 0) epilogue.template store<kAct>(p, row, head, r, pr, y, to_float(sm.x[w * kP + pr]));
    }
  } else {
    constexpr DType kSrc = kCopy ? kRead : kCkpt;
    using V = Vec4<kSrc>;
    const void* src = kCopy ? p.read_copy : p.checkpoint;
    const int64_t tile = kCopy ? slot * p.rc_slot_stride + head * p.rc_head_stride
                               : slot * p.ck_slot_stride + head * p.ck_head_stride;
    const int64_t row_stride = kCopy ? p.rc_row_stride : p.ck_row_stride;
    typename V::Raw raw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) raw[r] = V::load(src, tile + Shape::row(r) * row_stride + col0);
    float row_scale[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      row_scale[r] = kSrc == DType::kFloat8E4M3
                         ? __ldg(p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride + Shape::row(r))
                         : 1.0f;
    }
    const float dt_now = load_dt(p, row, head);
    stage_window<kP, kN, kAct>(p, sm, row, head, group, slot, w, dt_now, true);

    const float decay = sm.decay[0];
    float c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] = sm.C[col0 + i];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int pr = Shape::row(r);
      float v[4];
      V::to_float(raw[r], v);
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) dot += v[i] * c[i];
      float y = decay * row_scale[r] * dot;
      // The buffer's part, spread over the lanes of the row: lane l takes entries l, l + kLanes, ...
      for (int j = Shape::lane_in_row(); j <= w; j += kLanes) y += sm.wgt[j] * sm.bc[j] * to_float(sm.x[j * kP + pr]);
      y = row_sum<kLanes>(y);
      if (Shape::lane_in_row() == 0) epilogue.template store<kAct>(p, row, head, r, pr, y, to_float(sm.x[w * kP + pr]));
    }

    // Append the current token as entry w (B once per group, by the group's first head).
    constexpr int kXChunks = kP * sizeof(Act) / 16;
    constexpr int kBChunks = kN * sizeof(Act) / 16;
    Act* x_dst = static_cast<Act*>(p.x_buf) + slot * p.xb_slot_stride + head * p.xb_head_stride + w * p.xb_entry_stride;
    for (int i = threadIdx.x; i < kXChunks; i += kThreads) {
      reinterpret_cast<uint4*>(x_dst)[i] = reinterpret_cast<const uint4*>(sm.x + w * kP)[i];
    }
    if (head % (p.heads / p.groups) == 0) {
      Act* B_dst = static_cast<Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride + w * p.Bb_entry_stride;
      for (int i = threadIdx.x; i < kBChunks; i += kThreads) {
        reinterpret_cast<uint4*>(B_dst)[i] = reinterpret_cast<const uint4*>(sm.B + w * kN)[i];
      }
    }
    if (threadIdx.x == 0) p.dt_buf[slot * p.dtb_slot_stride + head * p.dtb_head_stride + w] = dt_now;
  }

  // Every thread read the cursor before this barrier; the last of the slot's H CTAs moves it.
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t old = atomicAdd(p.num_committed + slot, kTicket);
    if ((old >> 16) == p.heads - 1) atomicExch(p.num_committed + slot, fold ? 0 : w + 1);
  }
}

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct>
cudaError_t launch_step(const Mamba2Params& p, cudaStream_t stream) {
  auto kernel = step_kernel<kP, kN, kCkpt, kCopy, kRead, kAct>;
  const size_t smem = StepSmem<kP, kN, kAct>::bytes(p.buffer_len);
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(p.heads, p.batch);
  kernel<<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <int kP, int kN, DType kAct>
cudaError_t dispatch_state(const Mamba2Params& p, cudaStream_t stream) {
  const bool copy = p.read_copy != nullptr;
  const DType ck = p.checkpoint_dtype, rc = p.read_copy_dtype;
#define REPLAYSSM_STEP_CASE(CKPT, COPY, READ)                              \
  if (ck == DType::CKPT && copy == COPY && (!COPY || rc == DType::READ)) \
    return launch_step<kP, kN, DType::CKPT, COPY, DType::READ, kAct>(p, stream);
  REPLAYSSM_STEP_CASE(kFloat32, false, kFloat32)
  REPLAYSSM_STEP_CASE(kFloat32, true, kBFloat16)
  REPLAYSSM_STEP_CASE(kFloat32, true, kFloat16)
  REPLAYSSM_STEP_CASE(kFloat32, true, kFloat8E4M3)
  REPLAYSSM_STEP_CASE(kBFloat16, false, kBFloat16)
  REPLAYSSM_STEP_CASE(kBFloat16, true, kFloat8E4M3)
  REPLAYSSM_STEP_CASE(kFloat16, false, kFloat16)
  REPLAYSSM_STEP_CASE(kFloat16, true, kFloat8E4M3)
#undef REPLAYSSM_STEP_CASE
  return cudaErrorInvalidValue;
}

// All dtype combinations of one (P, N); defined here, instantiated once per shape file.
template <int kP, int kN>
cudaError_t launch_step_shape(const Mamba2Params& p, cudaStream_t stream) {
  if (p.act_dtype == DType::kBFloat16) return dispatch_state<kP, kN, DType::kBFloat16>(p, stream);
  if (p.act_dtype == DType::kFloat16) return dispatch_state<kP, kN, DType::kFloat16>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace mamba2
}  // namespace replayssm
