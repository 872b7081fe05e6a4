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
// Latency and instruction count, not arithmetic, decide the replay step: it streams half the bytes
// of the conventional update or less, so whatever a CTA does besides loading state shows. Hence:
//   - the replay source is loaded in 16-byte vectors of its own type before the cursor is known
//     (for a fold step with a read copy they are wasted, 1 step in L);
//   - the window's scalars (dt scan, wgt_j) are computed once per CTA by warp 0, and B_j . C once per
//     CTA by lane groups that split the entries, into shared memory; the window's x rows are staged
//     there with cp.async while the state streams in; one barrier;
//   - thread p < P then owns output row p: buffer term from shared memory (conflict-free), skip, gate,
//     and a coalesced store. (v3 had every lane compute whole B_j . C products serially: 35% of the
//     byte model; see docs/PERF_NOTES_MAMBA2.md.)
// Only the fold also stages the window's B rows and needs a second barrier.
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

// ---- The replay source in 16-byte chunks ----------------------------------------------------------
// The replay read moves every storage type in 16-byte vectors: 4 fp32, 8 bf16/fp16 or 16 fp8
// elements per load. (v3 loaded 4 elements of any type per load, so an fp8 copy cost as many load
// instructions as an fp32 checkpoint.)
template <DType T>
struct Chunk16 {
  static constexpr int kElems = 16 / dtype_size(T);
  __device__ static uint4 load(const void* base, int64_t offset) {
    return __ldg(reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(base) + offset * dtype_size(T)));
  }
  __device__ static void to_float(const uint4& raw, float (&v)[kElems]) {
    const uint32_t word[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (T == DType::kFloat32) {
        v[i] = __uint_as_float(word[i]);
      } else if constexpr (T == DType::kBFloat16) {
        v[2 * i] = __uint_as_float(word[i] << 16);  // bf16 -> fp32 is a shift
        v[2 * i + 1] = __uint_as_float(word[i] & 0xffff0000u);
      } else if constexpr (T == DType::kFloat16) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&word[i]));
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
      } else {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
              static_cast<__nv_fp8x2_storage_t>((word[i] >> (16 * k)) & 0xffffu), __NV_E4M3);
          const float2 f = __half22float2(__half2(h));
          v[4 * i + 2 * k] = f.x;
          v[4 * i + 2 * k + 1] = f.y;
        }
      }
    }
  }
};

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

template <DType kAct, int kCount>
__device__ __forceinline__ void load_act_n(const void* base, int64_t offset, float (&v)[kCount]) {
  static_assert(kCount % 4 == 0, "whole 4-element vectors");
#pragma unroll
  for (int i = 0; i < kCount; i += 4) {
    float q[4];
    load_act4<kAct>(base, offset + i, q);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[i + k] = q[k];
  }
}

// ---- Shared memory of a step: per-entry scalars, per-row dot products, the staged window -----------
template <int kP, int kN, DType kAct>
struct StepSmem {
  using Act = typename Storage<kAct>::type;
  // Float part first: its size is a multiple of 16 bytes, so the activation rows after it are
  // 16-byte aligned for cp.async.
  static constexpr int kFloats = kP + 2 * kMamba2MaxBufferLen + 4;
  static_assert(kFloats % 4 == 0, "16-byte aligned window rows");
  static size_t bytes(int L) { return sizeof(float) * kFloats + sizeof(Act) * static_cast<size_t>(L) * (kP + kN); }

