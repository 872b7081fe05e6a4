// Per-CTA time line of the update and step kernels: a diagnostic compiled in only by a build with
// REPLAYSSM_CTA_TIMELINE=1 (setup.py), never in a product build, where every mark below is empty and the
// kernels compile exactly as without this header.
//
// Why: at batch 64 the update and the non-fold step each take 7-9 us a launch more than their bytes at
// the batch-512 rate, where a copy of the same size loses ~1.5 us. ncu gives whole-launch averages; a
// time line per CTA says whether that time is the launch's ramp (first tiles late), its tail (CTAs that
// finish early and leave SMs idle) or a steady rate (tools/cta_timeline.py reads and summarises it).
//
// A launch writes one record of kCtaTimelineWords int64 words per CTA (blockIdx.y * gridDim.x +
// blockIdx.x; CTAs beyond the record count write nothing) into the params' cta_timeline:
//   word 0: the SM the CTA ran on; word 1: %globaltimer (ns) at the CTA's start;
//   word 2: when its first consumer warp finished (after its last item's stores were issued);
//   word 3: when another role finished (the update's producer, the split epilogue's first warp);
//   word 4: when every thread of a step CTA had read the slot's cursor (the prologue's barrier);
//   word 5: when a tensor-core replay CTA passed its set-up barrier (the window dots and C's fragments);
//   word 6 + i: when the first consumer warp saw item i's tile land (i < kCtaTimelineItems).
// A step CTA that folds marks words 2 and 6 + i from thread 0: head i's checkpoint tile landed, and
// the fold's end (before its cursor ticket).
// gdn_step / kda_step (GdnParams::cta_timeline) mark, from thread 0: word 1 the start (after the PDL
// wait), word 4 the slot and cursor known to every thread, word 5 the window terms done, word 6 the
// tile landed, word 2 the end (after the stores are issued); a folding CTA words 1, 4 and 2. A step CTA
// has one tile, so the item words after it take the set-up's chain (the links between words 1, 4 and
// 5), each marked once the value it names is in a register: word 7 thread 0 had the slot (its tile's
// copy issued), 8 thread 0 had the cursor (its ticket asked for), 9 warp 1 had the token's q, k and
// gates (lane 0, after their shared-memory stores), 10 thread 0 had its window keys' dots, 11 thread 0
// had summed its window terms (its u loads landed). A folding CTA marks 7 and 8 too.
#pragma once

#include <cstdint>

namespace replayssm {

constexpr int kCtaTimelineItems = 58;
constexpr int kCtaTimelineWords = 6 + kCtaTimelineItems;

#if REPLAYSSM_CTA_TIMELINE && defined(__CUDACC__)  // the host API layer takes the constants only

// The clock, read after every memory access before it in program order has issued (the "memory"
// clobber), so a mark placed after a store or a copy of a loaded value dates that value's arrival.
__device__ __forceinline__ int64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : : "memory");
  return static_cast<int64_t>(t);
}

__device__ __forceinline__ void cta_timeline_write(int64_t* records, int64_t ctas, int word) {
  const int64_t cta = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  if (records == nullptr || cta >= ctas || word >= kCtaTimelineWords) return;
  int64_t* record = records + cta * kCtaTimelineWords;
  if (word == 1) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    record[0] = sm;
  }
  record[word] = global_timer_ns();
}

#define REPLAYSSM_CTA_TIMELINE_MARK(params, word) \
  ::replayssm::cta_timeline_write((params).cta_timeline, (params).cta_timeline_ctas, (word))

#else

#define REPLAYSSM_CTA_TIMELINE_MARK(params, word) ((void)0)

#endif

// The words of a record (see the top of this file).
constexpr int kCtaTimelineStart = 1;
constexpr int kCtaTimelineConsumerEnd = 2;
constexpr int kCtaTimelineOtherEnd = 3;
constexpr int kCtaTimelineCursor = 4;
constexpr int kCtaTimelineSetUp = 5;
constexpr int kCtaTimelineItem0 = 6;
// gdn_step / kda_step: the set-up's chain (above).
constexpr int kCtaTimelineGdnSlot = 7;
constexpr int kCtaTimelineGdnCursorRead = 8;
constexpr int kCtaTimelineGdnToken = 9;
constexpr int kCtaTimelineGdnKeys = 10;
constexpr int kCtaTimelineGdnWindow = 11;

}  // namespace replayssm
