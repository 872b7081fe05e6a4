// Host side of the GDN step: the launch its plan (launch/gdn_policy.h) chooses, and the dtype dispatch
// of one (K, V) shape (instantiations/step_k<K>_v<V>.cu).
#pragma once

#include <type_traits>

#include "cache/row_order.cuh"
#include "common/device_info.h"
#include "common/programmatic_launch.cuh"
#include "families/gdn/step_kernel.cuh"
#include "families/gdn/variants.h"
#include "launch/gdn_policy.h"
#include "launch/pdl.h"

namespace replayssm {
namespace gdn {

template <int kK, int kV, DType kCkpt, bool kCopy, DType kRead, DType kAct, bool kVectorGate>
cudaError_t launch_step(const GdnParams& p, cudaStream_t stream) {
  using Traits = StepTraits<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate>;
  auto kernel = step_kernel<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate, false>;
  const auto one_copy_kernel = kernel;
  bool attribute_set = false;  // on one_copy_kernel, by the occupancy query
  const size_t smem = Traits::smem_bytes(p.cache.buffer_len);
  launch::DeviceInfo device;
  const cudaError_t info = current_device_info(&device);  // cached after the first call
  if (info != cudaSuccess) return info;
  const launch::LaunchOverrides& overrides = launch::launch_overrides();
  launch::GdnStepProblem problem{p.batch, p.v_heads, kV, p.staggered_flush, p.row_order != nullptr};
  problem.buffer_len = p.cache.buffer_len;
  problem.read_copy = kCopy;
  problem.chunked_tile = Traits::kChunkedTile;
  problem.staged_tile = Traits::kCanStage;
  if (problem.staggered_flush && problem.order_workspace) {
    // Only the order rule asks how many CTAs an SM holds; other launches skip the query (the staged
    // kernel has the same launch bounds and shared memory).
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    attribute_set = true;
    const cudaError_t occupancy =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&problem.ctas_per_sm, kernel, kStepThreads, smem);
    if (occupancy != cudaSuccess) return occupancy;
  }
  const launch::GdnStepPlan plan = launch::plan_gdn_step(problem, device, overrides);
  if constexpr (Traits::kCanStage) {
    if (plan.tile_stages > 0) kernel = step_kernel<kK, kV, kCkpt, kCopy, kRead, kAct, kVectorGate, true>;
  }
  if (kernel != one_copy_kernel || !attribute_set) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y));
  const launch::ProgrammaticLaunch pdl = launch::programmatic_step_launch(overrides, p.batch * p.v_heads, device.sm_count);
  const bool after_order_pass = plan.ordered && launch::step_starts_during_order_pass(overrides);
  const bool cursor_from_order = plan.ordered && overrides.gdn_step_order_cursor != 0;
  if (plan.ordered) {
    RowOrderArgs order{};
    order.num_committed = p.cache.num_committed;
    order.order = p.row_order;
    order.batch = p.batch;
    order.buffer_len = p.cache.buffer_len;
    order.max_draft_tokens = p.cache.max_draft_tokens;
    order.fine_rows = plan.fold_rows;  // the fold split's rows, marked
    order.fine_mark = kFoldPartsRow;
    order.pdl_wait = pdl.wait;
    order.pdl_trigger = pdl.trigger;
    order.release_step = after_order_pass;
    order.write_cursors = cursor_from_order;
    const cudaError_t err = launch_row_order(p, order, p.num_slots, stream);
    if (err != cudaSuccess) return err;
  }
  // L2 warmed before the wait only where the CTA's row is its grid row (an ordered launch's rows come
  // from the order pass, which is the kernel ahead).
  const bool warm_l2 = pdl.warm_l2 && !plan.ordered;
  return launch_grid(kernel, grid, dim3(kStepThreads), smem, stream, pdl.wait || after_order_pass, p, pdl.wait,
                     pdl.trigger, warm_l2, plan.parts, plan.ordered, cursor_from_order, plan.fold_parts, after_order_pass,
                     plan.tile_stages);
}

// Every (checkpoint, read copy) pair and activation dtype of the variants table for one (K, V), GDN's
// scalar gate and KDA's vector gate (params.gate);
// instantiated once per shape file (instantiations/step_k<K>_v<V>.cu, written by
// tools/generate_instantiations.py).
template <int kK, int kV>
cudaError_t launch_step_shape(const GdnParams& p, cudaStream_t stream) {
  auto run = [&](auto vector_gate) {
    return REPLAYSSM_GDN_ACTIVATION_SWITCH(p.act_dtype, [&](auto act) {
      return REPLAYSSM_GDN_REPLAY_PAIR_SWITCH(p.cache.checkpoint_dtype, p.cache.read_copy != nullptr,
                                              p.cache.read_copy_dtype, [&](auto ckpt, auto copy, auto read) {
        return launch_step<kK, kV, decltype(ckpt)::value, decltype(copy)::value, decltype(read)::value,
                           decltype(act)::value, decltype(vector_gate)::value>(p, stream);
      });
    });
  };
  return p.gate == GdnGate::kVector ? run(std::true_type{}) : run(std::false_type{});
}

}  // namespace gdn
}  // namespace replayssm
