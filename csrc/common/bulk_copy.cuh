// Hopper bulk copies (the 1-D form of TMA), the shared-memory barriers that count their bytes, and
// cp.async. sm_90 and later (also sm_100a). CUTLASS / CuTe provide the copy atoms, the barrier
// initialisation and the producer's arrive; the pieces that stay hand-written say why below (and
// docs/DESIGN.md, "Hand-written primitives").
//
// Pattern: one thread arms a barrier with the bytes it is about to request (arrive_expect_tx) and
// issues the copies; every thread that needs the data waits on the barrier's current phase parity.
// The copy engine writes shared memory through the async proxy, so a buffer that threads have read
// with ordinary loads is handed back to it only after a CTA barrier and fence_proxy_async().
//
// Compiler ordering: a wait is followed, and a consumer's arrive preceded, by ordinary loads and
// stores of the buffer it guards, so those wrappers carry a "memory" clobber (the compiler moves no
// memory access across them). CUTLASS's ClusterBarrier::wait / arrive and cute's
// fence_view_async_shared carry none, and its wait spins inside the asm with a suspend-time hint:
// the wait, the releasing arrive and the proxy fence stay ours.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

// cute compiles its copy atoms to a trap where the target lacks them: fail at compile time instead.
#if defined(__CUDA_ARCH__) && !defined(CUTE_ARCH_TMA_SM90_ENABLED)
#error "replayssm kernels need Hopper bulk copies (TMA): compile for sm_90a or sm_100a"
#endif

namespace replayssm {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A barrier expecting `arrivals` arrivals per phase.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  cutlass::arch::ClusterBarrier::init(bar, arrivals);
}

// Makes barrier initialisation visible to the copy engine (the async proxy).
__device__ __forceinline__ void fence_barrier_init() { cutlass::arch::fence_barrier_init(); }

// Orders this thread's earlier shared-memory accesses (and those it synchronised with) before
// later async-proxy writes to the same memory. Ours: a compiler memory barrier too (see the top).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The producer's arrival that also announces `bytes` of copies the phase must wait for (nothing the
// producer itself loads or stores is ordered by it: the copies that follow are).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(bar, bytes);
}

// `bytes` of an armed phase counted as landed, with no copy and no arrival: a thread that armed the
// barrier for copies it then does not issue settles their bytes, so that the phase completes when the
// copies it did issue land. (CUTLASS's ClusterTransactionBarrier::complete_transaction addresses a
// barrier of any CTA of the cluster, at cluster scope; ours is always the CTA's own.)
__device__ __forceinline__ void mbarrier_complete_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.complete_tx.shared::cta.relaxed.cta.b64 [%1], %0;\n" ::"r"(bytes), "r"(smem_address(bar))
               : "memory");
}

// One arrival that announces no bytes: a consumer handing a buffer back (after its ordinary loads of
// it: ours, a compiler memory barrier), or a producer completing a phase it has nothing to copy for.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

// Named CTA barriers 1..15 (0 is __syncthreads'): `threads` (a multiple of 32) must arrive, counted by
// whole warps (a warp whose other lanes have exited counts as arrived with its one running lane).
// Readers hand a buffer to a waiting thread with one arrive instruction per warp; an mbarrier would take
// one arrival per thread (racecheck does not let one elected lane's arrival stand for its warp).
// `barrier.arrive` / `barrier.sync`, not CUTLASS NamedBarrier's `bar.arrive` / `bar.sync` (the .aligned
// forms): those require every thread to execute the same barrier instruction, which the update's
// producer warp, one lane left, does not.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Blocks until the phase with the given parity has completed. Ours (see the top).
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

// Whether the phase with the given parity has completed, without waiting (a producer thread that asks
// for the next copy as soon as an earlier one has landed, gdn/step_kernel.cuh).
__device__ __forceinline__ bool mbarrier_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred ready;\n"
      " mbarrier.test_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
      " selp.u32 %0, 1, 0, ready;\n}\n"
      : "=r"(done)
      : "r"(smem_address(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Global -> shared copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) whose
// completion is counted on `bar`.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  cute::SM90_BULK_COPY_G2S::copy(src, bar, dst, static_cast<int32_t>(bytes));
}

