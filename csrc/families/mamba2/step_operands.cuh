// The per-head operands of a Mamba-2 step CTA and the small routines that move them: staging the x and
// B windows, the row operands of an output row, the scalar warp's dt and the window weights it derives,
// the window dots B_j . C, and the output row's store.
#pragma once

#include "families/mamba2/step_layout.cuh"

namespace replayssm {
namespace mamba2 {

// Copy entries 0..w of one kind of row (x or B) to shared memory with cp.async (no commit): entries
// < w from the buffer into slots 0..w - 1, entry w from the current token into slot w (kTokenAtW: the
// fold's B window) or into slot now_slot (L - 1 for the replay's x windows, the slot where the
// tensor-core replay's windows, the first copied before w is known, keep it too). A template flag
// rather than now_slot = w, so that the fold's code stays as it was measured.
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
// branches, had a quarter of a consumer's per-head samples in the fp8 step, 41% of them
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

}  // namespace mamba2
}  // namespace replayssm
