// Host-side launch facts of the kernels, cached. An eager launch of the step, verify, fold or update
// kernel needs the device's SM count and shared memory limits, the kernel's dynamic shared memory limit
// raised to what the launch uses, and how many CTAs of the kernel fit on an SM. Asked of the runtime at
// every launch they add host time to every eager call (cudaFuncSetAttribute and the occupancy query
// most), and at batch 1 a decode step's kernel runs for only a few microseconds;
// bench/bench_launch_overhead.py measures the host time per call. They depend only on the device, the
// kernel and its dynamic shared memory size, so they are asked once and kept. (A launch captured in a
// CUDA graph pays them only at capture; the cache is for eager launches.)
//
// The cache holds only successful answers: an error is returned to the caller as before and asked again
// at the next launch. Devices 0 .. kMaxCachedDevices - 1 are cached; any other is asked every time.
// It assumes the device's primary context lives as long as the process (as under PyTorch): a
// cudaDeviceReset would drop the raised shared memory limits that the cache remembers.
//
// The REPLAYSSM_* knobs are still read with getenv at every launch: tests change them between calls,
// and a getenv is cheap next to the runtime calls cached here.
#pragma once

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include <cuda_runtime.h>

namespace replayssm {

constexpr int kMaxCachedDevices = 64;

struct DeviceLimits {
  int sms = 0;                 // cudaDevAttrMultiProcessorCount
  int smem_per_sm = 0;         // cudaDevAttrMaxSharedMemoryPerMultiprocessor, bytes
  int smem_per_cta_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes
};

namespace launch_cache_detail {

// Taken only on a cache miss; the hits read atomics.
inline std::mutex& miss_mutex() {
  static std::mutex mutex;
  return mutex;
}

struct CachedDeviceLimits {
  std::atomic<bool> ready{false};  // limits below are written before ready is set (release)
  DeviceLimits limits;
};

inline CachedDeviceLimits* device_limits_table() {
  static CachedDeviceLimits table[kMaxCachedDevices];
  return table;
}

inline cudaError_t query_device_limits(int device, DeviceLimits* limits) {
  DeviceLimits& l = *limits;
  cudaError_t err = cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&l.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&l.smem_per_cta_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return err;
}

}  // namespace launch_cache_detail

// The current device (cudaGetDevice, a thread-local read, asked every time: a host thread may switch
// devices between launches) and its limits, asked of the runtime once per device.
inline cudaError_t current_device_limits(int* device, DeviceLimits* limits) {
  using namespace launch_cache_detail;
  cudaError_t err = cudaGetDevice(device);
  if (err != cudaSuccess) return err;
  if (*device < 0 || *device >= kMaxCachedDevices) return query_device_limits(*device, limits);
  CachedDeviceLimits& entry = device_limits_table()[*device];
  if (!entry.ready.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(miss_mutex());
    if (!entry.ready.load(std::memory_order_relaxed)) {
      DeviceLimits asked;
      err = query_device_limits(*device, &asked);
      if (err != cudaSuccess) return err;
      entry.limits = asked;
      entry.ready.store(true, std::memory_order_release);
    }
  }
  *limits = entry.limits;
  return cudaSuccess;
}

// One kernel's launch facts per device: one cache per kernel instantiation, a function-local static of
// its launcher (constant-initialised: no guard, no constructor at load).
//
// prepare() makes the kernel launchable with `smem` bytes of dynamic shared memory on `device` and says
// how many CTAs of `threads` threads and `smem` bytes fit on one SM. The kernel's shared memory limit
// only ever goes up (cudaFuncSetAttribute when a launch needs more than was set before), so a launch
// with less than the largest smem so far needs no call, and a launch on one host thread never lowers
// the limit under another's. smem varies with the buffer length and the draft count, so the last
// kOccupancyEntries (threads, smem) answers are kept; a hit implies the limit is already >= smem.
class KernelLaunchCache {
 public:
  template <class Kernel>
  cudaError_t prepare(int device, Kernel* kernel_function, int threads, size_t smem, int* ctas_per_sm) {
    const void* kernel = reinterpret_cast<const void*>(kernel_function);
    if (smem > static_cast<size_t>(INT_MAX) || threads < 1 || threads > 0xffff) return cudaErrorInvalidValue;
    if (device < 0 || device >= kMaxCachedDevices) return ask(kernel, threads, smem, ctas_per_sm);
    PerDevice& d = devices_[device];
    const uint64_t key = occupancy_key(threads, smem);
    if (lookup(d, key, ctas_per_sm)) return cudaSuccess;
    std::lock_guard<std::mutex> lock(launch_cache_detail::miss_mutex());
    if (lookup(d, key, ctas_per_sm)) return cudaSuccess;  // another thread asked meanwhile
    const int smem_bytes = static_cast<int>(smem);
    if (smem_bytes > d.smem_limit_set) {
      const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
      if (err != cudaSuccess) return err;
      d.smem_limit_set = smem_bytes;
    }
    int ctas = 0;
    const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, smem);
    if (err != cudaSuccess) return err;
    *ctas_per_sm = ctas < 0 ? 0 : (ctas > 0xffff ? 0xffff : ctas);  // 16 bits in the entry (in fact <= 32)
    d.occupancy[d.next_entry].store(key | static_cast<uint64_t>(*ctas_per_sm), std::memory_order_release);
    d.next_entry = (d.next_entry + 1) % kOccupancyEntries;
    return cudaSuccess;
  }

 private:
  static constexpr int kOccupancyEntries = 4;

  struct PerDevice {
    // (smem << 32 | threads << 16 | CTAs per SM), one word so that a reader sees a whole answer; 0: empty
    // (threads >= 1).
    std::atomic<uint64_t> occupancy[kOccupancyEntries] = {};
    int smem_limit_set = 0;  // the kernel's dynamic shared memory limit as last set; under miss_mutex
    int next_entry = 0;      // the occupancy entry to overwrite next; under miss_mutex
  };

  static uint64_t occupancy_key(int threads, size_t smem) {
    return static_cast<uint64_t>(smem) << 32 | static_cast<uint64_t>(threads) << 16;
  }

  static bool lookup(const PerDevice& d, uint64_t key, int* ctas_per_sm) {
    for (int i = 0; i < kOccupancyEntries; ++i) {
      const uint64_t entry = d.occupancy[i].load(std::memory_order_acquire);
      if ((entry & ~uint64_t{0xffff}) == key) {
        *ctas_per_sm = static_cast<int>(entry & 0xffff);
        return true;
      }
    }
    return false;
  }

  // Uncached, as every launch did before the cache: for a device beyond the table.
  static cudaError_t ask(const void* kernel, int threads, size_t smem, int* ctas_per_sm) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, kernel, threads, smem);
  }

  PerDevice devices_[kMaxCachedDevices];
};

}  // namespace replayssm
