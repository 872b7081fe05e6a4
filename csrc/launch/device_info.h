// The facts about a GPU that the launch plans take. Host-only C++ (no CUDA headers): the launchers fill
// it once per device from the CUDA runtime (common/device_info.cuh); tests fill it by hand, so the
// rules can be checked for any SM count without a GPU.
#pragma once

namespace replayssm {
namespace launch {

struct DeviceInfo {
  int sm_count = 0;              // streaming multiprocessors (132 on the H100 SXM and the H200)
  int smem_per_sm = 0;           // bytes of shared memory an SM holds (228 KB on sm_90 and sm_100)
  int smem_per_block_optin = 0;  // the most dynamic shared memory one CTA may opt in to (227 KB there)
};

}  // namespace launch
}  // namespace replayssm
