// How long a small load takes while the SMs stream tiles (the question behind the GDN step's set-up,
// docs/PERFORMANCE.md). Standalone, no torch:
//   nvcc -arch=sm_90a -O3 -std=c++17 -o /tmp/load_latency tools/load_latency.cu && /tmp/load_latency
// (CMakeLists.txt builds it too, for every target arch, so CI keeps it compiling)
// 3 or 4 CTAs of 256 threads an SM (as gdn_step's with fp32 tiles, or 16-bit / fp8 ones); thread 0 of each
// streams tiles of `tile` bytes from a 4 GB buffer into shared memory with `depth` copies in flight
// (bulk copies on an mbarrier each, or cp.async 16 B by every thread but warp 1; L2 evict_first, so the
// stream does not evict the probe's lines), while warp 1 lane 0 times two chains of dependent 4-byte
// loads (ld.global.cg): over 16 hot lines (L2 hits) and over the cold buffer (DRAM misses). The table:
// bytes in flight (CTAs x tile x depth), the stream's bandwidth, and the mean latency of each chain.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

// Its own few PTX lines rather than csrc/common/bulk_copy.cuh's, which need CUTLASS: nvcc alone builds it.
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ uint64_t global_ns() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
// Scatters the probe's addresses (an integer hash).
__device__ __forceinline__ uint32_t mix(uint32_t x) { x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16; return x; }

// The probes' sums over every CTA: nanoseconds and loads of each chain.
struct Out { unsigned long long hot_ns, hot_n, cold_ns, cold_n; };

__device__ __forceinline__ void wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  }
}

