// ReplaySSM Mamba-2 step (T=1), one launch per decode step. One CTA of 256 threads per (batch row,
// group, block of the group's heads); it takes its heads one after the other.
//
// Let w = num_committed[slot] buffered tokens precede the current one (entry w), Lambda_j =
// A * sum_{i<=j} dt_i and wgt_j = dt_j exp(Lambda_w - Lambda_j).
//   replay step (the buffer still has room after this token):
//     y = e^{Lambda_w} (S_read C) + sum_{j<=w} wgt_j (B_j . C) x_j + D x;   append x, B, dt at entry w
//     reads the read copy (or the checkpoint) once; writes nothing of the state.
//   fold step (w + 1 + max_draft_tokens > L; the same for all heads of a CTA, they share the slot):
//     S = e^{Lambda_w} S_c + sum_{j<=w} (wgt_j x_j) (outer) B_j;  y = S C + D x;  write S and its read copy
//     reads the checkpoint once and writes it once, like the conventional update, plus the copy.
//
// Latency and instruction count, not arithmetic, decide the replay step: it streams half the bytes
// of the conventional update or less, so whatever a CTA does besides loading state shows. Hence:
//   - a ring of S source tiles (read copy or checkpoint, S = 2..8, ~64 KB) filled by bulk copies
//     (TMA) on one mbarrier per stage, the first S issued before the cursor is known, a stage refilled
//     right after the per-head barrier that ends its use: loads never wait for the cursor;
//   - what only depends on the group is done once per CTA (B_j . C by lane groups splitting the
//     entries); the x windows are staged two heads ahead (cp.async, three buffers; the tensor-core
//     replay instead has one per ring stage, filled by bulk copies with the stage's tile) and the
//     window weights one head ahead by the last warp, so no warp arrives late at the per-head barrier;
//   - per head, each thread reduces its 16-byte chunks of the tile against C (4 fp32, 8 bf16/fp16,
//     16 fp8 elements) into shared memory, one barrier, then the first warps finish the output rows
//     (two threads per row where P <= 112) and store them coalesced. That is the CUDA-core replay (a
//     16-bit copy of the other 16-bit type than the activations; the fp32 checkpoint with
//     REPLAYSSM_STEP_TF32_REPLAY=0); the others run the warp-specialised tensor-core replay
//     (TensorReplay below): fp8 and same-type 16-bit copies, and by default the fp32 checkpoint without
//     a copy, in tf32 pairs (kTf32Replay; session 27: faster at every batch 1-512).
// docs/TUNING.md has the launch rules and what they measured; docs/EXPERIMENTS.md what was tried and lost.
//
// The cursor of a slot is shared by the slot's CTAs (H / heads-per-CTA of them), so none may change
// it before all have read it: each CTA adds a ticket (1 << 16) to num_committed[slot] after all its
// threads have read it (a replaying CTA early, a folding one at its end), and the CTA that draws
// the last ticket writes the new cursor, which also clears the tickets.
// Nothing crosses launches.
//
// With a staggered flush (the caller's staggered_flush hint) and a read copy, a one-CTA launch before
// the step (mamba2_step_order.cu) may list the rows whose slot folds first, and CTA row y takes the
// row it lists (kOrdered): folding CTAs last several replay CTAs, and started late they end the step.
// Where all CTAs fit in one wave, the launcher may instead split the folds (choose_fold_split): the pass
// marks the first folding rows, whose CTAs take a part of the replay-sized block each, the other parts
// by helper rows at the top of the grid, so that the few folds of a staggered step run in parallel.
//
// This header holds the kernel template; mamba2_step_p<P>_n<N>.cu instantiate it per shape (so the
// shapes compile in parallel) and mamba2_step.cu picks the shape at run time.
#pragma once

#include <type_traits>

#include "common/bulk_copy.cuh"
#include "diag/cta_timeline.cuh"
#include "families/mamba2/fold.cuh"
#include "families/mamba2/params.h"
#include "families/mamba2/tensor_dot.cuh"
#include "families/mamba2/tile.cuh"
#include "common/stochastic_rounding.cuh"

namespace replayssm {
namespace mamba2 {

constexpr unsigned kFullMask = 0xffffffffu;

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

// Warp roles of the tensor-core replay (replay_on_tensor_cores, or kTf32Replay): the first kConsumers warps each own
// kTilesPerWarp tiles of 16 output rows (reduction on tensor cores, their rows' x windows, epilogue);
// one thread of warp 6 refills the ring; warp 7 derives the window weights; the first warp after the
// consumers takes the cursor ticket (the producer's thread where that warp has a role). No CTA barrier
// per head: each hand-over is an mbarrier (tile landed / consumed, weights written / read), so a
// consumer warp waits only for its own inputs, never for the slowest warp of the CTA.
//
// kSplitEpilogue (where the warps between the consumers and the producer's have a thread per row: P =
// 64, warps 4 and 5): the consumers only reduce the tile (S C) into shared memory, double-buffered by
// head parity (head dots, published on dots_ready, handed back on dots_free), and those warps take the
// window sum and the epilogue, a thread per row, so that the two halves of consecutive heads overlap
// instead of following each other in one warp. Why: a diagnostic build that switched parts of the
// per-head work off (session 18, run 4) took the fp8 step 12% faster without the consumers' dot, 13%
// without their window sum and epilogue, 18% without both, while the producer alone streamed at 85-95%
// of copy. Measured (run 7, super120b): fp8 step -3.2% / -3.8% / -3.9% at batch 256 / 512 / 64, fp8
// cycle -1.8% / -2.5% / -2.7%. After it the consumers' dot is the larger half (run 9: -8.6% without it,
// -3.8% without the epilogue warps' window sum).
template <int kP>
struct TensorReplay {
  static constexpr int kMTiles = kP / 16;
  static constexpr int kTilesPerWarp = kMTiles > 6 ? 2 : 1;
  static constexpr int kConsumers = kMTiles / kTilesPerWarp;
  static constexpr int kRowsPerWarp = 16 * kTilesPerWarp;
  static constexpr int kProducerThread = kThreads - 64;
  static constexpr bool kSplitEpilogue = kTilesPerWarp == 1 && (kProducerThread / 32 - kConsumers) * 32 >= kP;
  static constexpr int kEpilogueWarps = kSplitEpilogue ? (kP + 31) / 32 : 0;
  // The warps that read a stage's x window and the window weights: the epilogue's.
  static constexpr int kWindowReaders = kSplitEpilogue ? kEpilogueWarps : kConsumers;
  // The CTA's cursor ticket (see take_ticket): the first warp without tiles, or the producer's thread
  // (where every warp before it has a part in the replay).
  static constexpr int kTicketThread = kConsumers < 6 && !kSplitEpilogue ? 32 * kConsumers : kProducerThread;
  static_assert(kP % 16 == 0 && kMTiles % kTilesPerWarp == 0 && kConsumers <= 6, "P: a multiple of 16, <= 192");
};

// ---- Shared memory of a step CTA ---------------------------------------------------------------
// A ring of replay-source tiles fed by bulk copies (TMA), x windows, and the small per-head arrays,
// double-buffered by head parity so that head i+1's reductions may start while head i's epilogue
// still reads head i's. The CUDA-core replay stages three x windows with cp.async (the replay reads
// one, two are in flight); the tensor-core replay has one x window per ring stage, filled by bulk
// copies next to the stage's tile (its own barrier, x_full), so its consumer warps never stage
// anything. The fold uses the x-window area differently: its coefficient buffer (wgt_j x_j[row] in
// fp32, see FoldCoef) and its B window. At P = 64 that is 2 KB less than three x windows plus a B
// window, which is what lets three CTAs share an SM for every P = 64 source type.
// kTf32Replay: an fp32 source (the checkpoint, no read copy) replayed on tensor cores in tf32 pairs
// (TensorDot) by the warp-specialised kernel instead of the CUDA-core one: the default, and
// REPLAYSSM_STEP_TF32_REPLAY=0 keeps the CUDA-core kernel (step_tf32_replay in mamba2_tile.cuh).
template <int kP, int kN, DType kSrc, DType kAct, bool kTf32Replay = false>
struct StepLayout {
  static_assert(!kTf32Replay || kSrc == DType::kFloat32, "the tf32 replay reads an fp32 source");
  using Act = typename Storage<kAct>::type;
  static constexpr int kTileBytes = kP * kN * dtype_size(kSrc);
  // The tensor-core replay also has a barrier per stage for "tile consumed" and one for "x window
  // landed", and two pairs for the window weights (written / read, double-buffered).
  static constexpr bool kTensorReplay = replay_on_tensor_cores(kSrc, kAct) || kTf32Replay;
  // kSplitEpilogue adds two pairs for the head dots (ready / free) and the head dots themselves.
  static constexpr bool kSplitEpilogue = kTensorReplay && TensorReplay<kP>::kSplitEpilogue;
  static constexpr size_t kBarrierOffset = 0;  // uint64_t[kStages] full, then (tensor) [kStages] empty, [2] + [2], [kStages] x_full, (split) [2] + [2]
  static constexpr size_t kDotsOffset = kTensorReplay ? 256 : 64;  // float[L_max]
  static constexpr size_t kWgtOffset = kDotsOffset + 4 * kMamba2MaxBufferLen;      // float[2][L_max]
  static constexpr size_t kDecayOffset = kWgtOffset + 2 * 4 * kMamba2MaxBufferLen;  // float[2]
  // The tensor-core replay with bf16 activations (kWindowMma) keeps its window weights as mma B
  // fragments (WindowMma, one head's per buffer) over the window dots and the float weights: its scalar
  // warp, the dots' only reader, holds them in registers (the space is full: at P = 64 three CTAs an SM
  // leave 128 bytes).
  // Not in the split epilogue of a bf16 copy: there it measured 0.3-0.8% slower than the FFMA form
  // (session 34, super120b), where the fp8 copy's step gained 3.4-5.4%.
  static constexpr bool kWindowMma =
      kTensorReplay && kAct == DType::kBFloat16 && (!kSplitEpilogue || kSrc == DType::kFloat8E4M3);
  static constexpr size_t kWfragOffset = kDotsOffset;  // uint16_t[2][WindowMma::kBytes / 2]
  static_assert(2 * WindowMma::kBytes <= kDecayOffset - kDotsOffset, "the weight fragments fit over dots and weights");
  static constexpr size_t kYdotOffset = kDecayOffset + 16;                          // float[2][P], then (split) float[2][P]
  // A two-group CTA (kTwoGroups, read copies only: heads_per_cta = 2 x the group's heads) keeps its
  // second group's window dots (float[L_max]) and C fragments (at most N words) here. Every tensor-core
  // layout has the area (768 bytes, no CTA per SM lost); the other kernels leave it unused.
  static constexpr size_t kGroup1Offset = kYdotOffset + (kSplitEpilogue ? 4 : 2) * 4 * kP;
  static constexpr size_t kGroup1Bytes = kTensorReplay ? 4 * kMamba2MaxBufferLen + 4 * kN : 0;
  static constexpr size_t kRingOffset = (kGroup1Offset + kGroup1Bytes + 127) / 128 * 128;

