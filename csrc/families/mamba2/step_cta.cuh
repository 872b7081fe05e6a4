// A Mamba-2 step CTA's own facts and its first phases: which row, slot and heads it takes (the
// prologue), what it requests before the cursor is known, the cursor and the CTA's cursor ticket.
#pragma once

#include "diag/cta_timeline.cuh"
#include "families/mamba2/step_operands.cuh"

namespace replayssm {
namespace mamba2 {

// What every phase of one CTA reads: its row, slot and heads, the cursor once read, and the addresses
// of the slot's buffers. Filled in order by the phases below (step_assign, step_issue_early,
// step_read_cursor); every phase is inlined, so the members live in registers as locals would.
template <class T>
struct StepCta {
  using Act = typename T::Act;
  static constexpr int kP = T::kP;
  static constexpr int kN = T::kN;

  const Mamba2Params& p;
  const int L;  // buffer_len
  const typename T::Smem sm;
  int row = 0;
  int tid = 0;
  // Roles, spread so that no warp arrives late at a per-head barrier: the last warp derives each head's
  // window weights, warp 6's first lane refills the ring, the first kP * kSplit threads (whole warps)
  // finish the CUDA-core replay's output rows, kSplit threads per row, and thread p < P the fold's.
  static constexpr int kSplit = 2 * kP <= kThreads - 32 ? 2 : 1;
  bool scalar_warp = false;
  bool producer = false;
  bool row_owner = false;  // the fold's epilogue: thread p owns row p
  bool epilogue_thread = false;
  int epilogue_row = 0;
  int epilogue_part = 0;
  int part = 0;  // with the fold split: which part of its row's replay-sized block this CTA folds
  int heads_per_group = 0;
  // This CTA's heads: head0 .. head0 + num_heads - 1, one group (a block of heads_per_cta, or with the
  // fold split, part `part` of it) or, kTwoGroups, two whole groups, `group` the first.
  int num_heads = 0;
  int group = 0;
  int head0 = 0;
  int64_t slot = 0;
  // The replay source (read copy or checkpoint) of the slot; the ring's first stages.
  const unsigned char* src = nullptr;
  int64_t src_slot = 0, src_head_stride = 0, src_row_stride = 0;
  int first_stages = 0;
  const Act* x_buf = nullptr;  // the slot's x entries
  const Act* B_buf = nullptr;  // the slot's B entries of `group`
  // The tensor-core replay's first x window went in before the cursor (contiguous x entries only).
  bool speculative_x = false;
  const Act* B_now = nullptr;  // the current token's B and C of `group`
  const Act* C_now = nullptr;
  int w = 0;  // the cursor: buffered entries before the current token's
  bool fold = false;

  __device__ StepCta(const Mamba2Params& params, unsigned char* smem_base)
      : p(params), L(params.buffer_len), sm(smem_base, L) {}