template <bool kTma>
__global__ void __launch_bounds__(256, 1) stream_and_probe(const unsigned char* big, size_t big_bytes, const uint32_t* hot,
                                                           int tile, int depth, int iters, int probes, Out* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t bar[8];
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int d = 0; d < depth; ++d) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(smem_addr(&bar[d])));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  const size_t slots = big_bytes / tile;
  // The probe: each load's address depends on the value the last one returned (all zeros), so the loads
  // go one at a time. The hot chain runs first, while the stream's first tiles go out.
  if (tid == 32 && probes > 0) {
    uint32_t v = 0, idx = blockIdx.x;
    uint64_t t0 = global_ns();
    for (int i = 0; i < probes; ++i) {  // 16 hot lines (128 B apart)
      v = __ldcg(hot + ((mix(idx + i) + v) & 15) * 32);
    }
    uint64_t t1 = global_ns();
    uint32_t w = 0;
    const uint32_t* cold_words = reinterpret_cast<const uint32_t*>(big);
    const size_t words = big_bytes / 4;
    for (int i = 0; i < probes; ++i) {
      const size_t at = (static_cast<size_t>(mix(idx * 7919u + i)) * 64 + w) % words;
      w = __ldcg(cold_words + at);
    }
    uint64_t t2 = global_ns();
    atomicAdd(&out->hot_ns, (t1 - t0) + (v & 1));
    atomicAdd(&out->hot_n, probes);
    atomicAdd(&out->cold_ns, (t2 - t1) + (w & 1));
    atomicAdd(&out->cold_n, probes);
  }
  if (depth == 0) return;
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  auto src_of = [&](int it) { return big + ((static_cast<size_t>(it) * gridDim.x + blockIdx.x) % slots) * tile; };
  if constexpr (kTma) {
    if (tid == 0) {
      for (int it = 0; it < iters; ++it) {
        const int d = it % depth;
        if (it >= depth) wait_parity(&bar[d], ((it / depth) - 1) & 1);  // the copy that last used this buffer
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(smem_addr(&bar[d])), "r"(tile) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                     ::"r"(smem_addr(smem + static_cast<size_t>(d) * tile)), "l"(src_of(it)), "r"(tile), "r"(smem_addr(&bar[d])), "l"(policy)
                     : "memory");
      }
      for (int it = iters; it < iters + depth && it - depth >= 0; ++it) wait_parity(&bar[it % depth], ((it / depth) - 1) & 1);
    }
  } else {
    // cp.async 16 B by every thread but warp 1 (the probe's), one commit group a tile, up to `depth` (1, 2
    // or 4) groups in flight
    if (tid >= 32 && tid < 64) return;
    const int t = tid < 32 ? tid : tid - 32, nt = 224;
    for (int it = 0; it < iters; ++it) {
      const int d = it % depth;
      const unsigned char* s = src_of(it);
      for (int o = t * 16; o < tile; o += nt * 16) {
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(smem_addr(smem + static_cast<size_t>(d) * tile + o)),
                     "l"(s + o), "l"(policy) : "memory");
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
      if (depth == 1) asm volatile("cp.async.wait_group 0;" ::: "memory");
      else if (depth == 2) asm volatile("cp.async.wait_group 1;" ::: "memory");
      else asm volatile("cp.async.wait_group 3;" ::: "memory");
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
  }
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t big_bytes = size_t(4) << 30;
  unsigned char* big;
  uint32_t* hot;
  Out* out;
  CK(cudaMalloc(&big, big_bytes));
  CK(cudaMemset(big, 0, big_bytes));
  CK(cudaMalloc(&hot, 1 << 20));
  CK(cudaMemset(hot, 0, 1 << 20));
  CK(cudaMalloc(&out, sizeof(Out)));
  // CTAs an SM: 3 (64 KB of shared memory each: gdn_step's fp32 checkpoint) or 4 (48 KB: its 16-bit and
  // fp8 read copies, 32 and 16 KB tiles).
  struct Cfg { bool tma; int tile, depth, per_sm; } cfgs[] = {
      {true, 65536, 0, 3}, {true, 4096, 1, 3}, {true, 8192, 1, 3}, {true, 16384, 1, 3}, {true, 24576, 1, 3},
      {true, 32768, 1, 3}, {true, 65536, 1, 3}, {true, 32768, 2, 3}, {true, 16384, 4, 3}, {false, 65536, 1, 3},
      {false, 16384, 4, 3}, {true, 16384, 1, 4}, {true, 32768, 1, 4}, {true, 8192, 2, 4}};
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs; CTAs of 256 threads; probes: warp 1 lane 0 of every CTA\n", prop.name, sms);
  printf("| loader | CTAs an SM | tile KB x depth | in flight MB | loader TB/s | hot-line load ns | cold load ns |\n"
         "|---|---|---|---|---|---|---|\n");
  for (const Cfg& c : cfgs) {
    const int ctas = c.per_sm * sms;
    const size_t smem = c.per_sm == 3 ? 65536 : 49152;  // fixes the CTAs an SM whatever the tile
    auto k = c.tma ? stream_and_probe<true> : stream_and_probe<false>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const size_t stream_bytes = size_t(6) << 30;
    const int iters = c.depth ? static_cast<int>(stream_bytes / (size_t(ctas) * c.tile)) : 0;
    const int probes = 150;
    for (int rep = 0; rep < 2; ++rep) {
      CK(cudaMemset(out, 0, sizeof(Out)));
      CK(cudaEventRecord(e0));
      k<<<ctas, 256, smem>>>(big, big_bytes, hot, c.tile, c.depth, iters, probes, out);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaGetLastError());
    }
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    Out h;
    CK(cudaMemcpy(&h, out, sizeof(Out), cudaMemcpyDeviceToHost));
    const double bytes = double(iters) * ctas * c.tile;
    printf("| %s | %d | %d x %d | %.1f | %.2f | %.0f | %.0f |\n", c.depth ? (c.tma ? "bulk copy" : "cp.async") : "none", c.per_sm,
           c.tile / 1024, c.depth,
           double(ctas) * c.tile * c.depth / 1e6, c.depth ? bytes / (ms * 1e-3) / 1e12 : 0.0, double(h.hot_ns) / h.hot_n,
           double(h.cold_ns) / h.cold_n);
  }
  return 0;
}
