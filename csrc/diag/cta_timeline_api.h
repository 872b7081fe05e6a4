// The per-CTA time line of a diagnostic build (REPLAYSSM_CTA_TIMELINE=1; diag/cta_timeline.cuh): where
// mamba2_update and mamba2_step launches write their records. A product build compiles no file of
// csrc/diag/ but this header, whose attach_cta_timeline is then empty.
#pragma once

#include "families/mamba2/params.h"

namespace replayssm {

#if REPLAYSSM_CTA_TIMELINE
// Gives p the next record set (or none). Called by the update and step ops as they fill their params.
// The records are set from Python through torch.ops.replayssm_diag (diag/cta_timeline_api.cpp).
void attach_cta_timeline(Mamba2Params& p);
#else
inline void attach_cta_timeline(Mamba2Params&) {}
#endif

}  // namespace replayssm
