// Mamba-2 fold for commit, flush and materialize: a persistent grid of 256-thread CTAs over the
// (row, head) items of the rows that fold (fold_kernel says why).
//
// With n committed entries to fold (commit: the cursor after accepting; flush and materialize: the
// cursor), Lambda_j = A sum_{i<=j} dt_i and wgt_j = dt_j exp(Lambda_{n-1} - Lambda_j):
//   S = e^{Lambda_{n-1}} S_c + sum_{j<n} (wgt_j x_j) (outer) B_j
// computed exactly as the step kernel's fold at 559725d (mamba2_step_kernel.cuh): the same tile (a
// state row over N/4 lanes, 4 elements each), s *= decay, then per entry s += (wgt_j * x_j[p]) * B_j[n]
// in fp32 FFMA in entry order, the read copy made from the checkpoint as stored, like make_read_copy.
// An fp32 checkpoint therefore stays at fp32 rounding however many folds it sees.
//
// Commit: a row folds when cursor + accepted + max_draft_tokens > L (the flush-early rule); only the
// folding rows' items are taken. Flush: the rows with committed entries; materialize: every row
// (zeros for pads and out-of-range cursors). No CTA writes a cursor here (the heads of a slot all
// read it): launch_mamba2_fold runs the cursor kernel after this one, which also advances the
// stochastic-rounding offset when there is one (stochastic_rounding.cuh).
#pragma once

#include "mamba2_spec_common.cuh"
#include "stochastic_rounding.cuh"

namespace replayssm {
namespace mamba2_spec {

// The fold's tile, as in the step kernel: a state row covered by N/4 consecutive lanes.
template <int kP, int kN>
struct FoldTile {
  static constexpr int kLanesPerRow = kN / 4;
  static constexpr int kRowsPerPass = kThreads / kLanesPerRow;
  static constexpr int kRowsPerThread = kP / kRowsPerPass;
  static_assert(kN == 64 || kN == 128, "state_dim must be 64 or 128");
  static_assert(kP % kRowsPerPass == 0, "head_dim must be a multiple of the rows one pass covers");

  __device__ static int lane_in_row() { return threadIdx.x % kLanesPerRow; }
  __device__ static int first_row() { return threadIdx.x / kLanesPerRow; }
  __device__ static int row(int r) { return first_row() + r * kRowsPerPass; }
  __device__ static int col0() { return lane_in_row() * 4; }
};

// Shared memory of a fold: the x and B rows of the entries folded, staged once.
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

template <int kElems, class Act>
__device__ __forceinline__ void stage_entries(Act* dst, const Act* buffer, int64_t entry_stride, int count) {
  constexpr int kPerChunk = 16 / sizeof(Act);
  constexpr int kChunks = kElems / kPerChunk;
  static_assert(kElems % kPerChunk == 0, "rows must be whole 16-byte chunks");
  const int total = count * kChunks;
  for (int i = threadIdx.x; i < total; i += kThreads) {
    const int j = i / kChunks;
    const int c = (i - j * kChunks) * kPerChunk;
    cp_async16(dst + j * kElems + c, buffer + j * entry_stride + c);
  }
}

// The fold's per-entry scalars, held by the lanes of every warp: lane l holds entries l and l + 32.
struct FoldScalars {
  float wgt[kMamba2SpecMaxBufferLen / 32];  // dt_j exp(Lambda_{n-1} - Lambda_j), 0 from n on
  float decay;                              // exp(Lambda_{n-1}); 1 when n == 0

