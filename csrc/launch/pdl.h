// Programmatic dependent launch (PDL, sm_90 and later) of the T = 1 kernels: the decision, host-only C++
// (no CUDA headers). The launch itself and the kernels' side: common/programmatic_launch.cuh.
//
// With PDL a kernel is launched with cudaLaunchAttributeProgrammaticStreamSerialization: it may start
// (its CTAs become resident and run their prologue) while the kernel before it in the stream is still
// running, once that kernel has let its dependents launch (griddepcontrol.launch_dependents in every CTA,
// or its CTAs' exit). It then waits (griddepcontrol.wait) for that kernel to complete and its memory to be
// visible before it reads or writes any global memory. What it saves at batch 1 is the gap between two
// kernels: the next kernel's launch, CTA start and barrier set-up overlap the previous kernel's tail.
//
// Off by default (the contract and why: docs/INTEGRATION.md, "CUDA graphs"; docs/DESIGN.md).
#pragma once

#include "launch/overrides.h"

namespace replayssm {
namespace launch {

// Whether mamba2_update, mamba2_step (with its order pass), gdn_update and gdn_step launch with PDL and
// let the kernel after them start early: only where the pdl override is 1 (REPLAYSSM_PDL=1, or
// replayssm_cuda.launch_overrides(pdl=1)); 0 and unset (-1): no.
bool programmatic_launch(const LaunchOverrides& overrides);

// Whether a step that runs the order pass (cache/row_order.cuh) is launched with PDL behind it, whatever
// programmatic_launch says: the pass (one CTA) lets the step launch as it starts, so the step's launch
// and CTA start overlap the pass instead of following it, and each step CTA waits for the pass before it
// touches global memory. An edge between two of our kernels only: the step lets the kernel after it start
// early only where programmatic_launch says so. On unless the order_pass_pdl override is 0.
bool step_starts_during_order_pass(const LaunchOverrides& overrides);

}  // namespace launch
}  // namespace replayssm
