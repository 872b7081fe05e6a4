// current_device_info (device_info.h): one query per device, kept for the life of the process.
#include "common/device_info.h"

#include <atomic>
#include <mutex>

namespace replayssm {
namespace {

constexpr int kMaxDevices = 64;
std::atomic<bool> known[kMaxDevices];
launch::DeviceInfo infos[kMaxDevices];
std::mutex query_mutex;

cudaError_t query(int device, launch::DeviceInfo* info) {
  cudaError_t err = cudaDeviceGetAttribute(&info->sm_count, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&info->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&info->smem_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  return err;
}

}  // namespace

cudaError_t current_device_info(launch::DeviceInfo* info) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return query(device, info);
  if (!known[device].load(std::memory_order_acquire)) {
    const std::lock_guard<std::mutex> lock(query_mutex);
    if (!known[device].load(std::memory_order_relaxed)) {
      launch::DeviceInfo fresh;
      err = query(device, &fresh);
      if (err != cudaSuccess) return err;
      infos[device] = fresh;
      known[device].store(true, std::memory_order_release);
    }
  }
  *info = infos[device];
  return cudaSuccess;
}

}  // namespace replayssm