  __device__ float weight(int j) const {
    const float lo = __shfl_sync(kFullMask, wgt[0], j & 31);
    const float hi = __shfl_sync(kFullMask, wgt[1], j & 31);
    return j < 32 ? lo : hi;
  }
};

// The step kernel's window_scalars with the window = the n buffered entries (no current token).
__device__ __forceinline__ FoldScalars fold_scalars(const Mamba2SpecParams& p, int64_t slot, int head, int n) {
  constexpr int kPerLane = kMamba2SpecMaxBufferLen / 32;
  const int lane = threadIdx.x & 31;
  const float* dt_buf = p.dt_buf + slot * p.dtb_slot_stride + head * p.dtb_head_stride;
  const float A = __ldg(p.A + head);
  float dt[kPerLane], prefix[kPerLane];
  float carry = 0.0f;
#pragma unroll
  for (int h = 0; h < kPerLane; ++h) {
    const int j = lane + 32 * h;
    dt[h] = j < n ? __ldg(dt_buf + j) : 0.0f;
    const float v = warp_inclusive_sum(dt[h]);
    prefix[h] = v + carry;
    carry += __shfl_sync(kFullMask, v, 31);
  }
  const int last = n > 0 ? n - 1 : 0;
  const float at_last = __shfl_sync(kFullMask, last < 32 ? prefix[0] : prefix[1], last & 31);
  const float total = n > 0 ? A * at_last : 0.0f;
  FoldScalars fs;
#pragma unroll
  for (int h = 0; h < kPerLane; ++h) {
    const int j = lane + 32 * h;
    fs.wgt[h] = j < n ? dt[h] * expf(total - A * prefix[h]) : 0.0f;
  }
  fs.decay = expf(total);
  return fs;
}

// Entries to fold for this row's slot, or -1 when the CTA has nothing to do.
__device__ __forceinline__ int entries_to_fold(const Mamba2SpecParams& p, int64_t row, int w) {
  const int L = p.buffer_len;
  if (w < 0 || w > L) return -1;
  switch (p.mode) {
    case Mamba2FoldMode::kCommit: {
      const int64_t accepted = load_index(p.num_accepted, p.num_accepted_dtype, row, p.num_accepted_stride);
      const int64_t moved = accepted < 0 ? 0 : (accepted > L - w ? L - w : accepted);
      const int n = w + static_cast<int>(moved);
      return n + p.max_draft_tokens > L ? n : -1;
    }
    case Mamba2FoldMode::kFlush: return w > 0 ? w : -1;
    default: return w;
  }
}

template <int kP, int kN>
__device__ __forceinline__ void write_zero_state(const Mamba2SpecParams& p, int64_t row, int head) {
  using Tile = FoldTile<kP, kN>;
  float* out = p.state_out + row * p.so_row_stride + head * p.so_head_stride;
#pragma unroll
  for (int r = 0; r < Tile::kRowsPerThread; ++r) {
    *reinterpret_cast<float4*>(out + Tile::row(r) * p.so_p_stride + Tile::col0()) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// Asks for the cache line holding `p` in L2; nothing waits for it.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// L2 prefetch of `rows` rows of `row_bytes` bytes, `stride_bytes` apart, by the CTA's threads: the next
// head's checkpoint tile, x entries and dt while this head folds, so its loads hit L2.
__device__ __forceinline__ void prefetch_rows_l2(const void* base, int rows, int row_bytes, int64_t stride_bytes) {
  const int lines = row_bytes / 128 + 1;  // the row's first byte, every 128 bytes, and its last byte
  for (int k = threadIdx.x; k < rows * lines; k += kThreads) {
    const int r = k / lines;
    const int l = k - r * lines;
    const int off = l * 128 < row_bytes ? l * 128 : row_bytes - 1;
    prefetch_l2(static_cast<const unsigned char*>(base) + r * stride_bytes + off);
  }
}

// The rows of one chunk (kThreads consecutive batch rows) that have something to fold, in row order,
// as every CTA finds them: thread t decides row chunk + t.
struct FoldRow {
  int64_t slot;  // -1: write a zero state (materialize of a pad row or an out-of-range cursor)
  int32_t row;
  int32_t n;     // entries to fold
};

// A persistent grid (as many CTAs as fit on the GPU) over the (row, head) items of the rows that fold:
// commit folds few rows per call (about 1 in 5 at T = 4, L = 16), and a grid of one CTA per (row, head)
// spent most of its time on CTAs that read two integers and left, holding the SM slots the folding
// CTAs needed. Every CTA finds the folding rows of a chunk of rows itself (cursors and accepted counts
// are L2-hot after the first), then takes every gridDim.x-th item of the chunk, the next one's
// checkpoint tile requested into L2 while it folds the current one.
// kRound: stochastic rounding of a 16-bit checkpoint's stores (p.rounding_seed); false compiles to the
// kernel as it was before rounding existed.
template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kRound>
__global__ void __launch_bounds__(kThreads, 2) fold_kernel(const Mamba2SpecParams p) {
  static_assert(!kRound || kCkpt != DType::kFloat32, "stochastic rounding is for 16-bit checkpoints");
  using Tile = FoldTile<kP, kN>;
  using V = Vec4<kCkpt>;
  using Act = typename Storage<kAct>::type;
  constexpr int R = Tile::kRowsPerThread;
  constexpr int kLanes = Tile::kLanesPerRow;
  constexpr int kCkBytes = dtype_size(kCkpt);
  constexpr int kWarps = kThreads / 32;
  extern __shared__ __align__(16) unsigned char smem_base[];
  __shared__ FoldRow rows[kThreads];
  __shared__ int warp_counts[kWarps];

  const bool materialize = p.mode == Mamba2FoldMode::kMaterialize;
  const FoldSmem<kP, kN, kAct> sm(smem_base, p.buffer_len);
  const int col0 = Tile::col0();
  const int tid = threadIdx.x;
  const int64_t grid = gridDim.x;
  int64_t items_before = 0;  // items of the earlier chunks: this CTA takes the items k with k % grid == blockIdx.x

  for (int64_t chunk = 0; chunk < p.batch; chunk += kThreads) {
    // ---- the chunk's folding rows, compacted in row order ----
    const int64_t row = chunk + tid;
    int64_t slot = -1;
    int n = -1;
    if (row < p.batch) {
      slot = resolve_slot(p, row);
      if (slot >= 0) n = entries_to_fold(p, row, p.num_committed[slot]);
    }
    const bool item = row < p.batch && (materialize || n >= 0);
    const unsigned ballot = __ballot_sync(kFullMask, item);
    __syncthreads();  // the previous chunk's readers of rows[] are done
    if ((tid & 31) == 0) warp_counts[tid / 32] = __popc(ballot);
    __syncthreads();
    int before = __popc(ballot & ((1u << (tid & 31)) - 1u));
    int count = 0;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) {
      if (k < tid / 32) before += warp_counts[k];
      count += warp_counts[k];
    }
    if (item) rows[before] = FoldRow{n >= 0 ? slot : -1, static_cast<int32_t>(row), n};
    __syncthreads();

    const int64_t items = static_cast<int64_t>(count) * p.heads;
    auto tile_of = [&](const FoldRow& fr, int head) { return fr.slot * p.ck_slot_stride + head * p.ck_head_stride; };
    for (int64_t k = ((blockIdx.x - items_before) % grid + grid) % grid; k < items; k += grid) {
      const FoldRow fr = rows[k / p.heads];
      const int head = static_cast<int>(k % p.heads);
      if (fr.slot < 0) {  // materialize only
        write_zero_state<kP, kN>(p, fr.row, head);
        continue;
      }
      const int64_t tile = tile_of(fr, head);
      typename V::Raw ck[R];
#pragma unroll
      for (int r = 0; r < R; ++r) ck[r] = V::load(p.checkpoint, tile + Tile::row(r) * p.ck_row_stride + col0);
      if (k + grid < items) {  // this CTA's next item of the chunk
        const FoldRow& next = rows[(k + grid) / p.heads];
        if (next.slot >= 0) {
          prefetch_rows_l2(static_cast<const unsigned char*>(p.checkpoint) +
                               tile_of(next, static_cast<int>((k + grid) % p.heads)) * kCkBytes,
                           kP, kN * kCkBytes, p.ck_row_stride * kCkBytes);
        }
      }
      const int n_fold = fr.n;
      const int group = head / (p.heads / p.groups);
      const Act* x_buf = static_cast<const Act*>(p.x_buf) + fr.slot * p.xb_slot_stride + head * p.xb_head_stride;
      const Act* B_buf = static_cast<const Act*>(p.B_buf) + fr.slot * p.Bb_slot_stride + group * p.Bb_group_stride;
      __syncthreads();  // the previous item's readers of shared memory are done
      stage_entries<kP>(sm.x, x_buf, p.xb_entry_stride, n_fold);
      stage_entries<kN>(sm.B, B_buf, p.Bb_entry_stride, n_fold);
      const FoldScalars fs = fold_scalars(p, fr.slot, head, n_fold);
      cp_async_wait_all();
      __syncthreads();

      float s[R][4];
#pragma unroll
      for (int r = 0; r < R; ++r) V::to_float(ck[r], s[r]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int q = 0; q < 4; ++q) s[r][q] *= fs.decay;
      }
      for (int j = 0; j < n_fold; ++j) {
        const float wj = fs.weight(j);
        float b[4];
        Vec4<kAct>::to_float(*reinterpret_cast<const typename Vec4<kAct>::Raw*>(sm.B + j * kN + col0), b);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float coef = wj * to_float(sm.x[j * kP + Tile::row(r)]);
#pragma unroll
          for (int q = 0; q < 4; ++q) s[r][q] += coef * b[q];
        }
      }

      if (materialize) {
        float* out = p.state_out + fr.row * p.so_row_stride + head * p.so_head_stride;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          *reinterpret_cast<float4*>(out + Tile::row(r) * p.so_p_stride + col0) =
              make_float4(s[r][0], s[r][1], s[r][2], s[r][3]);
        }
        continue;
      }
      RoundingKey key{};
      RoundingWords words;
      if constexpr (kRound) key = RoundingKey::load(p.rounding_seed);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int pr = Tile::row(r);
        if constexpr (kRound) {  // the read copy below is then made from the stochastically rounded value
          uint32_t w[2];
          words.get<R>(key, fr.slot, head, r, [](int k) { return Tile::row(k); }, col0, w);
          stochastic_round4<kCkpt>(s[r], w);
        }
        V::store(p.checkpoint, tile + pr * p.ck_row_stride + col0, s[r]);
        if constexpr (kCopy) {
          // The read copy is made from the checkpoint as stored, exactly like make_read_copy.
          float v[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) v[q] = V::round_trip(s[r][q]);
          const int64_t rc = fr.slot * p.rc_slot_stride + head * p.rc_head_stride + pr * p.rc_row_stride + col0;
          if constexpr (kRead == DType::kFloat8E4M3) {
            float amax = 0.0f;
#pragma unroll
            for (int q = 0; q < 4; ++q) amax = max_keep_nan(amax, fabsf(v[q]));
            amax = row_max_keep_nan<kLanes>(amax);
            const bool nonzero = amax > 0.0f;
            const float inv = nonzero ? __fdiv_rn(kFp8E4M3Max, amax) : 1.0f;
#pragma unroll
            for (int q = 0; q < 4; ++q) v[q] = clamp_keep_nan(__fmul_rn(v[q], inv), -kFp8E4M3Max, kFp8E4M3Max);
            if (Tile::lane_in_row() == 0) {
              p.read_scale[fr.slot * p.rs_slot_stride + head * p.rs_head_stride + pr] =
                  nonzero ? __fdiv_rn(amax, kFp8E4M3Max) : 1.0f;
            }
          }
          Vec4<kRead>::store(p.read_copy, rc, v);
        }
      }
    }
    items_before += items;
  }
}

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kRound>
cudaError_t launch_fold_kernel(const Mamba2SpecParams& p, cudaStream_t stream) {
  auto kernel = fold_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, kRound>;
  const size_t smem = FoldSmem<kP, kN, kAct>::bytes(p.buffer_len);  // <= 32 KiB at L = 64
  int device = 0, sms = 0, ctas_per_sm = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kThreads, smem);
  if (err != cudaSuccess) return err;
  // One wave of persistent CTAs, never more than there are (row, head) items.
  const int64_t items = static_cast<int64_t>(p.batch) * p.heads;
  const int64_t wave = static_cast<int64_t>(sms) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  kernel<<<static_cast<unsigned>(items < wave ? items : wave), kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct>
