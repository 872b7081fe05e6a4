// The per-CTA time line of a diagnostic build (REPLAYSSM_CTA_TIMELINE=1; kernels/cta_timeline.cuh):
// where mamba2_update and mamba2_step launches write their records. Empty in a product build.
#pragma once

#include "kernels/mamba2.cuh"

#if REPLAYSSM_CTA_TIMELINE
#include <ATen/core/Tensor.h>
#include <optional>

namespace replayssm {

// Records of the next launches go into buffer (int64 CUDA, [launches, ctas, kCtaTimelineWords]), launch
// k of those that follow into buffer[k]; launches past the last one write nothing. None: no time line.
void set_cta_timeline(const std::optional<at::Tensor>& buffer);
// How many launches have taken a record set since set_cta_timeline.
int64_t cta_timeline_launches();
// Gives p the next record set (or none). Called by the update and step ops as they fill their params.
void attach_cta_timeline(Mamba2Params& p);

}  // namespace replayssm
#endif