  // Which of the CTA's groups head head0 + i is in (0 or 1).
  __device__ int group_of(int i) const { return T::kTwoGroups && i >= heads_per_group ? 1 : 0; }
  // Head `head`'s source tile into ring stage `stage` (one bulk copy, or one per row).
  __device__ void issue_tile(int stage, int head) const {
    bulk_copy_tile_to_shared<kP, kN * T::kSrcBytes>(sm.tile(stage), src + (src_slot + head * src_head_stride) * T::kSrcBytes,
                                                    src_row_stride * T::kSrcBytes, sm.full(stage));
  }
  __device__ const Act* x_now(int head) const {
    return static_cast<const Act*>(p.x) + row * p.x_row_stride + head * p.x_head_stride;
  }
  // The second group's B window (the buffer's entries), B and C (kTwoGroups), derived where used from
  // what stays live anyway (pointers kept from the prologue to the fold's second group made ptxas spill).
  __device__ const Act* B_buf1() const {
    return static_cast<const Act*>(p.B_buf) + slot * p.Bb_slot_stride + (group + 1) * p.Bb_group_stride;
  }
  __device__ const Act* B_now1() const {
    return static_cast<const Act*>(p.B) + row * p.B_row_stride + (group + 1) * p.B_group_stride;
  }
  __device__ const Act* C_now1() const {
    return static_cast<const Act*>(p.C) + row * p.C_row_stride + (group + 1) * p.C_group_stride;
  }
  // The CTA's cursor ticket (cache/cursor.cuh): the CTA that draws the slot's last writes the new cursor.
  // Taken once every thread of the CTA has read the cursor (step_read_cursor's barrier), where:
  //   - a replaying CTA early, while its first tiles are in flight: at its end the atomic's round trip
  //     sits on its tail (the replay step 2-8% slower at batch 1); but not right after the barrier by
  //     thread 0, or warp 0 would wait for the round trip before its part of the set-up, and the whole
  //     CTA for warp 0. The tensor-core replay takes it after its set-up barrier, in a warp with no part
  //     in the replay (TensorReplay::kTicketThread); the CUDA-core replay after its first per-head
  //     barrier (kCoreTicketThread);
  //   - a folding CTA at its end: taken early, thread 0 waited for it before the fold's coefficient
  //     loads, the fp8-copy fold step ran 2-4% slower, and ptxas spilled more in the fp32-checkpoint
  //     fp8-copy kernels.
  __device__ void take_ticket() const {
    const int32_t old = atomicAdd(p.num_committed + slot, kTicket);
    if ((old >> 16) == p.heads / num_heads - 1) atomicExch(p.num_committed + slot, fold ? 0 : w + 1);
  }
  // Head `head`'s x window by bulk copies on `bar`: the buffered entries 0..w - 1 into slots 0..w - 1 of
  // dst, the current token into slot now_slot (the API guarantees 16-byte aligned x and x_buf rows, and
  // an entry is P, a multiple of 16, activations). The tensor-core replay's stages and the copy fold's.
  __device__ void issue_x_entries(Act* dst, uint64_t* bar, int head, int now_slot) const {
    const Act* buffered = x_buf + head * p.xb_head_stride;
    mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(w + 1) * T::kEntryBytes);
    if (p.xb_entry_stride == kP) {
      if (w > 0) bulk_copy_to_shared(dst, buffered, static_cast<uint32_t>(w) * T::kEntryBytes, bar);
    } else {
      for (int j = 0; j < w; ++j) bulk_copy_to_shared(dst + j * kP, buffered + j * p.xb_entry_stride, T::kEntryBytes, bar);
    }
    bulk_copy_to_shared(dst + now_slot * kP, x_now(head), T::kEntryBytes, bar);
  }
  // The current token's x (row pr of head `head`) appended as entry w.
  __device__ void append_x(int head, int pr, Act x) const {
    static_cast<Act*>(p.x_buf)[slot * p.xb_slot_stride + head * p.xb_head_stride + w * p.xb_entry_stride + pr] = x;
  }
  __device__ void write_zero_outputs() const {
    for (int i = 0; i < num_heads; ++i) write_zero_output<T::kAct>(p, row, head0 + i);
  }
};

// ---- Prologue: the CTA's barriers, before anything global --------------------------------------
// Thread 0 initialises every mbarrier of the CTA: shared memory only, so it may run before the wait of
// a programmatic dependent launch (common/programmatic_launch.cuh), while the kernel before this one in
// the stream ends. Every CTA initialises them, even one that exits in step_assign (no copy is issued on
// them there). The other threads use them after step_read_cursor's barrier.
template <class T>
__device__ __forceinline__ void step_init_barriers(const StepCta<T>& c) {
  using Roles = typename T::Roles;
  constexpr int S = T::kStages;
  const typename T::Smem& sm = c.sm;
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; ++s) mbarrier_init(sm.full(s), 1);
  if constexpr (T::kTensorReplay) {
    // Every lane that read or wrote arrives itself (no elected lane after __syncwarp): each lane's own
    // arrive releases its own accesses, which is also what compute-sanitizer's racecheck can follow.
    for (int s = 0; s < S; ++s) {
      mbarrier_init(sm.empty(s), 32 * (Roles::kConsumers + Roles::kEpilogueWarps));
      mbarrier_init(sm.x_full(s), 1);  // the producer
    }
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(sm.weights_written(b), 32);  // the scalar warp
      mbarrier_init(sm.weights_read(b), 32 * Roles::kWindowReaders);
      if constexpr (T::kSplitEpilogue) {
        mbarrier_init(sm.dots_ready(b), 32 * Roles::kConsumers);
        mbarrier_init(sm.dots_free(b), 32 * Roles::kEpilogueWarps);
      }
    }
  }
  fence_barrier_init();
}