cudaError_t launch_fold(const Mamba2SpecParams& p, cudaStream_t stream) {
  if constexpr (kCkpt != DType::kFloat32) {
    if (p.rounding_seed != nullptr) return launch_fold_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, true>(p, stream);
  }
  return launch_fold_kernel<kP, kN, kCkpt, kCopy, kRead, kAct, false>(p, stream);
}

template <int kP, int kN, DType kAct>
cudaError_t dispatch_fold_state(const Mamba2SpecParams& p, cudaStream_t stream) {
  const bool copy = p.read_copy != nullptr;
  const DType ck = p.checkpoint_dtype, rc = p.read_copy_dtype;
#define REPLAYSSM_FOLD_CASE(CKPT, COPY, READ)                              \
  if (ck == DType::CKPT && copy == COPY && (!COPY || rc == DType::READ)) \
    return launch_fold<kP, kN, DType::CKPT, COPY, DType::READ, kAct>(p, stream);
  REPLAYSSM_FOLD_CASE(kFloat32, false, kFloat32)
  REPLAYSSM_FOLD_CASE(kFloat32, true, kBFloat16)
  REPLAYSSM_FOLD_CASE(kFloat32, true, kFloat16)
  REPLAYSSM_FOLD_CASE(kFloat32, true, kFloat8E4M3)
  REPLAYSSM_FOLD_CASE(kBFloat16, false, kBFloat16)
  REPLAYSSM_FOLD_CASE(kBFloat16, true, kFloat8E4M3)
  REPLAYSSM_FOLD_CASE(kFloat16, false, kFloat16)
  REPLAYSSM_FOLD_CASE(kFloat16, true, kFloat8E4M3)
#undef REPLAYSSM_FOLD_CASE
  return cudaErrorInvalidValue;
}

// All dtype combinations of one (P, N); instantiated once per shape file.
template <int kP, int kN>
cudaError_t launch_fold_shape(const Mamba2SpecParams& p, cudaStream_t stream) {
  if (p.act_dtype == DType::kBFloat16) return dispatch_fold_state<kP, kN, DType::kBFloat16>(p, stream);
  if (p.act_dtype == DType::kFloat16) return dispatch_fold_state<kP, kN, DType::kFloat16>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace mamba2_spec
}  // namespace replayssm
