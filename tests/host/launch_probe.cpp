// Host-only probe of the launch policy (csrc/launch/), for tests/test_launch_policy.py: compiled with the
// C++ compiler alone (no CUDA), it answers plan queries for a device given on stdin, so the rules are
// tested for any SM count on machines without a GPU.
//
// stdin, one command a line; stdout, one line for each:
//   device SMS [SMEM_PER_SM SMEM_OPTIN]     the DeviceInfo of the queries that follow -> "ok"
//                                           (shared memory defaults: sm_90's 228 KB an SM, 227 KB a CTA)
//   set FIELD VALUE                         one override, through set_launch_overrides -> "ok" or "error <why>"
//   clear                                   every override unset -> "ok"
//   env NAME VALUE                          sets (VALUE "-": unsets) an environment variable, then
//                                           -> launch_overrides_from_environment() as "field=value ..."
//   heads BATCH H G CTAS WAVES ONE_WAVE FULL_WAVES FILL_LAST_WAVE HALF_BELOW_FOUR_WAVES
//                                           -> mamba2_heads_per_cta (forced: the step_heads_per_cta override)
//   split BATCH H G L CTAS                  -> "heads split rows" of mamba2_fold_split, from the hint's launch
//                                           (step_staggered_heads_per_cta's block where that is set)
//   twogroup BATCH G CTAS BY_RULE           -> 1 or 0 (mamba2_two_group_ctas)
//   step BATCH H G L CTAS COPY FP32_CKPT TENSOR_REPLAY STAGGERED WORKSPACE
//        (COPY: none, 16 or fp8)            -> "kernel heads_per_cta fold_split fold_split_rows grid_x grid_y"
//   update BATCH H TILE_BYTES WORK_COUNTER CTAS [PARTS]
//                                           -> "stages grid claims" (8 stages at most, 256 static bytes;
//                                           PARTS: items per (row, head), 1 unless given)
//   updatesplit BATCH H PARTS               -> 1 or 0 (mamba2_update_split)
//   verify BATCH H G CTAS                   -> "heads_per_cta grid_x grid_y"
//   verifyring COMPILED_STAGES COMPILED_CTAS BYTES_1 .. BYTES_COMPILED  -> stages (0: none fits)
//   foldring COMPILED_STAGES STATIC_BYTES BYTES_1 .. BYTES_COMPILED     -> stages (0: none fits)
//   fold BATCH H STAGES CTAS [LAYERS]       -> "ring_stages grid" (grid: CTAs per layer)
//   gdnupdate BATCH HV CTAS_PER_HEAD [SPLIT_CTAS_PER_HEAD, default 0]
//                                           -> "grid_x grid_y" [+ " split"] (plan_gdn_update)
//   gdnstep BATCH HV V STAGGERED [CTAS [WORKSPACE, default 1 [L, default 16 [COPY, default 0
//           [TILE, default 0]]]]]
//                                           -> "parts grid_x grid_y[ ordered][ fold F ROWS][ stages N]"
//                                              (plan_gdn_step; TILE 1: the kernel takes its tile in chunks,
//                                              2: it asks for its 16-bit read copy's tile over the set-up)
//   gdnverify BATCH HV CTAS                 -> "heads_per_cta grid_x grid_y" (plan_gdn_verify)
//   gdnring COMPILED_STAGES COMPILED_CTAS STATIC_BYTES BYTES_1 .. BYTES_COMPILED
//                                           -> stages of plan_gdn_verify_stages / plan_gdn_fold_stages (one rule)
//   gdnfold BATCH HV STAGES CTAS [LAYERS]   -> "ring_stages grid" (plan_gdn_fold; grid: CTAs per layer)
//   pdl TILES                               -> "WAIT TRIGGER", each 1 or 0 (programmatic_launch of a T = 1
//                                              launch of TILES (row, head) tiles on the device's SMs)
//   pdlstep TILES                           -> "WAIT TRIGGER WARM", each 1 or 0 (programmatic_step_launch)
//   orderpasspdl                            -> 1 or 0 (step_starts_during_order_pass)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "launch/gdn_policy.h"
#include "launch/mamba2_policy.h"
#include "launch/pdl.h"

using namespace replayssm::launch;

