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
// Latency, not arithmetic, decides the replay step: the state it streams is half the conventional
// update's or less, so the fixed cost of each CTA shows. Hence: the state loads of the replay source
// are issued before the cursor is known (for a fold step with a read copy they are wasted, 1 step in
// L); every warp derives the window's scalars (the dt scan, wgt_j, B_j . C) itself, one lane per
// entry, so the replay path has no barrier; only the fold stages the window in shared memory.
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
constexpr unsigned kFullMask = 0xffffffffu;

// Window entries a warp lane holds scalars for: j = lane and j = lane + 32 (L <= 64).
constexpr int kEntriesPerLane = kMamba2MaxBufferLen / 32;

// Shared memory of a fold step: the window's x and B rows (entries 0..w), staged once.
template <int kP, int kN, DType kAct>
struct FoldSmem {
  using Act = typename Storage<kAct>::type;
  static size_t bytes(int L) { return sizeof(Act) * static_cast<size_t>(L) * (kP + kN); }
  Act* x;  // [L][P]
  Act* B;  // [L][N]
  __device__ FoldSmem(void* base, int L) {
    x = static_cast<Act*>(base);
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

// Copy entries 0..w of one kind of row (x or B) to shared memory: entries < w from the buffer,
// entry w from the current token.
template <int kElems, class Act>
__device__ __forceinline__ void stage_rows(Act* dst, const Act* buffer, int64_t entry_stride, const Act* current, int w) {
  constexpr int kPerChunk = 16 / sizeof(Act);
  constexpr int kChunks = kElems / kPerChunk;
  static_assert(kElems % kPerChunk == 0, "rows must be whole 16-byte chunks");
  const int total = (w + 1) * kChunks;
  for (int i = threadIdx.x; i < total; i += kThreads) {
    const int j = i / kChunks;
    const int c = (i - j * kChunks) * kPerChunk;
    cp_async16(dst + j * kElems + c, (j < w ? buffer + j * entry_stride : current) + c);
  }
}

// The window's per-entry scalars, held by the lanes of every warp: lane l holds entries l and l + 32.
struct WindowScalars {
  float wgt[kEntriesPerLane];  // dt_j exp(Lambda_w - Lambda_j), 0 past w
  float decay;                 // exp(Lambda_w)

  // Entry j's weight, from the lane that holds it (j is warp-uniform or per lane; all lanes call).
  __device__ float weight(int j) const {
    const float lo = __shfl_sync(kFullMask, wgt[0], j & 31);
    const float hi = __shfl_sync(kFullMask, wgt[1], j & 31);
    return j < 32 ? lo : hi;
  }
};

__device__ __forceinline__ WindowScalars window_scalars(const Mamba2Params& p, int64_t slot, int head, int w,
                                                        float dt_now) {
  const int lane = threadIdx.x & 31;
  const float* dt_buf = p.dt_buf + slot * p.dtb_slot_stride + head * p.dtb_head_stride;
  const float A = __ldg(p.A + head);
  float dt[kEntriesPerLane], prefix[kEntriesPerLane];
  float carry = 0.0f;
#pragma unroll
  for (int h = 0; h < kEntriesPerLane; ++h) {
    const int j = lane + 32 * h;
    dt[h] = j < w ? __ldg(dt_buf + j) : (j == w ? dt_now : 0.0f);
    float v = dt[h];
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const float other = __shfl_up_sync(kFullMask, v, offset);
      if (lane >= offset) v += other;
    }
    prefix[h] = v + carry;
    carry += __shfl_sync(kFullMask, v, 31);
  }
  const float at_w = __shfl_sync(kFullMask, w < 32 ? prefix[0] : prefix[1], w & 31);
  const float total = A * at_w;  // Lambda_w
  WindowScalars ws;
#pragma unroll
  for (int h = 0; h < kEntriesPerLane; ++h) {
    const int j = lane + 32 * h;
    ws.wgt[h] = j <= w ? dt[h] * expf(total - A * prefix[h]) : 0.0f;
  }
  ws.decay = expf(total);
  return ws;
}

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct>
__global__ void __launch_bounds__(kThreads, (TileShape<kP, kN>::kRowsPerThread <= 10 ? 3 : 2))
step_kernel(const Mamba2Params p) {
  using Shape = TileShape<kP, kN>;
  using Act = typename Storage<kAct>::type;
  constexpr int R = Shape::kRowsPerThread;
  constexpr int kLanes = Shape::kLanesPerRow;
  constexpr DType kSrc = kCopy ? kRead : kCkpt;  // what a replay step reads
  using VS = Vec4<kSrc>;
  extern __shared__ __align__(16) unsigned char smem_base[];

  const int head = blockIdx.x;
  const int row = blockIdx.y;
  const int64_t slot = resolve_slot(p, row);
  if (slot < 0) {
    write_zero_output<kAct>(p, row, head);
    return;
  }
  const int col0 = Shape::col0();
  const int lane = threadIdx.x & 31;
  const int group = head / (p.heads / p.groups);

  // ---- everything that does not depend on the cursor, issued before it is known ----
  const void* src = kCopy ? p.read_copy : p.checkpoint;
  const int64_t src_tile = kCopy ? slot * p.rc_slot_stride + head * p.rc_head_stride
                                 : slot * p.ck_slot_stride + head * p.ck_head_stride;
  const int64_t src_row_stride = kCopy ? p.rc_row_stride : p.ck_row_stride;
  typename VS::Raw raw[R];
#pragma unroll
  for (int r = 0; r < R; ++r) raw[r] = VS::load(src, src_tile + Shape::row(r) * src_row_stride + col0);
  const int w = p.num_committed[slot] & kCursorMask;
  float row_scale[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    row_scale[r] = kSrc == DType::kFloat8E4M3
                       ? __ldg(p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride + Shape::row(r))
                       : 1.0f;
  }
  const Act* x_now = static_cast<const Act*>(p.x) + row * p.x_row_stride + head * p.x_head_stride;
  const Act* B_now = static_cast<const Act*>(p.B) + row * p.B_row_stride + group * p.B_group_stride;
  const Act* C_now = static_cast<const Act*>(p.C) + row * p.C_row_stride + group * p.C_group_stride;
  float x_cur[R];
#pragma unroll
  for (int r = 0; r < R; ++r) x_cur[r] = to_float(__ldg(x_now + Shape::row(r)));
  float c[4];
  load_act4<kAct>(C_now, col0, c);
  RowEpilogue<R> epilogue;
  epilogue.template load<kAct, Shape>(p, row, head);
  const float dt_now = load_dt(p, row, head);

  const int L = p.buffer_len;
  if (w >= L) {  // a cursor with no room: touch nothing
    write_zero_output<kAct>(p, row, head);
    return;
  }
  const bool fold = w + 1 + p.max_draft_tokens > L;
  const WindowScalars ws = window_scalars(p, slot, head, w, dt_now);
  const Act* x_buf = static_cast<const Act*>(p.x_buf) + slot * p.xb_slot_stride + head * p.xb_head_stride;
  const Act* B_buf = static_cast<const Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride;

  if (!fold) {
    // B_j . C for this lane's entries, each lane a whole dot product (no shuffles), times wgt_j.
    float coef[kEntriesPerLane];
#pragma unroll
    for (int h = 0; h < kEntriesPerLane; ++h) {
      const int j = lane + 32 * h;
      float dot = 0.0f;
      if (j <= w) {
        const Act* Bj = j < w ? B_buf + j * p.Bb_entry_stride : B_now;
#pragma unroll
        for (int n = 0; n < kN; n += 4) {
          float b[4], cc[4];
          load_act4<kAct>(Bj, n, b);
          load_act4<kAct>(C_now, n, cc);
#pragma unroll
          for (int i = 0; i < 4; ++i) dot += b[i] * cc[i];
        }
      }
      coef[h] = ws.wgt[h] * dot;
    }

    // The buffer's part of row p, spread over the row's lanes: lane l takes entries l, l + kLanes, ...
    constexpr int kSteps = kMamba2MaxBufferLen / kLanes;
    float y[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v[4];
      VS::to_float(raw[r], v);
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) dot += v[i] * c[i];
      y[r] = ws.decay * row_scale[r] * dot;
    }
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      if (k * kLanes > w) break;  // warp-uniform
      const int j = Shape::lane_in_row() + k * kLanes;
      const float lo = __shfl_sync(kFullMask, coef[0], j & 31);
      const float hi = __shfl_sync(kFullMask, coef[1], j & 31);
      const float cj = j < 32 ? lo : hi;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float xj = j < w ? to_float(__ldg(x_buf + j * p.xb_entry_stride + Shape::row(r))) : x_cur[r];
        if (j <= w) y[r] += cj * xj;
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float yr = row_sum<kLanes>(y[r]);
      if (Shape::lane_in_row() == 0) epilogue.template store<kAct>(p, row, head, r, Shape::row(r), yr, x_cur[r]);
    }

