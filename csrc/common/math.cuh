// Scalar activation functions with the exact rounding rules of the PyTorch reference (no fast math,
// except the output gate, whose tolerance is stated below).
#pragma once

namespace replayssm {

// torch.nn.functional.softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
// The output gate silu(z) = z / (1 + e^-z), with the division as MUFU.RCP and one multiply (__fdividef,
// within 2 ulp of fp32; the output is then rounded to 16 bits), for the replay step and verify. The
// correctly rounded division ('/', silu above) compiles to a branch into a slow-path subroutine: in
// verify that call, made where a reduce warp's C values were live, made ptxas spill 28-48 bytes at 128
// registers; in the step's consumers it and expf were ~8% of the fp8 step's instructions per head.
__device__ __forceinline__ float gate(float z) { return __fdividef(z, 1.0f + expf(-z)); }

}  // namespace replayssm