  __host__ __device__ static constexpr size_t x_window_bytes(int L) { return sizeof(Act) * static_cast<size_t>(L) * kP; }
  // The fold's B window holds elements of b_elem bytes: fp32 or the activation type (kFoldBFloat32).
  __host__ __device__ static constexpr size_t fold_bytes(int L, size_t b_elem) {
    return FoldCoef<kP, kN>::bytes(L) + b_elem * static_cast<size_t>(L) * kN;
  }
  __host__ __device__ static constexpr int windows(int stages) { return kTensorReplay ? stages : 3; }
  // Bytes of a CTA with `stages` ring stages: the ring, then the x windows or the fold's coefficients
  // and B window, whichever is larger.
  __host__ __device__ static constexpr size_t bytes_with(int stages, int L, size_t b_elem = sizeof(Act)) {
    return kRingOffset + static_cast<size_t>(stages) * kTileBytes +
           (windows(stages) * x_window_bytes(L) > fold_bytes(L, b_elem) ? windows(stages) * x_window_bytes(L)
                                                                        : fold_bytes(L, b_elem));
  }
  // Stages: as many as fit in about 64 KB of tiles, at least two; the step fold with a read copy
  // streams an fp32 checkpoint tile through the ring, which must hold one. Where three CTAs share an
  // SM with three x windows (L = 16; 228 KB per SM, 1 KB reserved per CTA), the tensor-core replay
  // gives up stages (not below that) until its per-stage x windows fit there too; where they do not
  // (P = 128), occupancy and so the register budget stay as they were.
  static constexpr int kMaxStages = kTileBytes >= 32 * 1024 ? 2 : (64 * 1024 / kTileBytes > 8 ? 8 : 64 * 1024 / kTileBytes);
  static constexpr int kMinStages = (kP * kN * 4 + kTileBytes - 1) / kTileBytes > 2 ? (kP * kN * 4 + kTileBytes - 1) / kTileBytes : 2;
  __host__ __device__ static constexpr bool three_ctas_fit(size_t cta_bytes) { return 3 * (cta_bytes + 1024) <= 228 * 1024; }
  __host__ __device__ static constexpr int choose_stages() {
    const size_t with_three_windows = kRingOffset + static_cast<size_t>(kMaxStages) * kTileBytes +
                                      (3 * x_window_bytes(16) > fold_bytes(16, sizeof(Act)) ? 3 * x_window_bytes(16)
                                                                                             : fold_bytes(16, sizeof(Act)));
    int s = kMaxStages;
    if (kTensorReplay && three_ctas_fit(with_three_windows)) {
      while (s > kMinStages && !three_ctas_fit(bytes_with(s, 16))) --s;
    }
    return s;
  }
  static constexpr int kStages = choose_stages();
  static constexpr int kWindows = windows(kStages);
  static constexpr size_t kXwinOffset = kRingOffset + static_cast<size_t>(kStages) * kTileBytes;
  static_assert((kTensorReplay ? 3 * kStages + 4 + (kSplitEpilogue ? 4 : 0) : kStages) * sizeof(uint64_t) <= kDotsOffset,
                "barriers fit before the scalars");

  // CTAs per SM that `bytes` of shared memory allow (228 KB per SM, 1 KB reserved per CTA), at most 3.
  __host__ __device__ static constexpr int ctas_for(size_t bytes) {
    const size_t ctas = 228 * 1024 / (bytes + 1024);
    return ctas > 3 ? 3 : (ctas < 1 ? 1 : static_cast<int>(ctas));
  }
  // The fold's B window in fp32, converted once per CTA as it is staged, wherever that costs no CTA per
  // SM at L = 16 and fits at the longest buffer: its inner loop then loads B as floats instead of
  // converting 4 activations per window entry and batch of rows (ncu, session 16: the nano4b fp8-copy
  // fold step issue-bound at 67% of its issue slots, the conversions ~6% of its instructions).
  static constexpr bool kFoldBFloat32 = ctas_for(bytes_with(kStages, 16, 4)) == ctas_for(bytes_with(kStages, 16)) &&
                                        bytes_with(kStages, kMamba2MaxBufferLen, 4) <= 227 * 1024;
  using FoldB = std::conditional_t<kFoldBFloat32, float, Act>;
  // The fold: coefficients, then its B window, in the x windows' area.
  __host__ __device__ static constexpr size_t B_window_offset(int L) { return kXwinOffset + FoldCoef<kP, kN>::bytes(L); }
  __host__ __device__ static constexpr size_t bytes(int L) { return bytes_with(kStages, L, sizeof(FoldB)); }
  // CTAs per SM the shared memory allows at L = 16: the register budget is sized to match, so that
  // registers never limit occupancy below it.
  static constexpr int kCtasPerSm = ctas_for(bytes(16));
};

template <int kP, int kN, DType kSrc, DType kAct, bool kTf32Replay = false>
struct StepSmem {
  using Layout = StepLayout<kP, kN, kSrc, kAct, kTf32Replay>;
  using Act = typename Storage<kAct>::type;
  unsigned char* base;
  int L;
  __device__ StepSmem(unsigned char* b, int buffer_len) : base(b), L(buffer_len) {}
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + Layout::kBarrierOffset) + s; }
  // Tensor-core replay only: stage s consumed; window weights of buffer b written / read.
  __device__ uint64_t* empty(int s) const { return full(Layout::kStages + s); }
  __device__ uint64_t* weights_written(int b) const { return full(2 * Layout::kStages + b); }
  __device__ uint64_t* weights_read(int b) const { return full(2 * Layout::kStages + 2 + b); }
  __device__ uint64_t* x_full(int s) const { return full(2 * Layout::kStages + 4 + s); }
  // kSplitEpilogue: head dots of buffer b written (by the consumers) / read (by the epilogue warps).
  __device__ uint64_t* dots_ready(int b) const { return full(3 * Layout::kStages + 4 + b); }
  __device__ uint64_t* dots_free(int b) const { return full(3 * Layout::kStages + 6 + b); }
  // The window dots B_j . C of the CTA's first group (k = 0) or, two-group CTAs, its second (k = 1).
  __device__ float* dots(int k = 0) const {
    return reinterpret_cast<float*>(base + (k == 0 ? Layout::kDotsOffset : Layout::kGroup1Offset));
  }
  __device__ float* wgt(int b) const { return reinterpret_cast<float*>(base + Layout::kWgtOffset) + b * kMamba2MaxBufferLen; }
  __device__ uint16_t* wfrag(int b) const {
    return reinterpret_cast<uint16_t*>(base + Layout::kWfragOffset + b * WindowMma::kBytes);
  }
  __device__ float* decay(int b) const { return reinterpret_cast<float*>(base + Layout::kDecayOffset) + b; }
  // Tensor-core replay only: the head's D next to its decay, and C's mma fragments in the ydot area.
  __device__ float* head_D(int b) const { return reinterpret_cast<float*>(base + Layout::kDecayOffset) + 2 + b; }
  __device__ uint32_t* c_frags(int k = 0) const {  // the first group's (k = 0) or the second's
    return reinterpret_cast<uint32_t*>(base + (k == 0 ? Layout::kYdotOffset : Layout::kGroup1Offset + 4 * kMamba2MaxBufferLen));
  }
  __device__ float* ydot(int b) const { return reinterpret_cast<float*>(base + Layout::kYdotOffset) + b * kP; }
  // kSplitEpilogue: (S C) of each row for the heads of parity b, before C's unscale.
  __device__ float* head_dots(int b) const { return reinterpret_cast<float*>(base + Layout::kYdotOffset) + (2 + b) * kP; }
  __device__ unsigned char* tile(int s) const { return base + Layout::kRingOffset + static_cast<size_t>(s) * Layout::kTileBytes; }
  __device__ Act* x_window(int k) const { return reinterpret_cast<Act*>(base + Layout::kXwinOffset + k * Layout::x_window_bytes(L)); }
  __device__ typename Layout::FoldB* B_window() const {
    return reinterpret_cast<typename Layout::FoldB*>(base + Layout::B_window_offset(L));
  }
  __device__ float* fold_coef() const { return reinterpret_cast<float*>(base + Layout::kXwinOffset); }
};

// Copy entries 0..w of one kind of row (x or B) to shared memory with cp.async (no commit): entries
// < w from the buffer into slots 0..w - 1, entry w from the current token into slot w (kTokenAtW: the
// fold's B window) or into slot now_slot (L - 1 for the replay's x windows, so that the first head's
// window can be staged before w is known: see the prologue). A template flag rather than now_slot = w,
// so that the fold's code stays as it was measured.
template <int kElems, bool kTokenAtW, class Act>
__device__ __forceinline__ void stage_rows(Act* dst, const Act* buffer, int64_t entry_stride, const Act* current, int w,
                                           int now_slot = 0) {
  constexpr int kPerChunk = 16 / sizeof(Act);
  constexpr int kChunks = kElems / kPerChunk;
  static_assert(kElems % kPerChunk == 0, "rows must be whole 16-byte chunks");
  const int total = (w + 1) * kChunks;
  // From the CTA's last thread down: the epilogue warps, first in the CTA, have the most other work.
  for (int i = kThreads - 1 - static_cast<int>(threadIdx.x); i < total; i += kThreads) {
    const int j = i / kChunks;
    const int c = (i - j * kChunks) * kPerChunk;
    const int slot = kTokenAtW ? j : (j < w ? j : now_slot);
    cp_async16(dst + slot * kElems + c, (j < w ? buffer + j * entry_stride : current) + c);
  }
}

// The fold's B window in fp32 (StepLayout::kFoldBFloat32): entries 0..w - 1 from the buffer, entry w
// from the current token, each 16-byte chunk of activations loaded, converted and stored as floats.
// Loaded synchronously, once per CTA: a folding CTA's set-up is a small part of its time.
template <int kN, DType kAct>
__device__ __forceinline__ void stage_B_fp32(float* dst, const typename Storage<kAct>::type* buffer, int64_t entry_stride,
                                             const typename Storage<kAct>::type* current, int w) {
  constexpr int kPerChunk = Chunk16<kAct>::kElems;
  constexpr int kChunks = kN / kPerChunk;
  static_assert(kN % kPerChunk == 0 && kPerChunk % 4 == 0, "rows must be whole 16-byte chunks");
  const int total = (w + 1) * kChunks;
  for (int i = kThreads - 1 - static_cast<int>(threadIdx.x); i < total; i += kThreads) {
    const int j = i / kChunks;
    const int c = (i - j * kChunks) * kPerChunk;
    float v[kPerChunk];
    Chunk16<kAct>::to_float(*reinterpret_cast<const uint4*>((j < w ? buffer + j * entry_stride : current) + c), v);
#pragma unroll
    for (int k = 0; k < kPerChunk; k += 4) {
      *reinterpret_cast<float4*>(dst + j * kN + c + k) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
    }
  }
}

// Operands loaded one head ahead are kept raw: an instruction that consumes a load (a conversion, a
// softplus) right after it would stall its warp for the load's latency at every head, which is
// where the per-head time of the bf16 / fp8 steps went (the verify kernel found it first).

// What thread p < P needs of head h for output row p.
template <DType kAct>
struct RowOperands {
  using Act = typename Storage<kAct>::type;
  Act x{};
  Act z{};
  float scale = 1.0f;  // fp8 read copy: the row's dequantisation scale
  float D = 0.0f;
};

template <DType kAct, bool kScaled>
__device__ __forceinline__ RowOperands<kAct> load_row_operands(const Mamba2Params& p, int row, int64_t slot, int head,
                                                              int pr) {
  using Act = typename Storage<kAct>::type;
  RowOperands<kAct> o;
  o.x = static_cast<const Act*>(p.x)[row * p.x_row_stride + head * p.x_head_stride + pr];
  if (p.z != nullptr) o.z = static_cast<const Act*>(p.z)[row * p.z_row_stride + head * p.z_head_stride + pr];
  if constexpr (kScaled) o.scale = __ldg(p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride + pr);
  if (p.D != nullptr) o.D = __ldg(p.D + head);
  return o;
}

// The buffered dt of a head's window entries that a lane of the scalar warp holds (j = lane, lane + 32,
// j < end; 0 beyond): end = w, or L - 1 when loaded before the cursor is known.
struct DtWindow {
  float buffered[kMamba2MaxBufferLen / 32];
};

