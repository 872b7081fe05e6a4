// The offset advance of stochastic rounding (stochastic_rounding.cuh): one thread, launched in stream
// order after a kernel that rounds, so every CTA of that kernel has read the offset before it moves.
// Chosen over a last-CTA ticket on the offset for the update and the step: a ticket would put one
// same-address atomic at the end of every CTA (tens of thousands per update launch) and need a change
// in the step kernel; this costs one small dependent launch (measured in docs/DESIGN.md). Commit and
// flush need neither: their cursor kernel, already launched after the fold, advances the offset.
#include "common/stochastic_rounding.cuh"

namespace replayssm {
namespace {

__global__ void rounding_offset_kernel(int64_t* rounding_seed) { rounding_seed[1] += 1; }

}  // namespace

cudaError_t launch_rounding_offset_advance(int64_t* rounding_seed, cudaStream_t stream) {
  rounding_offset_kernel<<<1, 1, 0, stream>>>(rounding_seed);
  return cudaGetLastError();
}

}  // namespace replayssm
