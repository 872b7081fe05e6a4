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
// The two halves are separate decisions: a kernel launched with the attribute waits for the kernel ahead
// before it touches global memory (safe after any kernel, ours or an engine's), and a kernel that
// triggers lets the next kernel start early (which only a next kernel launched with PDL itself may use,
// and which must wait in turn). By rule, launches of few tiles (batch 1 to a few) take both; the pdl
// override takes both, the first only, or neither everywhere (the contract: docs/INTEGRATION.md, "CUDA
// graphs"; docs/DESIGN.md).
#pragma once

#include <cstdint>

#include "launch/overrides.h"

namespace replayssm {
namespace launch {

struct ProgrammaticLaunch {
  bool wait = false;     // launched with the attribute: may start during the kernel ahead, waits for it
  bool trigger = false;  // lets the kernel after it start early (griddepcontrol.launch_dependents)
  // A step launched with the attribute: while it waits, each CTA asks L2 for what its first round trips
  // read (the slot's cursor, the tile, the window), from the slot as it reads it before the wait
  // (cache/slot_map.cuh, peek_slot). Prefetches only: nothing read before the wait decides anything.
  bool warm_l2 = false;
};

// How mamba2_update, mamba2_step (with its order pass), gdn_update and gdn_step launch, for a launch of
// `tiles` (row, head) state tiles (Mamba-2: batch x heads; GDN, KDA: batch x v-heads) on `sm_count` SMs.
// The pdl override: 1 both halves, 2 the wait only, 0 neither; unset (-1) the rule: both where the tiles
// do not outnumber the SMs, neither elsewhere (pdl.cpp says why).
ProgrammaticLaunch programmatic_launch(const LaunchOverrides& overrides, int64_t tiles, int sm_count);
// The same for a step (mamba2_step, gdn_step, kda_step): warm_l2 where it waits, unless the pdl_warm
// override is 0.
ProgrammaticLaunch programmatic_step_launch(const LaunchOverrides& overrides, int64_t tiles, int sm_count);

// Whether a step that runs the order pass (cache/row_order.cuh) is launched with PDL behind it, whatever
// programmatic_launch says: the pass (one CTA) lets the step launch as it starts, so the step's launch
// and CTA start overlap the pass instead of following it, and each step CTA waits for the pass before it
// touches global memory. An edge between two of our kernels only: the step lets the kernel after it start
// early only where programmatic_launch says so. On unless the order_pass_pdl override is 0.
bool step_starts_during_order_pass(const LaunchOverrides& overrides);

}  // namespace launch
}  // namespace replayssm
