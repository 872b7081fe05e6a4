// Programmatic dependent launch: the decision (pdl.h).
#include "launch/pdl.h"

namespace replayssm {
namespace launch {

bool programmatic_launch(const LaunchOverrides& overrides) { return overrides.pdl == 1; }

}  // namespace launch
}  // namespace replayssm
