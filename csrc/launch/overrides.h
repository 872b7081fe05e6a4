// Launch overrides: the fields that replace a launch rule's choice, for tests, benchmarks and tuning.
// Host-only C++ (no CUDA, no torch). Each field is read once, the first time a launch asks for the
// overrides, from the environment variable of its name in upper case with the prefix REPLAYSSM_
// (step_heads_per_cta: REPLAYSSM_STEP_HEADS_PER_CTA), or set through set_launch_overrides (from
// Python: replayssm_cuda.launch_overrides(**fields)). A variable that is not an integer in the field's
// range is ignored (the rule decides) with one line on stderr naming it.
//
// The overrides are consulted when a launch is planned, so a CUDA graph keeps the launch that was
// chosen when it was captured: changing them later does not change a captured graph.
//
// The rules themselves, what each override replaces and the measurements behind them:
// docs/TUNING.md.
#pragma once

#include <cstdint>
#include <string>

namespace replayssm {
namespace launch {

// X(field, variable, unset, lowest, highest, description): every override, the environment variable it
// is read from, its "not set" value (the rule decides), the range of values it takes and what a value
// does. One table for the struct, the environment, the Python hook and the docs.
#define REPLAYSSM_LAUNCH_OVERRIDES(X)                                                                        \
  X(step_heads_per_cta, "REPLAYSSM_STEP_HEADS_PER_CTA", 0, 0, 65535,                                         \
    "mamba2_step: k heads of one group per CTA (the largest divisor of the group size <= k), and no "        \
    "two-group CTAs (unless step_groups_per_cta = 2) nor fold split; 0: the rules")                          \
  X(step_groups_per_cta, "REPLAYSSM_STEP_GROUPS_PER_CTA", 0, 0, 2,                                           \
    "mamba2_step with a read copy on tensor cores: 2 two whole groups per CTA wherever the groups pair "      \
    "up, 1 never; 0: the rule (an fp8 copy, where they fill one wave or their waves to 95%)")                \
  X(step_order, "REPLAYSSM_STEP_ORDER", -1, -1, 1,                                                           \
    "mamba2_step under staggered_flush: 1 the order pass (folding rows first) at every launch, 0 never "     \
    "(nor the fold split); -1: the rule (past one wave, or with the fold split)")                            \
  X(step_fold_split, "REPLAYSSM_STEP_FOLD_SPLIT", -1, -1, 65535,                                             \
    "mamba2_step under staggered_flush with the order pass: 0 no fold split; k >= 1 the first "              \
    "ceil(batch / L) folding rows in CTAs of k heads (the largest divisor of the replaying rows' block <= "  \
    "k) wherever that block is larger, at any batch and number of waves; -1: the rule")                     \
  X(step_staggered_heads_per_cta, "REPLAYSSM_STEP_STAGGERED_HEADS_PER_CTA", 0, 0, 65535,                     \
    "mamba2_step under staggered_flush: the replaying rows' CTAs take k heads of one group (the largest "     \
    "divisor of the group size <= k), the order pass by its rule or step_order, a fold split only where "     \
    "step_fold_split >= 1; lock-step launches unchanged; 0: the rules")                                      \
  X(verify_heads_per_cta, "REPLAYSSM_VERIFY_HEADS_PER_CTA", 0, 0, 65535,                                     \
    "mamba2_verify: k heads of one group per CTA (the largest divisor of the group size <= k); gdn_verify: "  \
    "k v-heads per CTA (the largest divisor of the v-heads <= k); 0: the rules")                              \
  X(gdn_step_parts, "REPLAYSSM_GDN_STEP_PARTS", 0, 0, 4,                                                     \
    "gdn_step and kda_step: each (row, v-head) in k CTAs of V / k value rows (k the largest of 1, 2, 4 "     \
    "<= the value that divides V / 32); 0: the rule (the most parts whose CTAs do not outnumber the SMs)")                  \
  X(gdn_step_order, "REPLAYSSM_GDN_STEP_ORDER", -1, -1, 2,                                                  \
    "gdn_step and kda_step under staggered_flush: 1 the order pass (folding rows first) at every launch, "   \
    "0 never; 2 (experiment) at every launch, lock-step ones too; -1: the rule (where the CTAs take more "   \
    "than one wave)")                                                                                        \
  X(gdn_step_order_cursor, "REPLAYSSM_GDN_STEP_ORDER_CURSOR", -1, -1, 1,                                    \
    "(experiment) gdn_step and kda_step behind the order pass: 1 the pass also writes each row's cursor and " \
    "the CTAs take it from there, 0 they read the slot's cursor; -1: 1")                                     \
  X(gdn_step_fold_parts, "REPLAYSSM_GDN_STEP_FOLD_PARTS", 0, 0, 4,                                           \
    "gdn_step and kda_step under staggered_flush, one part a v-head: the first ceil(batch / L) folding rows " \
    "in k CTAs a v-head (the largest of 2, 4 <= k), with the order pass; 1: none; 0: the rule (4 where "     \
    "batch x HV <= 2 x SMs (and, without a read copy, batch >= L / 2), or <= 4 x SMs with one)")            \
  X(gdn_step_tile_stages, "REPLAYSSM_GDN_STEP_TILE_STAGES", -1, -1, 4,                                      \
    "gdn_step and kda_step with an fp32 checkpoint and no read copy: the tile in chunks of 32 value rows, "  \
    "at most n in flight; gdn_step with a 16-bit read copy: any n >= 1 asks for its chunks over the "        \
    "set-up (the staged kernel); 0 the whole tile in one copy; -1: the rule (1; a 16-bit copy only where "   \
    "the CTAs outnumber the SMs)")                                                                           \
  X(gdn_update_split, "REPLAYSSM_GDN_UPDATE_SPLIT", -1, -1, 1,                                              \
    "gdn_update and kda_update: 1 CTAs of 4 KB of state (one pass of value rows), 0 of 16 KB; -1: the rule " \
    "(4 KB where 4 x batch x HV <= SMs)")                                                                    \
  X(update_stages, "REPLAYSSM_UPDATE_STAGES", 0, 0, 8,                                                       \
    "mamba2_update: s state tiles in each CTA's ring (capped at what fits); 0: the rule")                    \
  X(update_ctas, "REPLAYSSM_UPDATE_CTAS", 0, 0, 1 << 30,                                                     \
    "mamba2_update: at most n CTAs in the persistent grid (small batches then wrap the ring); 0: one wave")  \
  X(update_claims, "REPLAYSSM_UPDATE_CLAIMS", -1, -1, 1,                                                     \
    "mamba2_update: 1 claim every item past each CTA's first rounds from a counter, 0 fixed shares; "        \
    "-1: the rule (2.25 rounds of items or more to claim)")                                                  \
  X(update_split, "REPLAYSSM_UPDATE_SPLIT", -1, -1, 1,                                                       \
    "mamba2_update: 1 items of one pass of state rows (a head's tile split over CTAs), 0 whole heads; "       \
    "-1: the rule (split where whole heads give fewer items than SMs)")                                      \
  X(order_pass_pdl, "REPLAYSSM_ORDER_PASS_PDL", -1, -1, 1,                                                  \
    "mamba2_step, gdn_step and kda_step after their order pass: 1 the step launched with programmatic "      \
    "dependent launch behind the pass (its CTAs start while the pass runs), 0 after it; -1: the rule (1)")  \
  X(pdl_warm, "REPLAYSSM_PDL_WARM", -1, -1, 1,                                                             \
    "mamba2_step, gdn_step and kda_step launched with programmatic dependent launch: 1 each CTA asks L2 "    \
    "for its slot's cursor, tile and window before it waits for the kernel ahead, 0 it asks nothing "       \
    "before; -1: the rule (1)")                                                                              \
  X(pdl, "REPLAYSSM_PDL", -1, -1, 2,                                                                         \
    "mamba2_update, mamba2_step, gdn_update and gdn_step: 1 programmatic dependent launch both ways (each "   \
    "kernel may start while the one before it in the stream ends, and lets the next start early); 2 the "   \
    "first half only (started early, the next kernel not); 0 neither; -1: the rule (both where batch x "  \
    "heads (GDN, KDA: v-heads) <= the SMs, else neither)")

struct LaunchOverrides {
#define REPLAYSSM_OVERRIDE_FIELD(name, variable, unset, lowest, highest, doc) int name = unset;
  REPLAYSSM_LAUNCH_OVERRIDES(REPLAYSSM_OVERRIDE_FIELD)
#undef REPLAYSSM_OVERRIDE_FIELD
};

// The overrides in force: the environment's, read the first time this is called, or the last ones set.
const LaunchOverrides& launch_overrides();

// Replaces the overrides in force (every field; an unset field lets its rule decide). A hook for tests
// and benchmarks: call it between launches, not while another thread launches. Fields out of range are
// the caller's error: check them with override_error first (the Python hook does).
void set_launch_overrides(const LaunchOverrides& overrides);

// The overrides the environment sets now (the first call of launch_overrides takes these).
LaunchOverrides launch_overrides_from_environment();

// One override's description, for the Python hook and the docs.
struct OverrideField {
  const char* name;         // the field, e.g. "step_heads_per_cta"
  const char* environment;  // its variable, e.g. "REPLAYSSM_STEP_HEADS_PER_CTA"
  int unset, lowest, highest;
  const char* description;
  int LaunchOverrides::*member;
};
// Every override, in the order of REPLAYSSM_LAUNCH_OVERRIDES; `count` receives their number.
const OverrideField* override_fields(int* count);
// The field named `name`, or nullptr.
const OverrideField* find_override_field(const std::string& name);
// Why `value` is not a value of `field` ("" when it is): "<field> must be in [lo, hi], got v".
std::string override_error(const OverrideField& field, int64_t value);

}  // namespace launch
}  // namespace replayssm