__device__ __forceinline__ DtWindow load_dt_window(const Mamba2Params& p, int64_t slot, int head, int end) {
  const int lane = threadIdx.x & 31;
  const float* dt_buf = p.dt_buf + slot * p.dtb_slot_stride + head * p.dtb_head_stride;
  DtWindow d;
#pragma unroll
  for (int h = 0; h < kMamba2MaxBufferLen / 32; ++h) {
    const int j = lane + 32 * h;
    d.buffered[h] = j < end ? dt_buf[j] : 0.0f;
  }
  return d;
}

// The bits of the current token's raw dt of a head (fp32, or bf16 / fp16 in the low half), converted
// only when used (current_dt): a conversion right after the load would wait for it.
__device__ __forceinline__ uint32_t load_dt_bits(const Mamba2Params& p, int row, int head) {
  const int64_t off = row * p.dt_row_stride + head * p.dt_head_stride;
  return p.dt_dtype == DType::kFloat32 ? __ldg(static_cast<const uint32_t*>(p.dt) + off)
                                       : static_cast<uint32_t>(__ldg(static_cast<const unsigned short*>(p.dt) + off));
}

// What the scalar warp (the last) needs of head h for the window weights: the buffered dt of its
// lanes' entries (DtWindow), the bits of the current token's raw dt, A and dt_bias.
struct HeadDt {
  float buffered[kMamba2MaxBufferLen / 32];
  uint32_t now_bits;
  float A;
  float bias;
};

__device__ __forceinline__ HeadDt load_head_dt(const Mamba2Params& p, int row, int64_t slot, int head, int w) {
  const DtWindow window = load_dt_window(p, slot, head, w);
  HeadDt d;
#pragma unroll
  for (int h = 0; h < kMamba2MaxBufferLen / 32; ++h) d.buffered[h] = window.buffered[h];
  d.now_bits = load_dt_bits(p, row, head);
  d.A = __ldg(p.A + head);
  d.bias = p.dt_bias != nullptr ? __ldg(p.dt_bias + head) : 0.0f;
  return d;
}

// The tensor-core replay's scalar warp loads further ahead than load_head_dt: its consumer warps finish
// a head in less than a DRAM round trip, so the token's dt loaded one head ahead put one on every
// head's path (fp8 steps at ~2.3 us per head and CTA whatever the tile cost). Per-head scalars come 32
// heads at a time, one head per lane (HeadScalars, read back with a shuffle); the buffered dt window two
// heads ahead (load_dt_window).
struct HeadScalars {
  uint32_t now_bits = 0;
  float A = 0.0f, bias = 0.0f, D = 0.0f;
};

// Head `head`'s scalars, or zeros from `end` on.
__device__ __forceinline__ HeadScalars load_head_scalars(const Mamba2Params& p, int row, int head, int end) {
  HeadScalars h;
  if (head < end) {
    h.now_bits = load_dt_bits(p, row, head);
    h.A = __ldg(p.A + head);
    h.bias = p.dt_bias != nullptr ? __ldg(p.dt_bias + head) : 0.0f;
    h.D = p.D != nullptr ? __ldg(p.D + head) : 0.0f;
  }
  return h;
}

// The current token's dt of a head: bias and softplus on the raw value (load_dt's arithmetic).
__device__ __forceinline__ float current_dt(const Mamba2Params& p, uint32_t now_bits, float bias) {
  float dt;
  switch (p.dt_dtype) {
    case DType::kFloat32: dt = __uint_as_float(now_bits); break;
    case DType::kBFloat16: dt = __uint_as_float(now_bits << 16); break;
    default: dt = __half2float(__ushort_as_half(static_cast<unsigned short>(now_bits))); break;
  }
  if (p.dt_bias != nullptr) dt += bias;
  return p.dt_softplus ? softplus(dt) : dt;
}
__device__ __forceinline__ float current_dt(const Mamba2Params& p, const HeadDt& d) { return current_dt(p, d.now_bits, d.bias); }

// A lane's window dots B_j . C (entries lane, lane + 32): the tensor-core replay's scalar warp keeps
// them in registers (StepLayout::kWfragOffset).
struct LaneDots {
  float v[kMamba2MaxBufferLen / 32];
};
__device__ __forceinline__ LaneDots load_lane_dots(const float* dots) {
  LaneDots d;
#pragma unroll
  for (int h = 0; h < kMamba2MaxBufferLen / 32; ++h) d.v[h] = dots[(threadIdx.x & 31) + 32 * h];
  return d;
}

// The scalar warp: wgt_j = dt_j exp(Lambda_w - Lambda_j) for j <= w, and exp(Lambda_w), into shared
// memory; kTimesDots: wgt_j (B_j . C) instead (the tensor-core replay's epilogue, one load per entry),
// as floats into wgt or, kFrags, as WindowMma's B fragments into frags. `now` is the current token's dt
// (entry w, current_dt), which the replay step appends; d.now_bits and d.bias are not read here.
template <bool kTimesDots = false, bool kFrags = false>
__device__ __forceinline__ void window_weights(const HeadDt& d, float now, int w, float* wgt, float* decay,
                                               const LaneDots& dots = LaneDots{}, uint16_t* frags = nullptr) {
  static_assert(kTimesDots || !kFrags, "fragments are the tensor-core replay's");
  constexpr int kEntriesPerLane = kMamba2MaxBufferLen / 32;
  const int lane = threadIdx.x & 31;
  const float A = d.A;
  float dts[kEntriesPerLane];
#pragma unroll
  for (int h = 0; h < kEntriesPerLane; ++h) {
    const int j = lane + 32 * h;
    dts[h] = j == w ? now : (j < w ? d.buffered[h] : 0.0f);  // entries past w may have been loaded (speculatively)
  }
  float prefix[kEntriesPerLane] = {};
  float carry = 0.0f;
#pragma unroll
  for (int h = 0; h < kEntriesPerLane; ++h) {
    if (h * 32 > w) break;  // warp-uniform: no entry of this half is in the window
    const float v = warp_inclusive_sum(dts[h]);
    prefix[h] = v + carry;
    carry += __shfl_sync(kFullMask, v, 31);
  }
  const float at_w = __shfl_sync(kFullMask, w < 32 ? prefix[0] : prefix[1], w & 31);
  const float total = A * at_w;  // Lambda_w
#pragma unroll
  for (int h = 0; h < kEntriesPerLane; ++h) {
    // Warp-uniform: the readers stop at entry w rounded up to 8 (16 for kFrags), inside this half.
    if (h * 32 > w) break;
    const int j = lane + 32 * h;
    const float v = dts[h] * expf(total - A * prefix[h]);
    if constexpr (kFrags) {
      WindowMma::write(frags, j, j <= w ? v * dots.v[h] : 0.0f);  // the k-steps the consumers read: zeros past w
    } else if constexpr (kTimesDots) {
      wgt[j] = j <= w ? v * dots.v[h] : 0.0f;  // the consumers read whole groups of 8: zeros past w
    } else if (j <= w) {
      wgt[j] = v;
    }
  }
  if (lane == 0) *decay = expf(total);
}

// B_j . C for the window entries 0..w, once per CTA: a group of N/8 lanes per entry (one 16-byte
// vector of B each, coalesced), the groups splitting the entries. The loads are issued before the
// cursor is known (issue: every entry the buffer may hold, 0..L-2, the current B and C), so that their
// DRAM round trip overlaps the cursor's instead of following it; finish() sums entries 0..w. The
// entries from w on are read for nothing (the CTA of the group's first head appends entry w at its
// end: what was read there is never used).
template <int kN, DType kAct>
struct WindowDots {
  using Act = typename Storage<kAct>::type;
  static constexpr int kLanes = kN / 8;
  static constexpr int kGroups = kThreads / kLanes;
  static constexpr int kRounds = (kMamba2MaxBufferLen + kGroups - 1) / kGroups;
  uint4 c, now;
  uint4 raw[kRounds];

  __device__ void issue(const Act* B_window, int64_t entry_stride, const Act* B_now, const Act* C_now, int L) {
    const int lane = threadIdx.x % kLanes;
    const int first = threadIdx.x / kLanes;
    c = Chunk16<kAct>::load(C_now, lane * 8);
    now = Chunk16<kAct>::load(B_now, lane * 8);
#pragma unroll
    for (int k = 0; k < kRounds; ++k) {
      const int j = first + k * kGroups;
      raw[k] = j < L - 1 ? Chunk16<kAct>::load(B_window + j * entry_stride, lane * 8) : make_uint4(0, 0, 0, 0);
    }
  }

  __device__ void finish(int w, float* dots) const {
    const int lane = threadIdx.x % kLanes;
    const int first = threadIdx.x / kLanes;
    float cf[8];
    Chunk16<kAct>::to_float(c, cf);
#pragma unroll
    for (int k = 0; k < kRounds; ++k) {
      const int j = first + k * kGroups;
      if (k * kGroups > w) break;  // no group has an entry in this round or later ones (CTA-uniform)
      float b[8];
      Chunk16<kAct>::to_float(j < w ? raw[k] : now, b);
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) d += b[i] * cf[i];
      d = row_sum<kLanes>(d);
      if (lane == 0 && j <= w) dots[j] = d;
    }
  }
};

// Output row p of the step: y + D x, times silu(z) when gated (gate: a fast division).
template <DType kAct>
__device__ __forceinline__ void store_output(const Mamba2Params& p, int row, int head, int pr, float y,
                                             const RowOperands<kAct>& o) {
  if (p.D != nullptr) y += o.D * to_float(o.x);
  if (p.z != nullptr) y *= gate(to_float(o.z));
  store_act<kAct>(p.out, row * p.out_row_stride + head * p.out_head_stride + pr, y);
}

// Entries j .. j + 3 of a head's window term for output row pr: their weights wgt_j (B_j . C) (from wd,
// zeros past w; 16-byte aligned at j) and x_j[pr] from the stage's x window xw. Past w, x is read at slot
// L - 1, the current token's (entry w): finite, unlike a buffer entry never written. A fixed count per
// group, no remainder branches: the loop `j = part; j < w; j += 2`, which ptxas unrolled with remainder
// branches, had 24% of a consumer's per-head samples (session 11 ncu, nano4b b256, fp8 copy), 41% of them
// instruction-fetch or branch stalls.
struct WindowGroup4 {
  float4 wgt;
  float x[4];
};
template <int kP, class Act>
__device__ __forceinline__ WindowGroup4 window_group4(const float* wd, const Act* xw, int j, int w, int L, int pr) {
  WindowGroup4 g;
  g.wgt = *reinterpret_cast<const float4*>(wd + j);
#pragma unroll
  for (int u = 0; u < 4; ++u) g.x[u] = to_float(xw[(j + u < w ? j + u : L - 1) * kP + pr]);
  return g;
}

// kRound: the fold rounds a 16-bit checkpoint stochastically (p.rounding_seed, stochastic_rounding.cuh).
// A template flag, not a branch, so that kernels without it compile exactly as before: inlined in a
// run-time branch, or called out of line, the Philox draw spilled the P = 80 kernels' other paths.
//
// kOrdered: CTA row y takes the batch row and slot the order pass put at y (p.row_order), not row y. A
// template flag too, so that the kernels without it compile exactly as before: a row read from memory
// holds a register for the whole kernel where blockIdx.y needs none (session 14's first version read it
// in every kernel, with another change that also moved ptxas's choices, and the lock-step fp8-copy fold
// step ran 3-5% slower).
//
// kTf32Replay: the fp32 checkpoint without a copy replays on tensor cores (StepLayout); its folds are
// the CUDA-core kernel's code.
template <int kP, int kN, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kRound, bool kOrdered, bool kTf32Replay,
          bool kTwoGroups = false>