// ---- Prologue, while a CTA launched with PDL waits: L2 warmed (Mamba2StepLaunch::warm_l2) ---------
// Warp 0 asks L2 for what the CTA's first round trips read: the slot's cursor, the source tiles of its
// first heads (as many as the ring's stages), their x windows, the group's B window and their dt
// windows (every entry the buffer may hold), an fp8 copy's row scales. The slot is the one its row
// names as read through L2 now (peek_slot: the kernel ahead may still write the slots, and a stale slot
// only wastes the prefetches); step_assign's heads, from the grid alone (the unordered kernels).
// Prefetches only, none into the SM's L1, so nothing the CTA reads after the wait can be stale.
template <class T>
__device__ __forceinline__ void step_warm_l2(const Mamba2Params& p, const Mamba2StepLaunch& launch) {
  static_assert(!T::kOrdered, "an ordered CTA's row comes from the order pass");
  using Act = typename T::Act;
  constexpr int kP = T::kP, kN = T::kN;
  const int lane = threadIdx.x % 32;
  const int64_t slot = peek_slot(p, static_cast<int>(blockIdx.y));
  if (slot < 0) return;
  const int heads_per_group = p.heads / p.groups;
  const int blocks_per_group = T::kTwoGroups ? 1 : heads_per_group / launch.heads_per_cta;
  const int group = T::kTwoGroups ? blockIdx.x * 2 : blockIdx.x / blocks_per_group;
  const int head0 = group * heads_per_group + (blockIdx.x % blocks_per_group) * launch.heads_per_cta;
  const int first = launch.heads_per_cta < T::kStages ? launch.heads_per_cta : T::kStages;
  const unsigned char* src = static_cast<const unsigned char*>(T::kCopy ? p.read_copy : p.checkpoint);
  const int64_t src_slot = T::kCopy ? slot * p.rc_slot_stride : slot * p.ck_slot_stride;
  const int64_t head_stride = T::kCopy ? p.rc_head_stride : p.ck_head_stride;
  const int64_t row_stride = T::kCopy ? p.rc_row_stride : p.ck_row_stride;
  if (lane == 0) prefetch_line_l2(p.num_committed + slot);
  if (lane < first) {
    const int head = head0 + lane;
    prefetch_rows_l2(src + (src_slot + head * head_stride) * T::kSrcBytes, kP, kN * T::kSrcBytes, row_stride * T::kSrcBytes);
    if constexpr (T::kScaled) prefetch_l2_if_aligned(p.read_scale + slot * p.rs_slot_stride + head * p.rs_head_stride, kP * sizeof(float));
    prefetch_line_l2(p.dt_buf + slot * p.dtb_slot_stride + head * p.dtb_head_stride);
  }
  // The x windows of the first heads and the B window, an entry a lane.
  const Act* x_buf = static_cast<const Act*>(p.x_buf) + slot * p.xb_slot_stride;
  const Act* B_buf = static_cast<const Act*>(p.B_buf) + slot * p.Bb_slot_stride + group * p.Bb_group_stride;
  for (int j = lane; j < p.buffer_len; j += 32) {
    prefetch_l2_if_aligned(B_buf + j * p.Bb_entry_stride, kN * sizeof(Act));
    for (int i = 0; i < first; ++i) {
      prefetch_l2_if_aligned(x_buf + (head0 + i) * p.xb_head_stride + j * p.xb_entry_stride, kP * sizeof(Act));
    }
  }
}

