// Hopper bulk copies (the 1-D form of TMA) and the shared-memory barriers that count their bytes,
// as thin inline-PTX wrappers. sm_90 and later (also sm_100a).
//
// Pattern: one thread arms a barrier with the bytes it is about to request (arrive_expect_tx) and
// issues the copies; every thread that needs the data waits on the barrier's current phase parity.
// The copy engine writes shared memory through the async proxy, so a buffer that threads have read
// with ordinary loads is handed back to it only after a CTA barrier and fence_proxy_async().
#pragma once

#include <cstddef>
#include <cstdint>

namespace replayssm {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}

// Makes barrier initialisation visible to the copy engine (the async proxy).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Orders this thread's earlier shared-memory accesses (and those it synchronised with) before
// later async-proxy writes to the same memory.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// One arrival that also announces `bytes` of copies the phase must wait for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// One arrival that announces no bytes: a consumer handing a buffer back, or a producer completing a
// phase it has nothing to copy for.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

// Named CTA barriers 1..15 (0 is __syncthreads'): `threads` (a multiple of 32) must arrive, counted by
// whole warps (a warp whose other lanes have exited counts as arrived with its one running lane).
// Readers hand a buffer to a waiting thread with one arrive instruction per warp; an mbarrier would take
// one arrival per thread (racecheck does not let one elected lane's arrival stand for its warp).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Blocks until the phase with the given parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred ready;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
        " selp.u32 %0, 1, 0, ready;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// Global -> shared copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) whose
// completion is counted on `bar`.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_address(dst)),
      "l"(src), "r"(bytes), "r"(smem_address(bar))
      : "memory");
}

// A kRows x kRowBytes tile from global memory (rows `row_stride_bytes` apart) to contiguous shared
// memory, counted on `bar` (which this thread arms for the whole tile): one bulk copy when the rows
// are contiguous, one per row otherwise (strided slot pools).
template <int kRows, int kRowBytes>
__device__ __forceinline__ void bulk_copy_tile_to_shared(unsigned char* dst, const unsigned char* src,
                                                         int64_t row_stride_bytes, uint64_t* bar) {
  constexpr uint32_t kBytes = static_cast<uint32_t>(kRows) * kRowBytes;
  mbarrier_arrive_expect_tx(bar, kBytes);
  if (row_stride_bytes == kRowBytes) {
    bulk_copy_to_shared(dst, src, kBytes, bar);
  } else {
    for (int r = 0; r < kRows; ++r) bulk_copy_to_shared(dst + r * kRowBytes, src + r * row_stride_bytes, kRowBytes, bar);
  }
}

// Asks the copy engine to bring `bytes` (a multiple of 16, 16-byte aligned) into L2; nothing waits.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// bulk_prefetch_l2 where the copy engine allows it (16-byte aligned, a non-zero multiple of 16 bytes);
// a hint only, so anything else is simply not prefetched.
__device__ __forceinline__ void prefetch_l2_if_aligned(const void* src, size_t bytes) {
  if (bytes > 0 && bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    bulk_prefetch_l2(src, static_cast<uint32_t>(bytes));
  }
}

// Per-thread 16-byte asynchronous copies (cp.async, sm_80+), in commit groups: a thread can keep
// several groups in flight and wait for all but the newest `kPending`.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* global_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(smem_dst)), "l"(global_src)
               : "memory");
}
// The same for one 4-byte element (scalars per buffer entry, whose rows need not be 16-byte aligned);
// the .ca form, the only one that takes fewer than 16 bytes.
__device__ __forceinline__ void cp_async4(void* smem_dst, const void* global_src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_address(smem_dst)), "l"(global_src)
               : "memory");
}
// The same for 8 bytes (8-byte aligned).
__device__ __forceinline__ void cp_async8(void* smem_dst, const void* global_src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_address(smem_dst)), "l"(global_src)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace replayssm
