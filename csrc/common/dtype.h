// Element types the kernels understand. Host-safe (no CUDA device code): the API layer, compiled by
// the host C++ compiler, includes it to fill params structs.
#pragma once

#include <cstdint>

namespace replayssm {

enum class DType : int32_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
  kFloat8E4M3 = 3,  // float8_e4m3fn: finite-only e4m3, max 448
  kInt32 = 4,
  kInt64 = 5,
};

constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kBFloat16: return 2;
    case DType::kFloat16: return 2;
    case DType::kFloat8E4M3: return 1;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
  }
  return 0;
}

// torch's spelling of a dtype ("float32", "bfloat16", ...), for messages and capabilities().
constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kFloat8E4M3: return "float8_e4m3fn";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return "an unknown dtype";
}

}  // namespace replayssm