    // Append the current token as entry w (B once per group, by the group's first head).
    if (Shape::lane_in_row() == 0) {
      Act* x_dst = static_cast<Act*>(p.x_buf) + slot * p.xb_slot_stride + head * p.xb_head_stride + w * p.xb_entry_stride;
#pragma unroll
      for (int r = 0; r < R; ++r) x_dst[Shape::row(r)] = x_now[Shape::row(r)];
    }
    if (head % (p.heads / p.groups) == 0 && Shape::first_row() == 0) {
      Act* B_dst = static_cast<Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride + w * p.Bb_entry_stride;
      *reinterpret_cast<typename Vec4<kAct>::Raw*>(B_dst + col0) =
          *reinterpret_cast<const typename Vec4<kAct>::Raw*>(B_now + col0);
    }
    if (threadIdx.x == 0) p.dt_buf[slot * p.dtb_slot_stride + head * p.dtb_head_stride + w] = dt_now;
  } else {
    // Fold: stage the window's x and B rows in shared memory (one latency for all of them) while the
    // checkpoint streams in; then S = e^{Lambda_w} S_c + sum_j (wgt_j x_j) (outer) B_j in fp32 FFMA.
    using V = Vec4<kCkpt>;
    const FoldSmem<kP, kN, kAct> sm(smem_base, L);
    const int64_t tile = slot * p.ck_slot_stride + head * p.ck_head_stride;
    float s[R][4];
    if constexpr (kCopy) {
      typename V::Raw ck[R];
#pragma unroll
      for (int r = 0; r < R; ++r) ck[r] = V::load(p.checkpoint, tile + Shape::row(r) * p.ck_row_stride + col0);
#pragma unroll
      for (int r = 0; r < R; ++r) V::to_float(ck[r], s[r]);
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) V::to_float(raw[r], s[r]);
    }
    stage_rows<kP>(sm.x, x_buf, p.xb_entry_stride, x_now, w);
    stage_rows<kN>(sm.B, B_buf, p.Bb_entry_stride, B_now, w);
    cp_async_wait_all();
    __syncthreads();

#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[r][i] *= ws.decay;
    }
    for (int j = 0; j <= w; ++j) {
      const float wj = ws.weight(j);
      float b[4];
      Vec4<kAct>::to_float(*reinterpret_cast<const typename Vec4<kAct>::Raw*>(sm.B + j * kN + col0), b);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float coef = wj * to_float(sm.x[j * kP + Shape::row(r)]);
#pragma unroll
        for (int i = 0; i < 4; ++i) s[r][i] += coef * b[i];
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int pr = Shape::row(r);
      float y = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) y += s[r][i] * c[i];
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
      if (Shape::lane_in_row() == 0) epilogue.template store<kAct>(p, row, head, r, pr, y, x_cur[r]);
    }
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
  const size_t smem = FoldSmem<kP, kN, kAct>::bytes(p.buffer_len);
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
