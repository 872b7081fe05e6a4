// The current device's facts for the launch plans (launch/device_info.h), from the CUDA runtime.
// Host code; the launchers call it at each launch, and it queries each device once.
#pragma once

#include <cuda_runtime_api.h>

#include "launch/device_info.h"

namespace replayssm {

// Fills `info` for the current device: queried the first time a launch on that device asks, then kept
// (the attributes do not change while the process runs).
cudaError_t current_device_info(launch::DeviceInfo* info);

}  // namespace replayssm
