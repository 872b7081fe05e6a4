// The compiled ops: one line each. registration.cpp defines the schemas, registers the CUDA kernels and
// reports the names (replayssm_cuda._C.compiled_ops()) from this one list.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

// X(name, schema)
#define REPLAYSSM_CUDA_OPS(X)                                                                      \
  X(make_read_copy,                                                                                \
    "make_read_copy(Tensor checkpoint, Tensor(a!) read_copy, Tensor(b!)? read_scale, Tensor? slots, " \
    "int pad_slot_id) -> ()")

namespace replayssm {

void make_read_copy(const at::Tensor& checkpoint, const at::Tensor& read_copy,
                    const std::optional<at::Tensor>& read_scale, const std::optional<at::Tensor>& slots,
                    int64_t pad_slot_id);

}  // namespace replayssm
