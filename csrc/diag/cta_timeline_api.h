// The per-CTA time line of a diagnostic build (REPLAYSSM_CTA_TIMELINE=1; diag/cta_timeline.cuh): where
// mamba2_update, mamba2_step and gdn_step / kda_step launches write their records. A product build
// compiles no file of csrc/diag/ but this header, whose attach_cta_timeline is then empty.
#pragma once

#include "families/gdn/params.h"
#include "families/mamba2/params.h"

namespace replayssm {

#if REPLAYSSM_CTA_TIMELINE
// Gives p the next record set (or none). Called by the ops that mark a time line as they fill their
// params. The records are set from Python through torch.ops.replayssm_diag (diag/cta_timeline_api.cpp).
void attach_cta_timeline(Mamba2Params& p);
void attach_cta_timeline(GdnParams& p);
#else
inline void attach_cta_timeline(Mamba2Params&) {}
inline void attach_cta_timeline(GdnParams&) {}
#endif

}  // namespace replayssm