// ---- Prologue: the CTA's row, slot and heads ----------------------------------------------------
// false: the CTA has nothing to do (a helper of a row that does not fold, or a row that touches
// nothing, whose outputs it has written as zeros).
//
// After the order pass (staggered flush) the folding rows come first, their slots resolved. With a
// fold split the grid's first rows are helpers: helper row e serves list position e / (split - 1), the
// part 1 + e % (split - 1) of each of its replay-sized blocks, if the pass marked that row (a folding
// row within the split's count) and exits otherwise; a marked row's own CTAs take part 0.
template <class T>
__device__ __forceinline__ bool step_assign(StepCta<T>& c, const Mamba2StepLaunch& launch) {
  const Mamba2Params& p = c.p;
  int order_pos = blockIdx.y;
  int part = 0;
  if constexpr (T::kOrdered) {
    if (launch.fold_split > 1) {
      const int helpers_per_row = launch.fold_split - 1;
      const int helper_rows = launch.fold_split_rows * helpers_per_row;
      if (static_cast<int>(blockIdx.y) < helper_rows) {
        order_pos = blockIdx.y / helpers_per_row;
        part = 1 + blockIdx.y % helpers_per_row;
      } else {
        order_pos = blockIdx.y - helper_rows;
      }
    }
  }
  const int order_entry = T::kOrdered ? p.row_order[order_pos] : 0;
  const bool fine_fold = T::kOrdered && (order_entry & kFineFoldRow) != 0;
  if (T::kOrdered && part > 0 && !fine_fold) return false;  // a helper of a row that is not folding (or not split)
  c.part = part;
  c.row = T::kOrdered ? (order_entry & ~kFineFoldRow) : static_cast<int>(blockIdx.y);
  c.tid = threadIdx.x;
  c.scalar_warp = c.tid >= kThreads - 32;
  c.producer = c.tid == kThreads - 64;
  c.row_owner = c.tid < T::kP;
  c.epilogue_thread = c.tid < T::kP * StepCta<T>::kSplit;
  c.epilogue_row = c.tid / StepCta<T>::kSplit;
  c.epilogue_part = c.tid % StepCta<T>::kSplit;
  c.heads_per_group = p.heads / p.groups;
  c.num_heads = fine_fold ? launch.heads_per_cta / launch.fold_split : launch.heads_per_cta;
  const int blocks_per_group = T::kTwoGroups ? 1 : c.heads_per_group / launch.heads_per_cta;
  c.group = T::kTwoGroups ? blockIdx.x * 2 : blockIdx.x / blocks_per_group;
  c.head0 = c.group * c.heads_per_group + (blockIdx.x % blocks_per_group) * launch.heads_per_cta + part * c.num_heads;
  c.slot = T::kOrdered ? p.row_order[p.batch + order_pos] : resolve_slot(p, c.row);
  if (c.slot < 0) {
    c.write_zero_outputs();
    return false;
  }
  return true;
}

// What the CTA's first head needs that does not depend on the cursor, requested before it: the window
// dots' loads (WindowDots) and, for the tensor-core replay's scalar warp, its first per-head scalars
// and dt windows (every entry the buffer may hold; window_weights ignores those from w on).
template <class T>
struct StepEarly {
  WindowDots<T::kN, T::kAct> dots_in;
  HeadScalars scalars_first{}, scalars_next{};  // heads 0 .. 31 of the CTA, the 32 after
  DtWindow dt_even{}, dt_odd{};                 // heads 0 and 1
};

