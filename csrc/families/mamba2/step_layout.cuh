// The compile-time facts of a Mamba-2 step CTA: the warp roles of the tensor-core replay
// (TensorReplay), the shared-memory layout (StepLayout, with StepSmem's accessors) and the traits type
// that the step kernel's phases take (StepTraits, formed from the kernel's template arguments).
#pragma once

#include <type_traits>

#include "common/bulk_copy.cuh"
#include "families/mamba2/fold.cuh"
#include "families/mamba2/params.h"
#include "families/mamba2/tensor_dot.cuh"
#include "families/mamba2/tile.cuh"

namespace replayssm {
namespace mamba2 {

constexpr unsigned kFullMask = 0xffffffffu;

// Warp roles of the tensor-core replay (tile_on_tensor_cores, or kTf32Replay): the first kConsumers
// warps each own kTilesPerWarp tiles of 16 output rows (reduction on tensor cores, their rows' x
// windows, epilogue); one thread of warp 6 refills the ring; warp 7 derives the window weights; the
// first warp after the consumers takes the cursor ticket (the producer's thread where that warp has a
// role). No CTA barrier per head: each hand-over is an mbarrier (tile landed / consumed, weights
// written / read), so a consumer warp waits only for its own inputs, never for the slowest warp of the
// CTA.
//
// kSplitEpilogue (where the warps between the consumers and the producer's have a thread per row: P =
// 64, warps 4 and 5): the consumers only reduce the tile (S C) into shared memory, double-buffered by
// head parity (head dots, published on dots_ready, handed back on dots_free), and those warps take the
// window sum and the epilogue, a thread per row, so that the two halves of consecutive heads overlap
// instead of following each other in one warp. Why: with the per-head work switched off part by part,
// the consumers' dot and their window sum with the epilogue each cost the fp8 step about an eighth of
// its time while the producer alone streamed near the copy rate; split, the two overlap
// (docs/TUNING.md, "Split epilogue").
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
// (TensorDot) by the warp-specialised kernel: the only replay of an fp32 checkpoint without a copy.
template <int kP, int kN, DType kSrc, DType kAct, bool kTf32Replay = false>
struct StepLayout {
  static_assert(!kTf32Replay || kSrc == DType::kFloat32, "the tf32 replay reads an fp32 source");
  using Act = typename Storage<kAct>::type;
  static constexpr int kTileBytes = kP * kN * dtype_size(kSrc);
  // The tensor-core replay also has a barrier per stage for "tile consumed" and one for "x window
  // landed", and two pairs for the window weights (written / read, double-buffered).
  static constexpr bool kTensorReplay = tile_on_tensor_cores(kSrc, kAct) || kTf32Replay;
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
  // Not in the split epilogue of a bf16 copy: there it measured slower than the FFMA form (the fp8
  // copy's step gains 3-5%).
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
  // converting 4 activations per window entry and batch of rows (the fp8-copy fold step is issue-bound,
  // and those conversions were ~6% of its instructions).
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

// The step kernel's template arguments and what follows from them: the one type its phases take.
//   kP, kN          head_dim, state_dim
//   kCkpt           the checkpoint's dtype (fp32, bf16, fp16)
//   kCopy, kRead    whether a read copy exists, and its dtype (bf16, fp16, fp8 e4m3)
//   kAct            the activations' dtype (bf16, fp16)
//   kRound          the fold rounds a 16-bit checkpoint stochastically (p.rounding_seed,
//                   stochastic_rounding.cuh). A template flag, not a branch, so that kernels without it
//                   compile as if it did not exist: inlined in a run-time branch, or called out of line,
//                   the Philox draw spilled the P = 80 kernels' other paths.
//   kOrdered        CTA row y takes the batch row and slot the order pass put at y (p.row_order), not
//                   row y. A template flag too: a row read from memory holds a register for the whole
//                   kernel where blockIdx.y needs none, and the lock-step fp8-copy fold step ran 3-5%
//                   slower when every kernel read it.
//   kTf32Replay     the fp32 checkpoint without a copy, replayed on tensor cores (StepLayout); its folds
//                   are the CUDA-core fold.
//   kTwoGroups      two whole groups a CTA (read copies only; heads_per_cta is twice a group's heads). A
//                   kernel of its own so that the others compile without it: a group switch in the
//                   per-head loops made the fp8-copy step 3.5-8% slower.
template <int P, int N, DType Ckpt, bool Copy, DType Read, DType ActType, bool Round, bool Ordered, bool Tf32Replay,
          bool TwoGroups>
struct StepTraits {
  static constexpr int kP = P;
  static constexpr int kN = N;
  static constexpr DType kCkpt = Ckpt;
  static constexpr bool kCopy = Copy;
  static constexpr DType kRead = Read;
  static constexpr DType kAct = ActType;
  static constexpr bool kRound = Round;
  static constexpr bool kOrdered = Ordered;
  static constexpr bool kTf32Replay = Tf32Replay;
  static constexpr bool kTwoGroups = TwoGroups;
  static_assert(!kRound || kCkpt != DType::kFloat32, "stochastic rounding is for 16-bit checkpoints");
  static_assert(!kTf32Replay || (kCkpt == DType::kFloat32 && !kCopy), "tf32 replay: fp32 checkpoint, no copy");
  static_assert(!kTwoGroups || (kCopy && !kOrdered), "two-group CTAs: the read copies' unordered step");

  using Act = typename Storage<kAct>::type;
  static constexpr DType kSrc = kCopy ? kRead : kCkpt;  // what a replay step reads
  static constexpr int kSrcBytes = dtype_size(kSrc);
  static constexpr bool kScaled = kSrc == DType::kFloat8E4M3;  // an fp8 copy: rows carry a scale
  using Layout = StepLayout<kP, kN, kSrc, kAct, kTf32Replay>;
  using Smem = StepSmem<kP, kN, kSrc, kAct, kTf32Replay>;
  static constexpr int kStages = Layout::kStages;
  static constexpr bool kTensorReplay = Layout::kTensorReplay;
  static constexpr bool kSplitEpilogue = Layout::kSplitEpilogue;
  static constexpr bool kWindowMma = Layout::kWindowMma;
  using Roles = TensorReplay<kP>;                         // the tensor-core replay's warps
  static constexpr uint32_t kEntryBytes = kP * sizeof(Act);  // one x entry (a multiple of 16 bytes)
};

}  // namespace mamba2
}  // namespace replayssm
