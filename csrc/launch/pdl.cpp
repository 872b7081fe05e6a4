// Programmatic dependent launch: the decision (pdl.h).
#include "launch/pdl.h"

namespace replayssm {
namespace launch {

bool programmatic_launch(const LaunchOverrides& overrides) { return overrides.pdl == 1; }

bool step_starts_during_order_pass(const LaunchOverrides& overrides) { return overrides.order_pass_pdl != 0; }

}  // namespace launch
}  // namespace replayssm
