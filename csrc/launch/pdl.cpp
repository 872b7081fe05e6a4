// Programmatic dependent launch: the decision (pdl.h).
#include "launch/pdl.h"

namespace replayssm {
namespace launch {

// The rule: both halves where a launch's (row, head) tiles do not outnumber the SMs. There each CTA is a
// short chain of dependent round trips, and the gap between two kernels (the next launch, its CTAs' start
// and set-up) is a large part of a step: the trigger lets the next kernel's launch and start overlap this
// one. Where the tiles fill the SMs the next kernel's early CTAs take SMs from this one's last wave, and
// neither way wins everywhere. H100, one run, our T = 1 kernels back to back, off / the wait only
// (pdl = 2) / both (pdl = 1): Mamba-2 super120b@tp4 batch 1 update 4.07 / 3.89 / 3.32 us, lock-step cycle
// 4.79 / 4.58 / 4.02; batch 4 (128 tiles) update 6.69 / 6.60 / 5.87; super120b batch 1 (128) lock-step
// 6.13 / 5.87 / 5.34; GDN qwen4b batch 1 update 5.69 / 5.47 / 4.87, lock-step 7.51 / 7.31 / 6.81; batch 4
// (128) 10.58 / 10.36 / 9.97. From 256 tiles both halves mixed: super120b@tp4 b16 (512) lock-step 11.43 /
// 11.19 / 12.00, super120b@tp8 b16 (256) 7.80 / 7.63 / 7.95, qwen122b@tp4 b16 (256) 14.11 / 13.96 / 15.43,
// nano4b@tp4 b16 (384) update 13.93 -> 15.15 (earlier run, both), against gains of 1-6% elsewhere.
// The trigger only lets a kernel launched with PDL itself start early, and that kernel must wait before it
// reads what we write (docs/INTEGRATION.md): pdl = 2 keeps every kernel after ours where it was.
ProgrammaticLaunch programmatic_launch(const LaunchOverrides& overrides, int64_t tiles, int sm_count) {
  ProgrammaticLaunch launch;
  if (overrides.pdl == 1 || overrides.pdl == 2) {
    launch.wait = true;
    launch.trigger = overrides.pdl == 1;
  } else if (overrides.pdl == -1) {
    launch.wait = launch.trigger = tiles >= 1 && tiles <= sm_count;
  }
  return launch;
}

// A step that waits spends the kernel ahead's last microseconds idle, and after the wait its CTAs run a
// chain of dependent round trips (slot, then cursor and tile, then window) that are DRAM misses at batch
// 1. Asked for during the wait, they hit L2 instead. Only prefetches go out before the wait, from a slot
// read through L2 alone (a stale answer costs a useless prefetch, never a wrong result).
ProgrammaticLaunch programmatic_step_launch(const LaunchOverrides& overrides, int64_t tiles, int sm_count) {
  ProgrammaticLaunch launch = programmatic_launch(overrides, tiles, sm_count);
  launch.warm_l2 = launch.wait && overrides.pdl_warm != 0;
  return launch;
}

bool step_starts_during_order_pass(const LaunchOverrides& overrides) { return overrides.order_pass_pdl != 0; }

}  // namespace launch
}  // namespace replayssm