// Rows first .. first + count - 1 of kRowBytes from global memory (rows `row_stride_bytes` apart) to the
// same rows of contiguous shared memory, counted on `bar`, which the caller arms: one bulk copy when the
// rows are contiguous, one per row otherwise (strided slot pools). A tile asked for in chunks, each on its
// own barrier, takes it a chunk at a time.
template <int kRowBytes>
__device__ __forceinline__ void bulk_copy_row_range_to_shared(unsigned char* dst, const unsigned char* src, int first,
                                                              int count, int64_t row_stride_bytes, uint64_t* bar) {
  if (row_stride_bytes == kRowBytes) {
    bulk_copy_to_shared(dst + first * kRowBytes, src + first * row_stride_bytes, static_cast<uint32_t>(count) * kRowBytes, bar);
  } else {
    for (int r = first; r < first + count; ++r) bulk_copy_to_shared(dst + r * kRowBytes, src + r * row_stride_bytes, kRowBytes, bar);
  }
}

// `rows` such rows from the first, counted on `bar`, which this thread arms for all of them.
template <int kRowBytes>
__device__ __forceinline__ void bulk_copy_rows_to_shared(unsigned char* dst, const unsigned char* src, int rows,
                                                         int64_t row_stride_bytes, uint64_t* bar) {
  mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(rows) * kRowBytes);
  bulk_copy_row_range_to_shared<kRowBytes>(dst, src, 0, rows, row_stride_bytes, bar);
}

// A whole kRows x kRowBytes tile (the row count known at compile time).
template <int kRows, int kRowBytes>
__device__ __forceinline__ void bulk_copy_tile_to_shared(unsigned char* dst, const unsigned char* src,
                                                         int64_t row_stride_bytes, uint64_t* bar) {
  bulk_copy_rows_to_shared<kRowBytes>(dst, src, kRows, row_stride_bytes, bar);
}

// Asks the copy engine to bring `bytes` (a multiple of 16, 16-byte aligned) into L2; nothing waits.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  cute::SM90_BULK_COPY_G2S::PREFETCH::copy(src, static_cast<int32_t>(bytes));
}

// bulk_prefetch_l2 where the copy engine allows it (16-byte aligned, a non-zero multiple of 16 bytes);
// a hint only, so anything else is simply not prefetched.
__device__ __forceinline__ void prefetch_l2_if_aligned(const void* src, size_t bytes) {
  if (bytes > 0 && bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    bulk_prefetch_l2(src, static_cast<uint32_t>(bytes));
  }
}

// One 128-byte line into L2 (prefetch.global.L2): a hint, nothing waits and nothing enters the SM's L1.
__device__ __forceinline__ void prefetch_line_l2(const void* src) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(src));
}

// `rows` rows of `row_bytes`, `stride_bytes` apart, into L2: one bulk prefetch where they are contiguous,
// else one a row (each where the copy engine allows it: prefetch_l2_if_aligned).
__device__ __forceinline__ void prefetch_rows_l2(const unsigned char* src, int rows, int row_bytes, int64_t stride_bytes) {
  if (stride_bytes == row_bytes) {
    prefetch_l2_if_aligned(src, static_cast<size_t>(rows) * row_bytes);
  } else {
    for (int r = 0; r < rows; ++r) prefetch_l2_if_aligned(src + r * stride_bytes, static_cast<size_t>(row_bytes));
  }
}

// Per-thread 16-byte asynchronous copies (cp.async, sm_80+), in commit groups: a thread can keep
// several groups in flight and wait for all but the newest `kPending`. Ours: cute's
// SM80_CP_ASYNC_CACHEGLOBAL adds an L2::128B prefetch hint (another instruction), and its commit and
// wait carry no "memory" clobber, which a wait must (the loads after it read what the copies wrote).
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