// ---- Before the cursor: the first S source tiles, the first x window, the window dots -------------
// Tensor-core replay: a stage's x window holds the buffered entries 0..w - 1 in slots 0..w - 1 and the
// current token in slot L - 1 (w <= L - 1, so they never meet). The first head's window is copied
// before the cursor is known, with every entry the buffer may hold (0..L - 2; contiguous entries
// only): the first head then waits for one DRAM round trip (the cursor's), not two. The entries from
// w on are copied for nothing; a fold step waits for the copy before reusing the area.
template <class T>
__device__ __forceinline__ void step_issue_early(StepCta<T>& c, StepEarly<T>& e) {
  using Act = typename T::Act;
  constexpr int kP = T::kP, kN = T::kN, S = T::kStages;
  const Mamba2Params& p = c.p;
  const typename T::Smem& sm = c.sm;
  const int L = c.L;
  const int tid = c.tid;
  c.src = static_cast<const unsigned char*>(T::kCopy ? p.read_copy : p.checkpoint);
  c.src_slot = T::kCopy ? c.slot * p.rc_slot_stride : c.slot * p.ck_slot_stride;
  c.src_head_stride = T::kCopy ? p.rc_head_stride : p.ck_head_stride;
  c.src_row_stride = T::kCopy ? p.rc_row_stride : p.ck_row_stride;
  c.first_stages = c.num_heads < S ? c.num_heads : S;
  c.x_buf = static_cast<const Act*>(p.x_buf) + c.slot * p.xb_slot_stride;
  c.B_buf = static_cast<const Act*>(p.B_buf) + c.slot * p.Bb_slot_stride + c.group * p.Bb_group_stride;
  c.speculative_x = T::kTensorReplay && p.xb_entry_stride == kP;
  if (tid == 0) {  // the barriers are initialised (step_init_barriers, by this thread)
    for (int s = 0; s < c.first_stages; ++s) c.issue_tile(s, c.head0 + s);
    if (c.speculative_x) {
      Act* dst = sm.x_window(0);
      mbarrier_arrive_expect_tx(sm.x_full(0), static_cast<uint32_t>(L) * T::kEntryBytes);
      if (L > 1) bulk_copy_to_shared(dst, c.x_buf + c.head0 * p.xb_head_stride, static_cast<uint32_t>(L - 1) * T::kEntryBytes, sm.x_full(0));
      bulk_copy_to_shared(dst + (L - 1) * kP, c.x_now(c.head0), T::kEntryBytes, sm.x_full(0));
    }
  }
  c.B_now = static_cast<const Act*>(p.B) + c.row * p.B_row_stride + c.group * p.B_group_stride;
  c.C_now = static_cast<const Act*>(p.C) + c.row * p.C_row_stride + c.group * p.C_group_stride;
  if (T::kTwoGroups && tid == kThreads - 32) {  // asked into L2 now, read after the cursor
    if (p.Bb_entry_stride == kN) prefetch_l2_if_aligned(c.B_buf1(), static_cast<size_t>(L - 1) * kN * sizeof(Act));
    prefetch_l2_if_aligned(c.B_now1(), kN * sizeof(Act));
    prefetch_l2_if_aligned(c.C_now1(), kN * sizeof(Act));
  }
  e.dots_in.issue(c.B_buf, p.Bb_entry_stride, c.B_now, c.C_now, L);
  if (T::kTensorReplay && c.scalar_warp) {
    const int end = c.head0 + c.num_heads;
    e.scalars_first = load_head_scalars(p, c.row, c.head0 + (tid & 31), end);
    e.scalars_next = load_head_scalars(p, c.row, c.head0 + 32 + (tid & 31), end);
    e.dt_even = load_dt_window(p, c.slot, c.head0, L - 1);
    if (c.num_heads > 1) e.dt_odd = load_dt_window(p, c.slot, c.head0 + 1, L - 1);
  }
}

// ---- The cursor ---------------------------------------------------------------------------------
// false: a cursor with no room; the CTA touches nothing (but lets its copies land before it exits)
// and writes zero outputs.
template <class T>
__device__ __forceinline__ bool step_read_cursor(StepCta<T>& c) {
  const Mamba2Params& p = c.p;
  c.w = p.num_committed[c.slot] & kCursorMask;
  __syncthreads();  // the barriers are initialised; every thread has read the cursor
  if (c.tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineCursor);
  if (c.w >= c.L) {
    if (c.tid == 0) {
      for (int s = 0; s < c.first_stages; ++s) mbarrier_wait(c.sm.full(s), 0);
      if (c.speculative_x) mbarrier_wait(c.sm.x_full(0), 0);
    }
    cp_async_wait_all();
    c.write_zero_outputs();
    return false;
  }
  c.fold = step_folds(p, c.w, c.L);
  return true;
}

// ---- After a replay: the current token's B appended as entry w ----------------------------------
// Once per group, by its first head's CTA (a two-group CTA: both its groups').
template <class T>
__device__ __forceinline__ void step_append_B(const StepCta<T>& c) {
  using Act = typename T::Act;
  constexpr int kN = T::kN;
  const Mamba2Params& p = c.p;
  const int tid = c.tid;
  if constexpr (T::kTwoGroups) {  // chunk tid % (N / 8) of group `group + tid / (N / 8)`
    if (tid < 2 * (kN / 8)) {
      const int k = tid / (kN / 8), chunk = tid % (kN / 8);
      Act* B_dst = static_cast<Act*>(p.B_buf) + c.slot * p.Bb_slot_stride + (c.group + k) * p.Bb_group_stride + c.w * p.Bb_entry_stride;
      reinterpret_cast<uint4*>(B_dst)[chunk] = reinterpret_cast<const uint4*>(k == 0 ? c.B_now : c.B_now1())[chunk];
    }
  } else if (c.head0 == c.group * c.heads_per_group && tid < kN / 8) {
    Act* B_dst = static_cast<Act*>(p.B_buf) + c.slot * p.Bb_slot_stride + c.group * p.Bb_group_stride + c.w * p.Bb_entry_stride;
    reinterpret_cast<uint4*>(B_dst)[tid] = reinterpret_cast<const uint4*>(c.B_now)[tid];
  }
}

}  // namespace mamba2
}  // namespace replayssm