namespace {

std::string overrides_text(const LaunchOverrides& o) {
  int count = 0;
  const OverrideField* fields = override_fields(&count);
  std::string out;
  for (int i = 0; i < count; ++i) {
    out += (i ? " " : "") + std::string(fields[i].name) + "=" + std::to_string(o.*fields[i].member);
  }
  return out;
}

const char* kernel_name(StepKernel k) {
  switch (k) {
    case StepKernel::kPlain: return "plain";
    case StepKernel::kTwoGroups: return "two_groups";
    case StepKernel::kOrdered: return "ordered";
  }
  return "?";
}

std::string answer(const std::string& line, DeviceInfo& device) {
  std::istringstream in(line);
  std::string command;
  in >> command;
  const LaunchOverrides& overrides = launch_overrides();
  if (command == "device") {
    in >> device.sm_count;
    if (!(in >> device.smem_per_sm >> device.smem_per_block_optin)) {
      device.smem_per_sm = 228 * 1024;
      device.smem_per_block_optin = 227 * 1024;
    }
    return "ok";
  }
  if (command == "set") {
    std::string field_name;
    long long value = 0;
    in >> field_name >> value;
    const OverrideField* field = find_override_field(field_name);
    if (field == nullptr) return "error unknown field " + field_name;
    const std::string error = override_error(*field, value);
    if (!error.empty()) return "error " + error;
    LaunchOverrides next = overrides;
    next.*field->member = static_cast<int>(value);
    set_launch_overrides(next);
    return "ok";
  }
  if (command == "clear") {
    set_launch_overrides(LaunchOverrides{});
    return "ok";
  }
  if (command == "env") {
    std::string name, value;
    in >> name >> value;
    if (value == "-") {
      unsetenv(name.c_str());
    } else {
      setenv(name.c_str(), value.c_str(), 1);
    }
    return overrides_text(launch_overrides_from_environment());
  }
  if (command == "heads") {
    long long batch;
    int heads, groups, ctas, one, full, fill, half;
    HeadsRules rules;
    in >> batch >> heads >> groups >> ctas >> rules.waves >> one >> full >> fill >> half;
    rules.one_wave = one != 0;
    rules.full_waves = full != 0;
    rules.fill_last_wave = fill != 0;
    rules.half_below_four_waves = half != 0;
    return std::to_string(
        mamba2_heads_per_cta(batch, heads, groups, ctas, device.sm_count, rules, overrides.step_heads_per_cta));
  }
  if (command == "split") {
    long long batch;
    int heads, groups, buffer_len, ctas;
    in >> batch >> heads >> groups >> buffer_len >> ctas;
    // The hint's launch the split starts from, as plan_mamba2_step takes it.
    const int hint_heads = mamba2_staggered_heads_per_cta(batch, heads, groups, ctas, device.sm_count, overrides);
    const FoldSplit s = mamba2_fold_split(batch, heads, groups, buffer_len, ctas, device.sm_count, hint_heads, overrides);
    return std::to_string(s.heads_per_cta) + " " + std::to_string(s.split) + " " + std::to_string(s.rows);
  }
  if (command == "twogroup") {
    long long batch;
    int groups, ctas, by_rule;
    in >> batch >> groups >> ctas >> by_rule;
    return mamba2_two_group_ctas(batch, groups, ctas, device.sm_count, by_rule != 0, overrides) ? "1" : "0";
  }
  if (command == "step") {
    Mamba2StepProblem problem;
    std::string copy;
    int ctas, fp32, tensor, staggered, workspace;
    in >> problem.batch >> problem.heads >> problem.groups >> problem.buffer_len >> ctas >> copy >> fp32 >> tensor >>
        staggered >> workspace;
    problem.read_copy = copy == "fp8" ? ReadCopyKind::kFp8 : copy == "16" ? ReadCopyKind::k16Bit : ReadCopyKind::kNone;
    problem.fp32_checkpoint = fp32 != 0;
    problem.tensor_replay = tensor != 0;
    problem.staggered_flush = staggered != 0;
    problem.order_workspace = workspace != 0;
    const Mamba2StepPlan plan = plan_mamba2_step(problem, ctas, device, overrides);
    return std::string(kernel_name(plan.kernel)) + " " + std::to_string(plan.heads_per_cta) + " " +
           std::to_string(plan.fold_split) + " " + std::to_string(plan.fold_split_rows) + " " +
           std::to_string(plan.grid_x) + " " + std::to_string(plan.grid_y);
  }
  if (command == "update") {
    Mamba2UpdateProblem problem;
    int work_counter, ctas;
    in >> problem.batch >> problem.heads >> problem.tile_bytes >> work_counter >> ctas;
    if (!(in >> problem.parts)) problem.parts = 1;
    problem.max_stages = 8;
    problem.static_bytes = 256;
    problem.work_counter = work_counter != 0;
    const int stages = plan_mamba2_update_stages(problem, device, overrides);
    const Mamba2UpdatePlan plan = plan_mamba2_update(problem, stages, ctas, device, overrides);
    return std::to_string(plan.stages) + " " + std::to_string(plan.grid) + " " + (plan.claims ? "1" : "0");
  }
  if (command == "pdl") {
    int64_t tiles;
    in >> tiles;
    const ProgrammaticLaunch launch = programmatic_launch(overrides, tiles, device.sm_count);
    return std::string(launch.wait ? "1" : "0") + " " + (launch.trigger ? "1" : "0");
  }
  if (command == "pdlstep") {
    int64_t tiles;
    in >> tiles;
    const ProgrammaticLaunch launch = programmatic_step_launch(overrides, tiles, device.sm_count);
    return std::string(launch.wait ? "1" : "0") + " " + (launch.trigger ? "1" : "0") + " " + (launch.warm_l2 ? "1" : "0");
  }
  if (command == "orderpasspdl") return step_starts_during_order_pass(overrides) ? "1" : "0";
  if (command == "updatesplit") {
    int64_t batch;
    int heads, parts;
    in >> batch >> heads >> parts;
    return mamba2_update_split(batch, heads, parts, device.sm_count, overrides) ? "1" : "0";
  }
  if (command == "verify") {
    Mamba2VerifyProblem problem;
    int ctas;
    in >> problem.batch >> problem.heads >> problem.groups >> ctas;
    const Mamba2VerifyPlan plan = plan_mamba2_verify(problem, 2, ctas, device, overrides);
    return std::to_string(plan.heads_per_cta) + " " + std::to_string(plan.grid_x) + " " + std::to_string(plan.grid_y);
  }
  if (command == "verifyring" || command == "foldring") {
    RingBytes ring;
    in >> ring.compiled_stages;
    if (command == "verifyring") {
      in >> ring.compiled_ctas_per_sm;
    } else {
      in >> ring.static_bytes;
    }
    for (int s = 1; s <= ring.compiled_stages && s <= kMaxRingStages; ++s) in >> ring.dynamic_bytes[s];
    return std::to_string(command == "verifyring" ? plan_mamba2_verify_stages(ring, device)
                                                  : plan_mamba2_fold_stages(ring, device));
  }
  if (command == "fold") {
    Mamba2FoldProblem problem;
    int stages, ctas;
    in >> problem.batch >> problem.heads >> stages >> ctas;
    if (!(in >> problem.layers)) problem.layers = 1;  // LAYERS: a layered launch
    const Mamba2FoldPlan plan = plan_mamba2_fold(problem, stages, ctas, device);
    return std::to_string(plan.ring_stages) + " " + std::to_string(plan.grid);
  }
  if (command == "gdnupdate") {
    GdnUpdateProblem problem;
    in >> problem.batch >> problem.v_heads >> problem.ctas_per_head;
    if (!(in >> problem.split_ctas_per_head)) problem.split_ctas_per_head = 0;
    const GdnUpdatePlan plan = plan_gdn_update(problem, device.sm_count, overrides);
    return std::to_string(plan.grid_x) + " " + std::to_string(plan.grid_y) + (plan.split ? " split" : "");
  }
  if (command == "gdnstep") {
    GdnStepProblem problem;
    int staggered, workspace = 1;
    in >> problem.batch >> problem.v_heads >> problem.v_dim >> staggered;
    int copy = 0, tile = 0;
    if (in >> problem.ctas_per_sm && in >> workspace && in >> problem.buffer_len && in >> copy) in >> tile;
    problem.read_copy = copy != 0;
    problem.chunked_tile = tile == 1;
    problem.staged_tile = tile == 2;
    problem.staggered_flush = staggered != 0;
    problem.order_workspace = workspace != 0;
    const GdnStepPlan plan = plan_gdn_step(problem, device, overrides);
    return std::to_string(plan.parts) + " " + std::to_string(plan.grid_x) + " " + std::to_string(plan.grid_y) +
           (plan.ordered ? " ordered" : "") +
           (plan.fold_parts > 1 ? " fold " + std::to_string(plan.fold_parts) + " " + std::to_string(plan.fold_rows) : "") +
           (plan.tile_stages > 0 ? " stages " + std::to_string(plan.tile_stages) : "");
  }
  if (command == "gdnverify") {
    GdnVerifyProblem problem;
    int ctas;
    in >> problem.batch >> problem.v_heads >> ctas;
    const GdnVerifyPlan plan = plan_gdn_verify(problem, 2, ctas, device, overrides);
    return std::to_string(plan.heads_per_cta) + " " + std::to_string(plan.grid_x) + " " + std::to_string(plan.grid_y);
  }
  if (command == "gdnring") {
    RingBytes ring;
    in >> ring.compiled_stages >> ring.compiled_ctas_per_sm >> ring.static_bytes;
    for (int s = 1; s <= ring.compiled_stages && s <= kMaxRingStages; ++s) in >> ring.dynamic_bytes[s];
    const int verify = plan_gdn_verify_stages(ring, device), fold = plan_gdn_fold_stages(ring, device);
    if (verify != fold) return "error verify " + std::to_string(verify) + " fold " + std::to_string(fold);
    return std::to_string(verify);
  }
  if (command == "gdnfold") {
    GdnFoldProblem problem;
    int stages, ctas;
    in >> problem.batch >> problem.v_heads >> stages >> ctas;
    if (!(in >> problem.layers)) problem.layers = 1;  // LAYERS: a layered launch
    const GdnFoldPlan plan = plan_gdn_fold(problem, stages, ctas, device);
    return std::to_string(plan.ring_stages) + " " + std::to_string(plan.grid);
  }
  return "error unknown command " + command;
}

}  // namespace

int main() {
  DeviceInfo device;
  device.sm_count = 132;
  device.smem_per_sm = 228 * 1024;
  device.smem_per_block_optin = 227 * 1024;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::cout << answer(line, device) << "\n";
  }
  return 0;
}