  float* ydot;   // [P]  state part of each output row
  float* wgt;    // [L]  dt_j exp(Lambda_w - Lambda_j)
  float* dots;   // [L]  B_j . C (replay path)
  float* decay;  // [1]  exp(Lambda_w)
  Act* x;        // [L][P] window x rows, entries 0..w
  Act* B;        // [L][N] window B rows (fold path)
  __device__ StepSmem(void* base, int L) {
    ydot = static_cast<float*>(base);
    wgt = ydot + kP;
    dots = wgt + kMamba2MaxBufferLen;
    decay = dots + kMamba2MaxBufferLen;
    x = reinterpret_cast<Act*>(ydot + kFloats);
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

// The window's per-entry weights wgt_j = dt_j exp(Lambda_w - Lambda_j) (j <= w) and exp(Lambda_w),
// computed by one warp (lane l: entries l and l + 32) into shared memory, once per CTA.
template <class Smem>
__device__ __forceinline__ void window_scalars(const Mamba2Params& p, int64_t slot, int head, int w, float dt_now,
                                               const Smem& sm) {
  constexpr int kEntriesPerLane = kMamba2MaxBufferLen / 32;
  const int lane = threadIdx.x & 31;
  const float* dt_buf = p.dt_buf + slot * p.dtb_slot_stride + head * p.dtb_head_stride;
  const float A = __ldg(p.A + head);
  float dt[kEntriesPerLane], prefix[kEntriesPerLane];
#pragma unroll
  for (int h = 0; h < kEntriesPerLane; ++h) {
    const int j = lane + 32 * h;
    dt[h] = j < w ? dt_buf[j] : (j == w ? dt_now : 0.0f);
  }
  float carry = 0.0f;
#pragma unroll
  for (int h = 0; h < kEntriesPerLane; ++h) {
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
#pragma unroll
  for (int h = 0; h < kEntriesPerLane; ++h) {
    const int j = lane + 32 * h;
    if (j <= w) sm.wgt[j] = dt[h] * expf(total - A * prefix[h]);
  }
  if (lane == 0) *sm.decay = expf(total);
}

// B_j . C for the window entries 0..w, once per CTA: a group of N/8 lanes per entry (one 16-byte
// vector of B each, coalesced), the groups splitting the entries, all loads issued before any sum.
template <int kN, DType kAct, class Smem>
__device__ __forceinline__ void window_dots(const typename Storage<kAct>::type* B_window, int64_t entry_stride,
                                            const typename Storage<kAct>::type* B_now,
                                            const typename Storage<kAct>::type* C_now, int w, const Smem& sm) {
  constexpr int kLanes = kN / 8;
  constexpr int kGroups = kThreads / kLanes;
  constexpr int kRounds = (kMamba2MaxBufferLen + kGroups - 1) / kGroups;
  const int lane = threadIdx.x % kLanes;
  const int first = threadIdx.x / kLanes;
  float c[8];
  load_act_n<kAct, 8>(C_now, lane * 8, c);
  uint4 raw[kRounds];
#pragma unroll
  for (int k = 0; k < kRounds; ++k) {
    const int j = first + k * kGroups;
    if (j <= w) raw[k] = Chunk16<kAct>::load(j < w ? B_window + j * entry_stride : B_now, lane * 8);
  }
#pragma unroll
  for (int k = 0; k < kRounds; ++k) {
    const int j = first + k * kGroups;
    if (k * kGroups > w) break;  // no group has an entry in this round or later ones (CTA-uniform)
    float b[8];
    Chunk16<kAct>::to_float(raw[k], b);
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) d += b[i] * c[i];
    d = row_sum<kLanes>(d);
    if (lane == 0 && j <= w) sm.dots[j] = d;
  }
}

// Output row p of the step: y + D x, times silu(z) when gated.
template <DType kAct>
__device__ __forceinline__ void store_output(const Mamba2Params& p, int row, int head, int pr, float y, float x,
                                             float z) {
  if (p.D != nullptr) y += __ldg(p.D + head) * x;
  if (p.z != nullptr) y *= silu(z);
  store_act<kAct>(p.out, row * p.out_row_stride + head * p.out_head_stride + pr, y);
}

template <int kP, int kN, DType kSrc>
struct StepOccupancy {
  // CTAs of 256 threads per SM the register budget must allow: enough state in flight per SM to
  // cover DRAM latency. A thread holds its whole share of the replay source in registers (4 per
  // 16-byte chunk); past 40 of those, two CTAs per SM already keep 128 KB in flight.
  static constexpr int kSourceRegs = 4 * ChunkTile<kP, kN, kSrc>::kPasses;
  static constexpr int kMinBlocks = kSourceRegs > 40 ? 2 : (kSrc == DType::kFloat32 ? 3 : 4);
};

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct>
__global__ void __launch_bounds__(kThreads, StepOccupancy<kP, kN, kCopy ? kRead : kCkpt>::kMinBlocks)
step_kernel(const Mamba2Params p) {
  using Act = typename Storage<kAct>::type;
  constexpr DType kSrc = kCopy ? kRead : kCkpt;  // what a replay step reads
  using Tile = ChunkTile<kP, kN, kSrc>;
  using Src = Chunk16<kSrc>;
  constexpr int E = Tile::kElems;
  constexpr int R = Tile::kPasses;
  extern __shared__ __align__(16) unsigned char smem_base[];

  const int head = blockIdx.x;
  const int row = blockIdx.y;
  const int64_t slot = resolve_slot(p, row);
  if (slot < 0) {
    write_zero_output<kAct>(p, row, head);
    return;
  }
  const int tid = threadIdx.x;
  const int heads_per_group = p.heads / p.groups;
  const int group = head / heads_per_group;

  // ---- everything that does not depend on the cursor, issued before it is known ----
  const void* src = kCopy ? p.read_copy : p.checkpoint;
  const int64_t src_tile = kCopy ? slot * p.rc_slot_stride + head * p.rc_head_stride
                                 : slot * p.ck_slot_stride + head * p.ck_head_stride;
  const int64_t src_row_stride = kCopy ? p.rc_row_stride : p.ck_row_stride;
  uint4 raw[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (Tile::valid(r)) raw[r] = Src::load(src, src_tile + Tile::row(r) * src_row_stride + Tile::col0());
  }
  const int w = p.num_committed[slot] & kCursorMask;
  const Act* x_now = static_cast<const Act*>(p.x) + row * p.x_row_stride + head * p.x_head_stride;
  const Act* B_now = static_cast<const Act*>(p.B) + row * p.B_row_stride + group * p.B_group_stride;
  const Act* C_now = static_cast<const Act*>(p.C) + row * p.C_row_stride + group * p.C_group_stride;
  float c[E];
  load_act_n<kAct, E>(C_now, Tile::col0(), c);
  // Thread p < P owns output row p: its x, z and (fp8) row scale, loaded coalesced.
  const bool row_owner = tid < kP;
  Act x_raw{};
  float z_p = 0.0f, scale_p = 1.0f;
  if (row_owner) {
    x_raw = x_now[tid];
    if (p.z != nullptr) z_p = load_act<kAct>(p.z, row * p.z_row_stride + head * p.z_head_stride + tid);
    if constexpr (kSrc == DType::kFloat8E4M3) {
      scale_p = __ldg(p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride + tid);
    }
  }
  const float x_p = to_float(x_raw);
  const float dt_now = tid < 32 ? load_dt(p, row, head) : 0.0f;  // warp 0 derives the window scalars

  const int L = p.buffer_len;
  if (w >= L) {  // a cursor with no room: touch nothing
    write_zero_output<kAct>(p, row, head);
    return;
  }
  const bool fold = w + 1 + p.max_draft_tokens > L;
  const StepSmem<kP, kN, kAct> sm(smem_base, L);
  const Act* x_buf = static_cast<const Act*>(p.x_buf) + slot * p.xb_slot_stride + head * p.xb_head_stride;
  const Act* B_buf = static_cast<const Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride;
  stage_rows<kP>(sm.x, x_buf, p.xb_entry_stride, x_now, w);
  if (tid < 32) window_scalars(p, slot, head, w, dt_now, sm);

  if (!fold) {
    // y_p = e^{Lambda_w} s_p (S_read C)_p + sum_{j<=w} wgt_j (B_j . C) x_j[p] + D x_p
    window_dots<kN, kAct>(B_buf, p.Bb_entry_stride, B_now, C_now, w, sm);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v[E];
      Src::to_float(raw[r], v);
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < E; ++i) d += v[i] * c[i];
      d = row_sum<Tile::kLanesPerRow>(d);
      if (Tile::lane_in_row() == 0 && Tile::valid(r)) sm.ydot[Tile::row(r)] = d;
    }
    cp_async_wait_all();
    __syncthreads();

    if (row_owner) {
      float y = *sm.decay * scale_p * sm.ydot[tid];
      for (int j = 0; j <= w; ++j) y += sm.wgt[j] * sm.dots[j] * to_float(sm.x[j * kP + tid]);
      store_output<kAct>(p, row, head, tid, y, x_p, z_p);
      // Append the current token as entry w.
      static_cast<Act*>(p.x_buf)[slot * p.xb_slot_stride + head * p.xb_head_stride + w * p.xb_entry_stride + tid] = x_raw;
    }
    if (tid == 0) p.dt_buf[slot * p.dtb_slot_stride + head * p.dtb_head_stride + w] = dt_now;
    if (head % heads_per_group == 0 && tid < kN / 8) {  // B once per group, by the group's first head
      Act* B_dst = static_cast<Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride + w * p.Bb_entry_stride;
      reinterpret_cast<uint4*>(B_dst)[tid] = reinterpret_cast<const uint4*>(B_now)[tid];
    }
  } else {
    // Fold: S = e^{Lambda_w} S_c + sum_{j<=w} (wgt_j x_j) (outer) B_j in fp32 FFMA, 4 columns per
    // thread (TileShape), rows in batches so the fp32 state of a batch stays in registers.
    using Shape = TileShape<kP, kN>;
    using V = Vec4<kCkpt>;
    constexpr int RF = Shape::kRowsPerThread;
    // The replay source already holds the checkpoint in this layout when it is the fp32 checkpoint.
    constexpr bool kReuse = !kCopy && kCkpt == DType::kFloat32;
    constexpr int kBatch = kReuse ? RF : (RF > 4 ? 4 : RF);
    const int64_t tile = slot * p.ck_slot_stride + head * p.ck_head_stride;
    const int col0 = Shape::col0();
    stage_rows<kN>(sm.B, B_buf, p.Bb_entry_stride, B_now, w);
    float c4[4];
    load_act4<kAct>(C_now, col0, c4);
    cp_async_wait_all();
    __syncthreads();
    const float decay = *sm.decay;

#pragma unroll
    for (int r0 = 0; r0 < RF; r0 += kBatch) {
      constexpr int kB = kBatch;
      float s[kB][4];
#pragma unroll
      for (int rb = 0; rb < kB; ++rb) {
        const int r = r0 + rb;
        if (r >= RF) break;
        if constexpr (kReuse) {
          s[rb][0] = __uint_as_float(raw[r].x);
          s[rb][1] = __uint_as_float(raw[r].y);
          s[rb][2] = __uint_as_float(raw[r].z);
          s[rb][3] = __uint_as_float(raw[r].w);
        } else {
          V::to_float(V::load(p.checkpoint, tile + Shape::row(r) * p.ck_row_stride + col0), s[rb]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) s[rb][i] *= decay;
      }
      for (int j = 0; j <= w; ++j) {
        const float wj = sm.wgt[j];
        float b[4];
        Vec4<kAct>::to_float(*reinterpret_cast<const typename Vec4<kAct>::Raw*>(sm.B + j * kN + col0), b);
#pragma unroll
        for (int rb = 0; rb < kB; ++rb) {
          if (r0 + rb >= RF) break;
          const float coef = wj * to_float(sm.x[j * kP + Shape::row(r0 + rb)]);
#pragma unroll
          for (int i = 0; i < 4; ++i) s[rb][i] += coef * b[i];
        }
      }
#pragma unroll
      for (int rb = 0; rb < kB; ++rb) {
        const int r = r0 + rb;
        if (r >= RF) break;
        const int pr = Shape::row(r);
        float y = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) y += s[rb][i] * c4[i];
        V::store(p.checkpoint, tile + pr * p.ck_row_stride + col0, s[rb]);
        if constexpr (kCopy) {
          // The read copy is made from the checkpoint as stored, exactly like make_read_copy.
          float v[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) v[i] = V::round_trip(s[rb][i]);
          const int64_t rc = slot * p.rc_slot_stride + head * p.rc_head_stride + pr * p.rc_row_stride + col0;
          if constexpr (kRead == DType::kFloat8E4M3) {
            float amax = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i) amax = max_keep_nan(amax, fabsf(v[i]));
            amax = row_max_keep_nan<Shape::kLanesPerRow>(amax);
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
        y = row_sum<Shape::kLanesPerRow>(y);
        if (Shape::lane_in_row() == 0) sm.ydot[pr] = y;
      }
    }
    __syncthreads();
    if (row_owner) store_output<kAct>(p, row, head, tid, sm.ydot[tid], x_p, z_p);
  }

  // Every thread read the cursor before the first barrier; the last of the slot's H CTAs moves it.
  if (tid == 0) {
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