__global__ void __launch_bounds__(kThreads, (StepLayout<kP, kN, kCopy ? kRead : kCkpt, kAct, kTf32Replay>::kCtasPerSm))
    step_kernel(const Mamba2Params p) {
  static_assert(!kRound || kCkpt != DType::kFloat32, "stochastic rounding is for 16-bit checkpoints");
  static_assert(!kTf32Replay || (kCkpt == DType::kFloat32 && !kCopy), "tf32 replay: fp32 checkpoint, no copy");
  static_assert(!kTwoGroups || (kCopy && !kOrdered), "two-group CTAs: the read copies' unordered step");
  using Act = typename Storage<kAct>::type;
  constexpr DType kSrc = kCopy ? kRead : kCkpt;  // what a replay step reads
  using Tile = ChunkTile<kP, kN, kSrc>;
  using Src = Chunk16<kSrc>;
  using Layout = StepLayout<kP, kN, kSrc, kAct, kTf32Replay>;
  constexpr int E = Tile::kElems;
  constexpr int R = Tile::kPasses;
  constexpr int S = Layout::kStages;
  constexpr int kSrcBytes = dtype_size(kSrc);
  extern __shared__ __align__(128) unsigned char smem_base[];

  const int L = p.buffer_len;
  const StepSmem<kP, kN, kSrc, kAct, kTf32Replay> sm(smem_base, L);
  // After the order pass (staggered flush) the folding rows come first, their slots resolved. With a
  // fold split the grid's first rows are helpers: helper row e serves list position e / (split - 1), the
  // part 1 + e % (split - 1) of each of its replay-sized blocks, if the pass marked that row (a folding
  // row within the split's count) and exits otherwise; a marked row's own CTAs take part 0.
  int order_pos = blockIdx.y;
  int part = 0;
  if constexpr (kOrdered) {
    if (p.fold_split > 1) {
      const int helpers_per_row = p.fold_split - 1;
      const int helper_rows = p.fold_split_rows * helpers_per_row;
      if (static_cast<int>(blockIdx.y) < helper_rows) {
        order_pos = blockIdx.y / helpers_per_row;
        part = 1 + blockIdx.y % helpers_per_row;
      } else {
        order_pos = blockIdx.y - helper_rows;
      }
    }
  }
  const int order_entry = kOrdered ? p.row_order[order_pos] : 0;
  const bool fine_fold = kOrdered && (order_entry & kFineFoldRow) != 0;
  if (kOrdered && part > 0 && !fine_fold) return;  // a helper of a row that is not folding (or not split)
  const int row = kOrdered ? (order_entry & ~kFineFoldRow) : static_cast<int>(blockIdx.y);
  const int tid = threadIdx.x;
  // Roles, spread so that no warp arrives late at the per-head barrier: the last warp derives each
  // head's window weights, warp 6's first lane refills the ring, the first kP * kSplit threads (whole
  // warps) finish the output rows, kSplit threads per row, and the x windows are staged from the top.
  constexpr int kSplit = 2 * kP <= kThreads - 32 ? 2 : 1;
  const bool scalar_warp = tid >= kThreads - 32;
  const bool producer = tid == kThreads - 64;
  const bool row_owner = tid < kP;  // fold epilogue: thread p owns row p
  const bool epilogue_thread = tid < kP * kSplit;
  const int epilogue_row = tid / kSplit;
  const int epilogue_part = tid % kSplit;
  const int heads_per_group = p.heads / p.groups;
  // This CTA's heads: head0 .. head0 + num_heads - 1, one group (a block of heads_per_cta, or with the
  // fold split, part `part` of it) or, kTwoGroups, two whole groups (heads_per_cta twice a group's
  // heads), `group` the first. kTwoGroups is a template flag so that the kernels without it compile
  // exactly as before: a group switch in the per-head loops made the fp8-copy step 3.5-8% slower
  // (sessions 17, 22 and 30).
  const int num_heads = fine_fold ? p.heads_per_cta / p.fold_split : p.heads_per_cta;
  const int blocks_per_group = kTwoGroups ? 1 : heads_per_group / p.heads_per_cta;
  const int group = kTwoGroups ? blockIdx.x * 2 : blockIdx.x / blocks_per_group;
  const int head0 = group * heads_per_group + (blockIdx.x % blocks_per_group) * p.heads_per_cta + part * num_heads;
  // Which of the CTA's groups head head0 + i is in (0 or 1).
  auto group_of = [&](int i) { return kTwoGroups && i >= heads_per_group ? 1 : 0; };
  const int64_t slot = kOrdered ? p.row_order[p.batch + order_pos] : resolve_slot(p, row);
  if (slot < 0) {
    for (int i = 0; i < num_heads; ++i) write_zero_output<kAct>(p, row, head0 + i);
    return;
  }

  // ---- issued before the cursor is known: the first S source tiles, by bulk copy ----
  const unsigned char* src = static_cast<const unsigned char*>(kCopy ? p.read_copy : p.checkpoint);
  const int64_t src_slot = kCopy ? slot * p.rc_slot_stride : slot * p.ck_slot_stride;
  const int64_t src_head_stride = kCopy ? p.rc_head_stride : p.ck_head_stride;
  const int64_t src_row_stride = kCopy ? p.rc_row_stride : p.ck_row_stride;
  auto issue_tile = [&](int stage, int head) {
    bulk_copy_tile_to_shared<kP, kN * kSrcBytes>(sm.tile(stage), src + (src_slot + head * src_head_stride) * kSrcBytes,
                                                 src_row_stride * kSrcBytes, sm.full(stage));
  };
  const int first_stages = num_heads < S ? num_heads : S;
  const Act* x_buf = static_cast<const Act*>(p.x_buf) + slot * p.xb_slot_stride;
  const Act* B_buf = static_cast<const Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride;
  auto x_now = [&](int head) { return static_cast<const Act*>(p.x) + row * p.x_row_stride + head * p.x_head_stride; };
  // Tensor-core replay: a stage's x window holds the buffered entries 0..w - 1 in slots 0..w - 1 and the
  // current token in slot L - 1 (w <= L - 1, so they never meet). The first head's window is copied
  // before the cursor is known, with every entry the buffer may hold (0..L - 2; contiguous entries
  // only): the first head then waits for one DRAM round trip (the cursor's), not two. The entries
  // from w on are copied for nothing; a fold step waits for the copy before reusing the area.
  constexpr uint32_t kEntryBytes = kP * sizeof(Act);
  const bool speculative_x = Layout::kTensorReplay && p.xb_entry_stride == kP;
  if (tid == 0) {
    REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineStart);
    for (int s = 0; s < S; ++s) mbarrier_init(sm.full(s), 1);
    if constexpr (Layout::kTensorReplay) {
      // Every lane that read or wrote arrives itself (no elected lane after __syncwarp): each lane's own
      // arrive releases its own accesses, which is also what compute-sanitizer's racecheck can follow.
      for (int s = 0; s < S; ++s) {
        mbarrier_init(sm.empty(s), 32 * (TensorReplay<kP>::kConsumers + TensorReplay<kP>::kEpilogueWarps));
        mbarrier_init(sm.x_full(s), 1);  // the producer
      }
      for (int b = 0; b < 2; ++b) {
        mbarrier_init(sm.weights_written(b), 32);  // the scalar warp
        mbarrier_init(sm.weights_read(b), 32 * TensorReplay<kP>::kWindowReaders);
        if constexpr (Layout::kSplitEpilogue) {
          mbarrier_init(sm.dots_ready(b), 32 * TensorReplay<kP>::kConsumers);
          mbarrier_init(sm.dots_free(b), 32 * TensorReplay<kP>::kEpilogueWarps);
        }
      }
    }
    fence_barrier_init();
    for (int s = 0; s < first_stages; ++s) issue_tile(s, head0 + s);
    if (speculative_x) {
      Act* dst = sm.x_window(0);
      mbarrier_arrive_expect_tx(sm.x_full(0), static_cast<uint32_t>(L) * kEntryBytes);
      if (L > 1) bulk_copy_to_shared(dst, x_buf + head0 * p.xb_head_stride, static_cast<uint32_t>(L - 1) * kEntryBytes, sm.x_full(0));
      bulk_copy_to_shared(dst + (L - 1) * kP, x_now(head0), kEntryBytes, sm.x_full(0));
    }
  }
  const Act* B_now = static_cast<const Act*>(p.B) + row * p.B_row_stride + group * p.B_group_stride;
  const Act* C_now = static_cast<const Act*>(p.C) + row * p.C_row_stride + group * p.C_group_stride;
  // The second group's B window (the buffer's entries), B and C (kTwoGroups), derived where used
  // from what stays live anyway (pointers kept from here to the fold's second group made ptxas spill).
  auto B_buf1 = [&] { return static_cast<const Act*>(p.B_buf) + slot * p.Bb_slot_stride + (group + 1) * p.Bb_group_stride; };
  auto B_now1 = [&] { return static_cast<const Act*>(p.B) + row * p.B_row_stride + (group + 1) * p.B_group_stride; };
  auto C_now1 = [&] { return static_cast<const Act*>(p.C) + row * p.C_row_stride + (group + 1) * p.C_group_stride; };
  if (kTwoGroups && tid == kThreads - 32) {  // asked into L2 now, read after the cursor (below)
    if (p.Bb_entry_stride == kN) prefetch_l2_if_aligned(B_buf1(), static_cast<size_t>(L - 1) * kN * sizeof(Act));
    prefetch_l2_if_aligned(B_now1(), kN * sizeof(Act));
    prefetch_l2_if_aligned(C_now1(), kN * sizeof(Act));
  }
  WindowDots<kN, kAct> dots_in;  // the replay's B_j . C, loads issued before the cursor's (see WindowDots)
  dots_in.issue(B_buf, p.Bb_entry_stride, B_now, C_now, L);
  // The tensor-core replay's scalar warp: its first two heads' dt windows (every entry the buffer may
  // hold; window_weights ignores those from w on) and per-head scalars, also before the cursor.
  HeadScalars scalars_first{}, scalars_next{};
  DtWindow dt_even{}, dt_odd{};
  if (Layout::kTensorReplay && scalar_warp) {
    const int end = head0 + num_heads;
    scalars_first = load_head_scalars(p, row, head0 + (tid & 31), end);       // heads 0 .. 31 of the CTA
    scalars_next = load_head_scalars(p, row, head0 + 32 + (tid & 31), end);  // the 32 after
    dt_even = load_dt_window(p, slot, head0, L - 1);
    if (num_heads > 1) dt_odd = load_dt_window(p, slot, head0 + 1, L - 1);
  }
  // The CUDA-core replay of an fp32 checkpoint: the first head's x window (every entry the buffer may
  // hold, the current token in slot L - 1), C and the scalar warp's first dt, also before the cursor.
  // Not in the CUDA-core kernels of a 16-bit source with the other 16-bit activation type: there the
  // early staging made ptxas spill (60 bytes at P = 80), so they stage window 0 after the cursor.
  constexpr bool kCoreSpeculative = !Layout::kTensorReplay && kSrc == DType::kFloat32;
  typename Vec4<kAct>::Raw c_raw{};
  HeadDt core_dt{};
  if constexpr (kCoreSpeculative) {
    stage_rows<kP, false>(sm.x_window(0), x_buf + head0 * p.xb_head_stride, p.xb_entry_stride, x_now(head0), L - 1, L - 1);
    cp_async_commit();
    c_raw = Vec4<kAct>::load(C_now, ChunkTile<kP, kN, kSrc>::col0());  // fp32 source: 4 elements a chunk
    if (scalar_warp) core_dt = load_head_dt(p, row, slot, head0, L - 1);
  }
  const int w = p.num_committed[slot] & kCursorMask;
  __syncthreads();  // the barriers are initialised; every thread has read the cursor
  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineCursor);

  if (w >= L) {  // a cursor with no room: touch nothing (but let the copies land before the CTA exits)
    if (tid == 0) {
      for (int s = 0; s < first_stages; ++s) mbarrier_wait(sm.full(s), 0);
      if (speculative_x) mbarrier_wait(sm.x_full(0), 0);
    }
    cp_async_wait_all();
    for (int i = 0; i < num_heads; ++i) write_zero_output<kAct>(p, row, head0 + i);
    return;
  }
  const bool fold = step_folds(p, w, L);
  // Every thread of this CTA has read the cursor (the barrier above), so from here on the CTA may take
  // its ticket, and the last of the slot's CTAs move the cursor. Where:
  //   - a replaying CTA early, while its first tiles are in flight: at its end the atomic's round trip
  //     sat on its tail (session 14, run 5: the replay step 2-8% faster at batch 1); but not right here
  //     by thread 0, or warp 0 would wait for the round trip before its part of the set-up, and the
  //     whole CTA for warp 0. The tensor-core replay takes it after its set-up barrier, in a warp with
  //     no part in the replay (TensorReplay::kTicketThread); the CUDA-core replay after its first
  //     per-head barrier (kCoreTicketThread);
  //   - a folding CTA at its end: taken here, thread 0 waited for it before the fold's coefficient
  //     loads, the fp8-copy fold step ran 2-4% slower (session 14, run 4), and ptxas spilled 4-16 more
  //     bytes in the fp32-checkpoint fp8-copy kernels.
  auto take_ticket = [&] {
    const int32_t old = atomicAdd(p.num_committed + slot, kTicket);
    if ((old >> 16) == p.heads / num_heads - 1) atomicExch(p.num_committed + slot, fold ? 0 : w + 1);
  };
  // The CUDA-core replay's: after its first per-head barrier, in a warp with no epilogue rows, so
  // that the round trip overlaps the first epilogue and the second head's reduction.
  constexpr int kCoreTicketThread = kThreads - 96;
  static_assert(kP * kSplit <= kCoreTicketThread, "the ticket's warp has no epilogue rows");
  // Head `head`'s x window by bulk copies on `bar`: the buffered entries 0..w - 1 into slots 0..w - 1 of
  // dst, the current token into slot now_slot (the API guarantees 16-byte aligned x and x_buf rows, and
  // an entry is P, a multiple of 16, activations). The tensor-core replay's stages and the copy fold's.
  auto issue_x_entries = [&](Act* dst, uint64_t* bar, int head, int now_slot) {
    const Act* buffered = x_buf + head * p.xb_head_stride;
    mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(w + 1) * kEntryBytes);
    if (p.xb_entry_stride == kP) {
      if (w > 0) bulk_copy_to_shared(dst, buffered, static_cast<uint32_t>(w) * kEntryBytes, bar);
    } else {
      for (int j = 0; j < w; ++j) bulk_copy_to_shared(dst + j * kP, buffered + j * p.xb_entry_stride, kEntryBytes, bar);
    }
    bulk_copy_to_shared(dst + now_slot * kP, x_now(head), kEntryBytes, bar);
  };
  auto stage_x_window = [&](int k, int head) {  // the CUDA-core replay's: entries 0..w - 1, the token in slot L - 1
    stage_rows<kP, false>(sm.x_window(k), x_buf + head * p.xb_head_stride, p.xb_entry_stride, x_now(head), w, L - 1);
  };

  if (!fold) {
    // y_p = e^{Lambda_w} s_p (S_read C)_p + sum_{j<=w} wgt_j (B_j . C) x_j[p] + D x_p, head after head:
    // the source tiles S - 1 heads ahead in the ring, the x windows two heads ahead (CUDA-core) or with
    // their stage's tile (tensor cores). The first head's inputs were requested before the cursor (see
    // WindowDots and the prologue above), so a CTA waits one DRAM round trip before it, not two.
    if constexpr (Layout::kTensorReplay) {
      using Roles = TensorReplay<kP>;
      using Dot = TensorDot<kN, kSrc, kAct>;
      static_assert(Dot::kCWords * 4 <= 2 * 4 * kP, "C's fragments fit in the ydot area");
      static_assert(Dot::kCWords * 4 <= 4 * kN, "the second group's C fragments fit in theirs (StepLayout)");
      constexpr int kTiles = Roles::kTilesPerWarp;
      constexpr bool kScaled = kSrc == DType::kFloat8E4M3;
      const int warp = tid / 32;
      const int lane = tid & 31;
      const bool consumer = warp < Roles::kConsumers;
      // A consumer's rows: first_row .. first_row + kRowsPerWarp - 1.
      const int first_row = warp * Roles::kRowsPerWarp;
      // Head `head`'s x window into stage `stage`'s, on x_full(stage), the current token in slot L - 1.
      auto issue_x_window = [&](int stage, int head) { issue_x_entries(sm.x_window(stage), sm.x_full(stage), head, L - 1); };
      // The first stages' tiles went in before the cursor was known; their x windows go in now (the
      // first head's already did where speculative_x).
      if (tid == Roles::kProducerThread) {
        for (int s = speculative_x ? 1 : 0; s < first_stages; ++s) issue_x_window(s, head0 + s);
      }
      dots_in.finish(w, sm.dots());
      if (tid < 32) Dot::write_c(C_now, sm.c_frags());
      if constexpr (kTwoGroups) {  // the second group's, from L2: by then the first tile is still in flight
        WindowDots<kN, kAct> dots1;
        dots1.issue(B_buf1(), p.Bb_entry_stride, B_now1(), C_now1(), L);
        dots1.finish(w, sm.dots(1));
        if (tid >= 32 && tid < 64) Dot::write_c(C_now1(), sm.c_frags(1));
      }
      __syncthreads();  // the dots and C's fragments are in
      if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineSetUp);
      if (tid == Roles::kTicketThread) take_ticket();
      if constexpr (Layout::kSplitEpilogue) {
        if (consumer) {
          // (S C) of the warp's 16 rows, head after head, into the head dots of the head's parity; the
          // tile goes back to the ring as soon as it is reduced (its x window is the epilogue's).
          const uint32_t* cfrag0 = sm.c_frags();
          const int g = lane >> 2;
          for (int i = 0; i < num_heads; ++i) {
            const int stage = i % S;
            const int b = i & 1;
            mbarrier_wait(sm.full(stage), (i / S) & 1);
            if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineItem0 + i);
            float y_g, y_g8;
            // The two-group kernels keep the plain load order (kFlip = false): with the conflict-free one
            // nano4b's fp8 step at b64 (the batches these kernels run) was +1.0% slower, super120b's -0.6%,
            // a ptxas layout effect; without it their SASS is as before (session 38, same-call A/B).
            Dot::template dot<!kTwoGroups>(sm.tile(stage), first_row, kTwoGroups ? sm.c_frags(group_of(i)) : cfrag0, y_g, y_g8);
            mbarrier_arrive(sm.empty(stage));
            if (i >= 2) mbarrier_wait(sm.dots_free(b), ((i >> 1) - 1) & 1);  // head i - 2's dots are read
            if ((lane & 3) == 0) {  // rows g and g + 8 of the tile: every lane of a quad holds them
              float* const dots = sm.head_dots(b);
              dots[first_row + g] = y_g;
              dots[first_row + g + 8] = y_g8;
            }
            mbarrier_arrive(sm.dots_ready(b));
          }
          if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineConsumerEnd);
        } else if (warp < Roles::kConsumers + Roles::kEpilogueWarps) {
          // The epilogue, thread pr for output row pr: the window term sum_{j<=w} wgt_j (B_j . C) x_j[pr]
          // from the stage's x window, then the head's dot, D, the gate, the output and the append.
          // kWindowMma: the window term of the warp's 32 rows on tensor cores (two 16-row tiles), lane
          // 4 g + c then taking row 16 (c / 2) + g + 8 (c % 2) of them (WindowMma::row_term).
          const int epilogue_row0 = 32 * (warp - Roles::kConsumers);
          const int pr = Layout::kWindowMma ? epilogue_row0 + 16 * ((lane >> 1) & 1) + (lane >> 2) + 8 * (lane & 1)
                                            : tid - 32 * Roles::kConsumers;
          const float c_unscale0 = Dot::c_unscale(sm.c_frags());
          // z and the fp8 scale of the row, loaded two heads ahead (as the consumers do without the split).
          auto load_row = [&](RowOperands<kAct>& o, int head) {
            if (p.z != nullptr) o.z = static_cast<const Act*>(p.z)[row * p.z_row_stride + head * p.z_head_stride + pr];
            if constexpr (kScaled) o.scale = __ldg(p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride + pr);
          };
          auto one_head = [&](int i, RowOperands<kAct>& cur) {
            const int head = head0 + i;
            const int stage = i % S;
            const int b = i & 1;
            mbarrier_wait(sm.x_full(stage), (i / S) & 1);
            mbarrier_wait(sm.weights_written(b), (i >> 1) & 1);
            const Act* xw = sm.x_window(stage);
            const float decay = *sm.decay(b);
            cur.D = *sm.head_D(b);
            cur.x = xw[(L - 1) * kP + pr];  // the current token (entry w), in slot L - 1
            float y;
            if constexpr (Layout::kWindowMma) {
              static_assert(kP % 32 == 0, "an epilogue warp's rows: two whole 16-row tiles");
              const uint16_t* wf = sm.wfrag(b);
              float acc[2][4] = {};
#pragma unroll 1
              for (int k0 = 0; k0 <= w; k0 += 16) {
                const uint2 bw = WindowMma::b_frag(wf, k0);
                const Act* a_row = WindowMma::a_row<kP>(xw, k0, w, L, epilogue_row0);
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                  uint32_t a[4];
                  ldmatrix_x4_trans(a, a_row + 16 * t);
                  mma_m16n8k16<true>(acc[t], a[0], a[1], a[2], a[3], bw.x, bw.y);
                }
              }
              const float tile0 = WindowMma::row_term(acc[0]);
              const float tile1 = __shfl_xor_sync(kFullMask, WindowMma::row_term(acc[1]), 2);  // to lanes c = 2, 3
              y = (lane & 2) ? tile1 : tile0;
            } else {
              // Entries in groups of 4 (window_group4), a thread per row.
              const float* wd = sm.wgt(b);  // wgt_j (B_j . C), zeros past w
              float y_odd = 0.0f;
              y = 0.0f;
#pragma unroll 1
              for (int j0 = 0; j0 <= w; j0 += 4) {
                const WindowGroup4 g = window_group4<kP>(wd, xw, j0, w, L, pr);
                y += g.wgt.x * g.x[0];
                y_odd += g.wgt.y * g.x[1];
                y += g.wgt.z * g.x[2];
                y_odd += g.wgt.w * g.x[3];
              }
              y += y_odd;
            }
            mbarrier_arrive(sm.empty(stage));  // the stage's x window is read
            mbarrier_arrive(sm.weights_read(b));
            mbarrier_wait(sm.dots_ready(b), (i >> 1) & 1);
            const float dot = sm.head_dots(b)[pr];
            mbarrier_arrive(sm.dots_free(b));
            y += decay * cur.scale * (dot * (kTwoGroups ? Dot::c_unscale(sm.c_frags(group_of(i))) : c_unscale0));
            store_output<kAct>(p, row, head, pr, y, cur);
            // Append the current token as entry w.
            static_cast<Act*>(p.x_buf)[slot * p.xb_slot_stride + head * p.xb_head_stride + w * p.xb_entry_stride + pr] = cur.x;
            if (i + 2 < num_heads) load_row(cur, head + 2);
          };
          RowOperands<kAct> even, odd;
          load_row(even, head0);
          if (num_heads > 1) load_row(odd, head0 + 1);
          for (int i = 0; i < num_heads; i += 2) {
            one_head(i, even);
            if (i + 1 < num_heads) one_head(i + 1, odd);
          }
          if (pr == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineOtherEnd);
        }
      }
      if (consumer && !Layout::kSplitEpilogue) {
        // In the epilogue two lanes per row and half the lanes storing (part 0), or, kWindowMma, lanes
        // 4 g + c with c = 0, 1 taking row g + 8 c of a tile (WindowMma::row_term).
        const int row_in_tile = Layout::kWindowMma ? (lane >> 2) + 8 * (lane & 1) : lane >> 1;
        const int part = Layout::kWindowMma ? (lane >> 1) & 1 : lane & 1;
        const uint32_t* cfrag0 = sm.c_frags();
        const float c_unscale0 = Dot::c_unscale(cfrag0);
        // The only per-head global loads of a consumer: z and the fp8 scales of its rows (x is in the
        // stage's x window, D in shared memory). Loaded right after head i - 2 used the same registers:
        // two heads of latency, and no register copy that waits for them.
        auto load_rows = [&](RowOperands<kAct>(&rows)[kTiles], int head) {
#pragma unroll
          for (int t = 0; t < kTiles; ++t) {
            if (part == 0) {
              const int pr = first_row + 16 * t + row_in_tile;
              if (p.z != nullptr) rows[t].z = static_cast<const Act*>(p.z)[row * p.z_row_stride + head * p.z_head_stride + pr];
              if constexpr (kScaled) rows[t].scale = __ldg(p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride + pr);
            }
          }
        };
        auto one_head = [&](int i, RowOperands<kAct>(&cur)[kTiles]) {
          const int head = head0 + i;
          const int stage = i % S;
          const int b = i & 1;
          const uint32_t phase = (i / S) & 1;

          mbarrier_wait(sm.full(stage), phase);
          if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineItem0 + i);
          const uint32_t* cfrag = kTwoGroups ? sm.c_frags(group_of(i)) : cfrag0;
          const float c_unscale = kTwoGroups ? Dot::c_unscale(cfrag) : c_unscale0;
          float y_g[kTiles], y_g8[kTiles];
#pragma unroll
          // Two-group kernels: the plain load order (kFlip = false), as in the split epilogue above.
          for (int t = 0; t < kTiles; ++t) Dot::template dot<!kTwoGroups>(sm.tile(stage), first_row + 16 * t, cfrag, y_g[t], y_g8[t]);

          mbarrier_wait(sm.x_full(stage), phase);
          mbarrier_wait(sm.weights_written(b), (i >> 1) & 1);
          const Act* xw = sm.x_window(stage);
          const float decay = *sm.decay(b);
          const float head_D = *sm.head_D(b);
          if constexpr (Layout::kWindowMma) {
            // The window term of the warp's tiles on tensor cores, then lanes c = 0, 1 of each quad
            // finish rows g and g + 8: their dots are y_g and y_g8 in their own lanes.
            const uint16_t* wf = sm.wfrag(b);
            float acc[kTiles][4] = {};
#pragma unroll 1
            for (int k0 = 0; k0 <= w; k0 += 16) {
              const uint2 bw = WindowMma::b_frag(wf, k0);
              const Act* a_row = WindowMma::a_row<kP>(xw, k0, w, L, first_row);
#pragma unroll
              for (int t = 0; t < kTiles; ++t) {
                uint32_t a[4];
                ldmatrix_x4_trans(a, a_row + 16 * t);
                mma_m16n8k16<true>(acc[t], a[0], a[1], a[2], a[3], bw.x, bw.y);
              }
            }
#pragma unroll
            for (int t = 0; t < kTiles; ++t) {
              const float term = WindowMma::row_term(acc[t]);
              if (part == 0) {
                const int pr = first_row + 16 * t + row_in_tile;
                cur[t].D = head_D;
                cur[t].x = xw[(L - 1) * kP + pr];  // the current token (entry w), in slot L - 1
                const float y = term + decay * cur[t].scale * (((lane & 1) == 0 ? y_g[t] : y_g8[t]) * c_unscale);
                store_output<kAct>(p, row, head, pr, y, cur[t]);
                // Append the current token as entry w.
                static_cast<Act*>(p.x_buf)[slot * p.xb_slot_stride + head * p.xb_head_stride + w * p.xb_entry_stride + pr] =
                    cur[t].x;
              }
            }
          } else {
            const float* wd = sm.wgt(b);  // wgt_j (B_j . C)
#pragma unroll
            for (int t = 0; t < kTiles; ++t) {
              const int pr = first_row + 16 * t + row_in_tile;
              cur[t].D = head_D;
              cur[t].x = xw[(L - 1) * kP + pr];  // the current token (entry w), in slot L - 1
              // The window term sum_{j<=w} wgt_j x_j over entries 0 .. w in groups of 8, lane `part` taking
              // 4 of each (window_group4; the scalar warp writes the weights zero past w, up to the end
              // of w's 32-entry half, which covers every group of 8 read here).
              float y = 0.0f, y_odd = 0.0f;
#pragma unroll 1
              for (int j0 = 0; j0 <= w; j0 += 8) {
                const WindowGroup4 g = window_group4<kP>(wd, xw, j0 + 4 * part, w, L, pr);
                y += g.wgt.x * g.x[0];
                y_odd += g.wgt.y * g.x[1];
                y += g.wgt.z * g.x[2];
                y_odd += g.wgt.w * g.x[3];
              }
              y += y_odd;
              y += __shfl_xor_sync(kFullMask, y, 1);
              // Row g's dot sits in the lanes of quad g: y_g for rows 0..7 of the tile, y_g8 for 8..15.
              const int quad_lane = 4 * (row_in_tile & 7);
              const float dot_g = __shfl_sync(kFullMask, y_g[t], quad_lane);
              const float dot_g8 = __shfl_sync(kFullMask, y_g8[t], quad_lane);
              if (part == 0) {
                y += decay * cur[t].scale * ((row_in_tile < 8 ? dot_g : dot_g8) * c_unscale);
                store_output<kAct>(p, row, head, pr, y, cur[t]);
                // Append the current token as entry w.
                static_cast<Act*>(p.x_buf)[slot * p.xb_slot_stride + head * p.xb_head_stride + w * p.xb_entry_stride + pr] =
                    cur[t].x;
              }
            }
          }
          mbarrier_arrive(sm.empty(stage));  // the stage's tile and x window are read
          mbarrier_arrive(sm.weights_read(b));
          if (i + 2 < num_heads) load_rows(cur, head + 2);
        };
        RowOperands<kAct> even[kTiles], odd[kTiles];
        load_rows(even, head0);
        if (num_heads > 1) load_rows(odd, head0 + 1);
        for (int i = 0; i < num_heads; i += 2) {
          one_head(i, even);
          if (i + 1 < num_heads) one_head(i + 1, odd);
        }
        if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineConsumerEnd);
      } else if (tid == Roles::kProducerThread) {
        // Besides its tile and x window, a head's small operands are asked into L2 as early as its
        // tile: a consumer warp finishes a head in well under a DRAM round trip, so the row operands it
        // loads two heads ahead (z, fp8 scales) and the scalar warp's dt window would otherwise each
        // cost one on the critical path.
        auto prefetch_operands = [&](int head) {
          if (p.z != nullptr) {
            prefetch_l2_if_aligned(static_cast<const Act*>(p.z) + row * p.z_row_stride + head * p.z_head_stride,
                                   kP * sizeof(Act));
          }
          if constexpr (kScaled) {
            prefetch_l2_if_aligned(p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride, kP * sizeof(float));
          }
          prefetch_l2_if_aligned(p.dt_buf + slot * p.dtb_slot_stride + head * p.dtb_head_stride, L * sizeof(float));
        };
        for (int i = 0; i < first_stages; ++i) prefetch_operands(head0 + i);
        for (int i = S; i < num_heads; ++i) {
          const int stage = i % S;
          mbarrier_wait(sm.empty(stage), (i / S - 1) & 1);  // every consumer warp is done with head i - S
          fence_proxy_async();
          issue_tile(stage, head0 + i);
          issue_x_window(stage, head0 + i);
          prefetch_operands(head0 + i);
        }
      } else if (scalar_warp) {
        const int end = head0 + num_heads;
        HeadScalars batch = scalars_first;      // heads i .. i + 31
        HeadScalars next_batch = scalars_next;  // the 32 after
        // The current token's dt of head i + lane (bias, softplus), computed once per 32 heads, all lanes
        // at once, when the batch comes into use: its loads were issued 32 heads before. Per head it was
        // ~70 of the scalar warp's ~300 instructions (ncu source counters, session 33), on the path of
        // every head's weights.
        float batch_dt = 0.0f;
        // The window dots into registers before the first fragments go over them (kWindowMma).
        const LaneDots dots0 = load_lane_dots(sm.dots(0));
        LaneDots dots1{};
        if constexpr (kTwoGroups) dots1 = load_lane_dots(sm.dots(1));
        __syncwarp();
        auto one_head = [&](int i, const DtWindow& window) {
          const int head = head0 + i;
          const int b = i & 1;
          if (i % 32 == 0) {
            if (i > 0) {
              batch = next_batch;
              next_batch = load_head_scalars(p, row, head + 32 + lane, end);
            }
            batch_dt = current_dt(p, batch.now_bits, batch.bias);
            // Appended as entry w of heads i .. i + 31 at once (nothing in this launch reads entry w).
            if (head + lane < end) p.dt_buf[slot * p.dtb_slot_stride + (head + lane) * p.dtb_head_stride + w] = batch_dt;
          }
          HeadDt cur_dt;  // now_bits and bias unset: the current dt is batch_dt's
#pragma unroll
          for (int h = 0; h < kMamba2MaxBufferLen / 32; ++h) cur_dt.buffered[h] = window.buffered[h];
          cur_dt.A = __shfl_sync(kFullMask, batch.A, i & 31);
          const float dt_now = __shfl_sync(kFullMask, batch_dt, i & 31);
          const float head_D = __shfl_sync(kFullMask, batch.D, i & 31);
          if (i >= 2) mbarrier_wait(sm.weights_read(b), ((i >> 1) - 1) & 1);  // head i - 2 is done with buffer b
          LaneDots dots = dots0;
#pragma unroll
          for (int h = 0; h < kMamba2MaxBufferLen / 32; ++h) dots.v[h] = group_of(i) ? dots1.v[h] : dots0.v[h];  // no local copy
          window_weights<true, Layout::kWindowMma>(cur_dt, dt_now, w, sm.wgt(b), sm.decay(b), dots, sm.wfrag(b));
          if (lane == 0) *sm.head_D(b) = head_D;
          mbarrier_arrive(sm.weights_written(b));
        };
        // Heads in pairs, each window register set refilled right after its use: a window is loaded two
        // heads before it is needed, with no register copy (which would wait for the load) in between.
        DtWindow even = dt_even;
        DtWindow odd = dt_odd;
        for (int i = 0; i < num_heads; i += 2) {
          one_head(i, even);
          if (i + 2 < num_heads) even = load_dt_window(p, slot, head0 + i + 2, w);
          if (i + 1 < num_heads) {
            one_head(i + 1, odd);
            if (i + 3 < num_heads) odd = load_dt_window(p, slot, head0 + i + 3, w);
          }
        }
      }
    } else {
      // kCoreSpeculative: window 0, C and the scalar warp's first dt were requested before the cursor.
      if constexpr (!kCoreSpeculative) {
        stage_x_window(0, head0);
        cp_async_commit();
      }
      if (num_heads > 1) stage_x_window(1, head0 + 1);
      cp_async_commit();
      float c[E];
#pragma unroll
      for (int k = 0; k < E / 4; ++k) {
        float q[4];
        Vec4<kAct>::to_float(kCoreSpeculative ? c_raw : Vec4<kAct>::load(C_now, Tile::col0() + 4 * k), q);
#pragma unroll
        for (int e = 0; e < 4; ++e) c[4 * k + e] = q[e];
      }
      constexpr bool kScaled = kSrc == DType::kFloat8E4M3;
      const bool loads_row = epilogue_thread && epilogue_part == 0;
      RowOperands<kAct> next_row;
      if (loads_row) next_row = load_row_operands<kAct, kScaled>(p, row, slot, head0, epilogue_row);
      HeadDt next_dt = core_dt;
      if (!kCoreSpeculative && scalar_warp) next_dt = load_head_dt(p, row, slot, head0, w);
      // The first head's barrier publishes the dots before any epilogue reads them.
      dots_in.finish(w, sm.dots());

      for (int i = 0; i < num_heads; ++i) {
        const int head = head0 + i;
        const int stage = i % S;
        const int b = i & 1;
        const RowOperands<kAct> cur = next_row;
        const HeadDt cur_dt = next_dt;
        if (i + 1 < num_heads) {
          if (loads_row) next_row = load_row_operands<kAct, kScaled>(p, row, slot, head + 1, epilogue_row);
          if (scalar_warp) next_dt = load_head_dt(p, row, slot, head + 1, w);
        }
        float dt_now = 0.0f;
        if (scalar_warp) {
          dt_now = current_dt(p, cur_dt);
          window_weights(cur_dt, dt_now, w, sm.wgt(b), sm.decay(b));
        }

        mbarrier_wait(sm.full(stage), (i / S) & 1);
        if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineItem0 + i);
        const unsigned char* tile = sm.tile(stage);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float d = 0.0f;
          if (Tile::valid(r)) {
            float v[E];
            Src::to_float(*reinterpret_cast<const uint4*>(tile + (Tile::row(r) * kN + Tile::col0()) * kSrcBytes), v);
#pragma unroll
            for (int k = 0; k < E; ++k) d += v[k] * c[k];
          }
          d = row_sum<Tile::kLanesPerRow>(d);
          if (Tile::lane_in_row() == 0 && Tile::valid(r)) sm.ydot(b)[Tile::row(r)] = d;
        }
        cp_async_wait<1>();  // this head's x window (the next head's may still be in flight)
        __syncthreads();

        // Stage `stage` and x window (i + 2) % 3 (last read by head i - 1) are free again.
        if (producer && i + S < num_heads) {
          fence_proxy_async();
          issue_tile(stage, head + S);
        }
        if (i + 2 < num_heads) stage_x_window((i + 2) % 3, head + 2);
        cp_async_commit();
        if (i == 0 && tid == kCoreTicketThread) take_ticket();

        if (epilogue_thread) {
          const int pr = epilogue_row;
          const Act* xw = sm.x_window(i % 3);
          const float* wgt = sm.wgt(b);
          const float* dots = sm.dots();
          float y = 0.0f;
          for (int j = epilogue_part; j < w; j += kSplit) y += wgt[j] * dots[j] * to_float(xw[j * kP + pr]);
          if (epilogue_part == w % kSplit) y += wgt[w] * dots[w] * to_float(xw[(L - 1) * kP + pr]);  // the token
          if constexpr (kSplit == 2) y += __shfl_xor_sync(kFullMask, y, 1);
          if (epilogue_part == 0) {
            y += *sm.decay(b) * cur.scale * sm.ydot(b)[pr];
            store_output<kAct>(p, row, head, pr, y, cur);
            // Append the current token as entry w.
            static_cast<Act*>(p.x_buf)[slot * p.xb_slot_stride + head * p.xb_head_stride + w * p.xb_entry_stride + pr] = cur.x;
          }
        }
        if (scalar_warp && (tid & 31) == 0) p.dt_buf[slot * p.dtb_slot_stride + head * p.dtb_head_stride + w] = dt_now;
      }
      if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineConsumerEnd);
    }
    if constexpr (kTwoGroups) {  // chunk tid % (N / 8) of group `group + tid / (N / 8)`
      if (tid < 2 * (kN / 8)) {
        const int k = tid / (kN / 8), chunk = tid % (kN / 8);
        Act* B_dst = static_cast<Act*>(p.B_buf) + slot * p.Bb_slot_stride + (group + k) * p.Bb_group_stride + w * p.Bb_entry_stride;
        reinterpret_cast<uint4*>(B_dst)[chunk] = reinterpret_cast<const uint4*>(k == 0 ? B_now : B_now1())[chunk];
      }
    } else if (head0 == group * heads_per_group && tid < kN / 8) {  // B once per group, by its first head's CTA
      Act* B_dst = static_cast<Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride + w * p.Bb_entry_stride;
      reinterpret_cast<uint4*>(B_dst)[tid] = reinterpret_cast<const uint4*>(B_now)[tid];
    }
  } else {
    // Fold, head after head: S = e^{Lambda_w} S_c + sum_{j<=w} (wgt_j x_j) (outer) B_j in fp32 FFMA
    // (fold_rows, fold.cuh: the fold kernel's arithmetic too), 4 columns per thread (TileShape), rows in
    // batches (FoldCoef::batch_rows), the checkpoint tile
    // read from shared memory. Without a read copy the ring already holds checkpoint tiles, S heads
    // ahead. With one, the ring's read-copy tiles (issued before the cursor was known) are drained and
    // its memory holds one checkpoint tile at a time (not asked into L2 ahead: the prefetched tiles
    // were evicted before use, docs/EXPERIMENTS.md) and, at P <= 80, the next head's x window beside it
    // (kFoldStagedX). The window weights come one head ahead, as in the
    // replay; the coefficients wgt_j x_j[p] are written once per head (FoldCoef) from those x windows
    // or, elsewhere, from x rows requested into L2 a head earlier.
    // The first x window copied before the cursor was known lands in the area the fold reuses.
    if constexpr (Layout::kTensorReplay) {
      if (speculative_x) mbarrier_wait(sm.x_full(0), 0);
    } else if constexpr (kCoreSpeculative) {
      cp_async_wait_all();
      __syncthreads();
    }
    using Shape = TileShape<kP, kN>;
    using V = Vec4<kCkpt>;
    constexpr int RF = Shape::kRowsPerThread;
    using Coef = FoldCoef<kP, kN>;
    // With a read copy the fold also converts and stores the copy: batches of 4 rows there (larger ones
    // spilled the P = 128 kernels, whose budget is 128 registers).
    constexpr int kBatch = Coef::batch_rows(kCopy ? 3 : Layout::kCtasPerSm);
    // B by whole words in the fp32-checkpoint kernels without a copy (P = 64 fold 6% faster at batches of
    // 4); elsewhere at 80 registers it tripled the spills of the kernels with a bf16 read copy.
    constexpr bool kBByWords = kBatch > 4 || (kCkpt == DType::kFloat32 && !kCopy);
    static_assert(kBatch % 2 == 0 && (kBatch % 4 == 0 || kBatch == RF), "batches start at multiples of 4 rows, even");
    // An fp8 read copy is quantised a batch of rows at a time (store_fp8_copy_rows: one pair of divisions
    // per lane for the batch, instead of per row) where the batches are whole: P = 64 / 128. The
    // super120b fp8-copy fold took 8% less time (910.8 -> 834.6 us at b256, 1741.6 -> 1605.1 us at b512;
    // scripts/ab_bench.sh, session 7 run 1). Not at P = 80 (10 rows a thread, batches of 4, 4, 2): batched
    // there (the last 2 rows together) ptxas spilled 32 bytes and nano4b's fold took 1% longer in session
    // 7, and again 12 bytes and 1-2% longer with the fp32 B window (session 16, run 3: 744.6 -> 751.5 us
    // at b256).
    constexpr bool kFp8CopyByBatch = kRead == DType::kFloat8E4M3 && RF % kBatch == 0;
    // Where the batches are not whole (P = 80), the fp8 copy is quantised after the head's last row
    // instead of row by row (kFp8CopyAtEnd): each row's maximum is reduced as the row is folded and kept
    // by lane r of the row's lanes for row r (RF <= lanes per row at every P, N), the folded row goes
    // back into its place in the shared-memory tile (as stored: 16-bit checkpoints packed), and at the
    // end one pair of correctly rounded divisions per lane serves all RF rows: 2 per warp and head
    // instead of 2 RF (ncu, session 16: the nano4b fp8-copy fold issue-bound, 20 FCHK per warp and head
    // with their branches).
    // Bitwise the copy and scales of the row-by-row rule (store_read_copy4). The nano4b fp8-copy fold
    // step took 3.7% less time at batch 256, 3.5% at 512 (746.9 -> 719.5, 1420.6 -> 1371.2 us; session
    // 17, run 6).
    constexpr bool kFp8CopyAtEnd = kCopy && kRead == DType::kFloat8E4M3 && !kFp8CopyByBatch;
    static_assert(!kFp8CopyAtEnd || RF <= Shape::kLanesPerRow, "a lane per row holds its maximum");
    // kFoldYPairs: the output dots reduced two rows at a time (below), in the folds without a read copy
    // only. Session 36 (docs/EXPERIMENTS.md: the output dots by reduce-scatter, which did
    // it in every kernel): the nano4b no-copy fold step 1.5-1.8% faster (b64-512), the fp8-copy fold
    // 0.1-1.3%, but then the nano4b fp8-copy kernel's replay step at b64 took 4.5% longer (29.2 -> 30.5
    // us) with its source unchanged: ptxas laid out its replay path differently. So the copy kernels
    // keep the row-by-row loop as it was (their PTX is unchanged), and so do the 16-bit checkpoints,
    // where at P = N = 128 it made ptxas spill 24 bytes (0 before).
    constexpr bool kFoldYPairs = !kCopy && kCkpt == DType::kFloat32;
    constexpr int kCkBytes = dtype_size(kCkpt);
    constexpr uint32_t kCkTileBytes = kP * kN * kCkBytes;
    static_assert(kCkTileBytes <= S * Layout::kTileBytes, "a checkpoint tile fits in the ring");
    const int col0 = Shape::col0();
    RoundingKey rounding_key{};
    if constexpr (kRound) rounding_key = RoundingKey::load(p.rounding_seed);
    const unsigned char* checkpoint = static_cast<const unsigned char*>(p.checkpoint);
    auto checkpoint_tile = [&](int head) {
      return checkpoint + (slot * p.ck_slot_stride + head * p.ck_head_stride) * kCkBytes;
    };
    auto issue_checkpoint = [&](int head) {  // into the ring's start, counted on barrier 0
      bulk_copy_tile_to_shared<kP, kN * kCkBytes>(sm.tile(0), checkpoint_tile(head), p.ck_row_stride * kCkBytes, sm.full(0));
    };
    if constexpr (kCopy) {
      // Every thread sees the read-copy tiles' phase (0) complete before the checkpoint tile is issued
      // on barrier 0. A parity wait names the current phase or the one before it, so a thread that
      // waited for the checkpoint (parity 1) while barrier 0's read-copy tile was still landing would
      // pass at once and could read the checkpoint tile before it arrives. Only the producer used to
      // drain: a latent race, never seen in tests (the tile has usually landed by then).
      for (int s = 0; s < first_stages; ++s) mbarrier_wait(sm.full(s), 0);
      __syncthreads();
      if (producer) {
        issue_checkpoint(head0);  // barrier 0's second phase
      }
    }
    if constexpr (Layout::kFoldBFloat32) {
      stage_B_fp32<kN, kAct>(sm.B_window(), B_buf, p.Bb_entry_stride, B_now, w);
    } else {
      stage_rows<kN, true>(sm.B_window(), B_buf, p.Bb_entry_stride, B_now, w);
      cp_async_commit();
    }
    // The window's x values are read once per head, when the coefficients are written; they were
    // requested into L2 one head earlier (bulk prefetch: no registers held across the fold), or, in
    // the copy folds at P <= 80, copied into the ring beside the checkpoint tile (kFoldStagedX).
    const int window_elems = (w + 1) * kP;
    auto load_x = [&](int head, int e) {
      const int j = e / kP, pr = e - j * kP;
      return j < w ? x_buf[head * p.xb_head_stride + j * p.xb_entry_stride + pr] : x_now(head)[pr];
    };
    auto prefetch_x = [&](int head) {  // entries 0 .. w - 1, contiguous when entry_stride == P
      if (p.xb_entry_stride == kP) prefetch_l2_if_aligned(x_buf + head * p.xb_head_stride, w * kP * sizeof(Act));
    };
    // With a read copy on tensor cores at P = 64 and 80 (the ring has room there for an x window beside
    // the checkpoint tile): the coefficients' x window itself is copied into shared memory a head ahead
    // (bulk copies on x_full(1), which the fold does not otherwise use; phase i for head i), so that the
    // coefficients read it there instead of every thread of the CTA waiting for an L2 round trip at
    // each head's start. Why: ncu of the super120b fp8-copy fold (session 17, run 8) had ~14% of its
    // samples on those x loads. Measured (session 19, run 4, same-run A/B): fp8-copy fold step -4.4% /
    // -3.8% / -5.7% at batch 256 / 512 / 64 (nano4b), -0.7% / -1.5% / -1.0% (super120b); bf16-copy fold
    // -1.0..-2.9%; fp8 cycle -1.9% / -2.0% (nano4b), -0.2% / -0.5% (super120b) at batch 256 / 512; replay
    // steps unchanged. P = 128, N = 64 has the room too, but there ptxas spilled 12-20 more bytes and it
    // was not measured: P = 128 stays as it was.
    constexpr bool kFoldStagedX = kCopy && Layout::kTensorReplay && kP <= 80 &&
                                  kCkTileBytes + Layout::x_window_bytes(kMamba2MaxBufferLen) <= static_cast<size_t>(S) * Layout::kTileBytes;
    static_assert(!kFoldStagedX || S >= 2, "x_full(1) exists");
    Act* const fold_x = reinterpret_cast<Act*>(sm.tile(0) + kCkTileBytes);  // after the checkpoint tile
    auto issue_fold_x = [&](int head) { issue_x_entries(fold_x, sm.x_full(1), head, w); };  // the token in slot w
    if (producer) {
      if constexpr (kFoldStagedX) {
        issue_fold_x(head0);  // into the ring, drained above
      } else {
        prefetch_x(head0);
      }
    }
    float c4[4];
    load_act4<kAct>(C_now, col0, c4);
    RowOperands<kAct> next_row;
    HeadDt next_dt{};
    if (row_owner) next_row = load_row_operands<kAct, false>(p, row, slot, head0, tid);
    if (scalar_warp) next_dt = load_head_dt(p, row, slot, head0, w);

    for (int i = 0; i < num_heads; ++i) {
      const int head = head0 + i;
      const int b = i & 1;
      const int stage = kCopy ? 0 : i % S;
      const RowOperands<kAct> cur = next_row;
      const HeadDt cur_dt = next_dt;
      if (i + 1 < num_heads) {
        if (row_owner) next_row = load_row_operands<kAct, false>(p, row, slot, head + 1, tid);
        if (scalar_warp) next_dt = load_head_dt(p, row, slot, head + 1, w);
      }
      if (scalar_warp) window_weights(cur_dt, current_dt(p, cur_dt), w, sm.wgt(b), sm.decay(b));
      cp_async_wait<0>();  // the B window (head 0), where it is staged by cp.async
      __syncthreads();     // the window weights of this head are in; the previous head's fold is done
      if (kTwoGroups && i == heads_per_group) {
        // The CTA's second group: its B window replaces the first's (no fold reads it now; the barrier
        // after the coefficients publishes it), and its C.
        if constexpr (Layout::kFoldBFloat32) {
          stage_B_fp32<kN, kAct>(sm.B_window(), B_buf1(), p.Bb_entry_stride, B_now1(), w);
        } else {
          stage_rows<kN, true>(sm.B_window(), B_buf1(), p.Bb_entry_stride, B_now1(), w);
          cp_async_commit();
          cp_async_wait<0>();
        }
        load_act4<kAct>(C_now1(), col0, c4);
      }

      float* coef = sm.fold_coef();
      if constexpr (kFoldStagedX) mbarrier_wait(sm.x_full(1), i & 1);
      {
        const float* wgt = sm.wgt(b);
        // All loads first (up to L = 16 at once), then the products: one L2 round trip, not one per element
        // (none where kFoldStagedX: the window is in shared memory).
        constexpr int kBatchElems = (16 * kP + kThreads - 1) / kThreads;
        for (int e0 = tid; e0 < window_elems; e0 += kBatchElems * kThreads) {
          Act xv[kBatchElems];
#pragma unroll
          for (int k = 0; k < kBatchElems; ++k) {
            const int e = e0 + k * kThreads;
            if (e < window_elems) xv[k] = kFoldStagedX ? fold_x[e] : load_x(head, e);
          }
#pragma unroll
          for (int k = 0; k < kBatchElems; ++k) {
            const int e = e0 + k * kThreads;
            if (e < window_elems) coef[Coef::index(e / kP, e % kP)] = wgt[e / kP] * to_float(xv[k]);
          }
        }
      }
      if (!kFoldStagedX && producer && i + 1 < num_heads) prefetch_x(head + 1);
      __syncthreads();     // the coefficients are in
      if (kFoldStagedX && producer && i + 1 < num_heads) {  // the x window is read: the next head's goes in
        fence_proxy_async();
        issue_fold_x(head + 1);
      }
      // The tile is waited for only now, so that the coefficients' x loads (an L2 round trip) overlap its
      // copy. With a read copy that copy is issued at the end of the previous head: ncu of the nano4b
      // fp8-copy fold (session 12, run 1) had 10% of its samples on that wait and 3% on the x loads
      // after it.
      mbarrier_wait(sm.full(stage), kCopy ? (i + 1) & 1 : (i / S) & 1);
      if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineItem0 + i);

      const float decay = *sm.decay(b);
      const typename Layout::FoldB* Bw = sm.B_window();
      unsigned char* const ck_smem = sm.tile(stage);
      auto ck_row = [&](int r) { return reinterpret_cast<typename V::Raw*>(ck_smem + (Shape::row(r) * kN + col0) * kCkBytes); };
      const int64_t tile = slot * p.ck_slot_stride + head * p.ck_head_stride;
      RoundingWords rounding_words;  // kRound: rows drawn in pairs, which kBatch (even) never splits
      uint32_t row_max = 0;          // kFp8CopyAtEnd: max|v| (abs_bits) of row lane_in_row (< RF)
#pragma unroll
      for (int r0 = 0; r0 < RF; r0 += kBatch) {
        float s[kBatch][4];
        FoldOperands<kBatch> operands;
        fold_rows<kP, kN, kCkpt, kAct, kBatch, kBByWords>(s, operands, ck_smem, r0, decay, coef, Bw, w + 1);
        if constexpr (kFoldYPairs) {  // no read copy here, an fp32 checkpoint
          // The output dots y_p = S_p . C over a row's lanes two rows at a time (reduce_scatter_rows,
          // bitwise row_sum's): 6 shuffles and adds per pair of rows at N = 128 instead of 10.
          constexpr int kSpan = Shape::kLanesPerRow / 2;  // the lanes that hold one row's y after it
#pragma unroll
          for (int g0 = 0; g0 < kBatch; g0 += 2) {  // kBatch is even
            float y[2] = {0.0f, 0.0f};               // a row past RF takes part as 0
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              const int rb = g0 + q;
              const int r = r0 + rb;
              if (r >= RF) continue;
#pragma unroll
              for (int k = 0; k < 4; ++k) y[q] += s[rb][k] * c4[k];
              if constexpr (kRound) {  // stochastic rounding
                uint32_t rw[2];
                rounding_words.get<RF>(rounding_key, slot, head, r, [](int k) { return Shape::row(k); }, col0, rw);
                stochastic_round4<kCkpt>(s[rb], rw);
              }
              store4<kCkpt>(p.checkpoint, tile + Shape::row(r) * p.ck_row_stride + col0, s[rb]);
            }
            const float y_own = reduce_scatter_rows<Shape::kLanesPerRow, 2>(y, SumOp{});
            const int own = Shape::lane_in_row() / kSpan;  // the pair's row whose y this lane holds
            if (Shape::lane_in_row() % kSpan == 0 && r0 + g0 + own < RF) sm.ydot(b)[Shape::row(r0 + g0 + own)] = y_own;
          }
        } else {
#pragma unroll
          for (int rb = 0; rb < kBatch; ++rb) {
            const int r = r0 + rb;
            if (r >= RF) break;
            const int pr = Shape::row(r);
            float y = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; ++k) y += s[rb][k] * c4[k];
            if constexpr (kRound) {  // stochastic rounding; the read copy below is made from the rounded value
              uint32_t rw[2];
              rounding_words.get<RF>(rounding_key, slot, head, r, [](int k) { return Shape::row(k); }, col0, rw);
              stochastic_round4<kCkpt>(s[rb], rw);
            }
            store4<kCkpt>(p.checkpoint, tile + pr * p.ck_row_stride + col0, s[rb]);  // one whole store (store4)
            if constexpr (kFp8CopyAtEnd) {
              uint32_t bits = 0;
#pragma unroll
              for (int k = 0; k < 4; ++k) bits = max(bits, abs_bits(V::round_trip(s[rb][k])));
              bits = row_max_bits<Shape::kLanesPerRow>(bits);
              if (Shape::lane_in_row() == r) row_max = bits;
              *ck_row(r) = V::pack(s[rb]);
            } else if constexpr (kCopy && !kFp8CopyByBatch) {
              store_read_copy4<kCkpt, kRead, Shape::kLanesPerRow>(p, slot, head, pr, col0, s[rb]);
            }
            y = row_sum<Shape::kLanesPerRow>(y);
            if (Shape::lane_in_row() == 0) sm.ydot(b)[pr] = y;
          }
        }
        if constexpr (kCopy && kFp8CopyByBatch) {  // the batch's rows quantised together
          store_fp8_copy_rows<kCkpt, Shape::kLanesPerRow, kBatch>(p, slot, head, [&](int q) { return Shape::row(r0 + q); },
                                                                  col0, s);
        }
      }
      if constexpr (kFp8CopyAtEnd) {  // each thread reads back only the elements it wrote: no barrier
        const float amax = __uint_as_float(row_max);
        const float inv = fp8_inverse_scale(amax);
        const int own = Shape::lane_in_row();
        float* const scales = p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride;
        if (own < RF) scales[Shape::row(own)] = fp8_scale(amax);
#pragma unroll
        for (int r = 0; r < RF; ++r) {
          const float inv_r = __shfl_sync(kFullMask, inv, r, Shape::kLanesPerRow);
          float v[4];
          V::to_float(*ck_row(r), v);
#pragma unroll
          for (int k = 0; k < 4; ++k) v[k] = fp8_scaled(v[k], inv_r);
          store4<DType::kFloat8E4M3>(p.read_copy,
                                     slot * p.rc_slot_stride + head * p.rc_head_stride + Shape::row(r) * p.rc_row_stride + col0, v);
        }
      }
      __syncthreads();
      // The checkpoint tile just folded is free: the next one goes in.
      if (producer) {
        if constexpr (kCopy) {
          if (i + 1 < num_heads) {
            fence_proxy_async();
            issue_checkpoint(head + 1);
          }
        } else if (i + S < num_heads) {
          fence_proxy_async();
          issue_tile(stage, head + S);
        }
      }
      if (row_owner) store_output<kAct>(p, row, head, tid, sm.ydot(b)[tid], cur);
    }
  }
  if (tid == 0 && fold) {
    REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineConsumerEnd);
    take_ticket();
  }
}

}  // namespace mamba2
}  // namespace replayssm
