// Programmatic dependent launch (PDL, sm_90 and later): the launch with or without it, and the two
// instructions a kernel launched with it uses. The decision: launch/pdl.h.
//
// A kernel launched with the attribute may start before the kernel ahead of it in the stream has finished;
// griddepcontrol.wait then blocks the calling thread until every prerequisite grid has completed and its
// memory operations are visible. So in every kernel that takes the attribute, each thread calls
// wait_for_prior_grids(pdl) before its first access to global memory (a read of anything, or a write: the
// kernel before may still read what we would overwrite); before it, only shared memory and registers (barrier
// set-up, the CTA's parameter arithmetic), and in a step the L2 prefetches of warm_l2 (launch/pdl.h): reads
// through L2 alone (ld.global.cg, prefetch.global.L2, bulk L2 prefetches) whose answers decide nothing, so no
// line in the SM's L1 can serve a stale value after the wait. In a kernel launched without the attribute the
// wait is skipped: every grid before it has completed.
//
// launch_dependent_grids() lets the kernel after this one in the stream start early, if that kernel was
// launched with the attribute (it then waits as above before it reads anything we write); without one,
// nothing happens. The kernel that follows launches once every CTA of this one has called it or exited,
// so it never takes SM resources from CTAs of this kernel that are still to start.
#pragma once

#include <cuda_runtime.h>

namespace replayssm {

// launched_with_pdl: the kernel's own flag, the one its launch_grid call took. Without the attribute no
// instruction is issued (every grid ahead has completed when the CTA starts), so a kernel launched
// the plain way pays nothing for being PDL-capable.
__device__ __forceinline__ void wait_for_prior_grids(bool launched_with_pdl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (launched_with_pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` on grid x block with `smem` dynamic bytes on `stream`: with `pdl`, through
// cudaLaunchKernelEx with cudaLaunchAttributeProgrammaticStreamSerialization (stream capture records the
// programmatic edge, so a CUDA graph keeps it); without, the plain launch. Returns the launch's error,
// cleared from the runtime's last error (as `kernel<<<...>>>(...); return cudaGetLastError();` does).
template <class... Params, class... Args>
cudaError_t launch_grid(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                        const Args&... args) {
  if (!pdl) {
    kernel<<<grid, block, smem, stream>>>(args...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, args...);
  const cudaError_t last = cudaGetLastError();
  return launched != cudaSuccess ? launched : last;
}

}  // namespace replayssm
