// Host-only probe of the kernels' launch rules (tests/test_launch_rules.py). It launches nothing: it
// calls the header's rule functions on the lines of stdin and prints their answers, so the rules are
// tested on machines without a GPU (CI), where multiprocessor_count() falls back to the H200's 132.
//
// stdin, one query a line:  batch heads groups ctas_per_sm waves one_wave full_waves fill_last_wave half knob
//   half: half_below_four_waves (0 / 1);
//   knob: the value REPLAYSSM_PROBE_HEADS_PER_CTA is set to for this query, or "-" for unset;
// or a fold-split query:     split batch heads groups buffer_len ctas_per_sm heads_knob split_knob
//   the values REPLAYSSM_STEP_HEADS_PER_CTA and REPLAYSSM_STEP_FOLD_SPLIT are set to, or "-" for unset;
//   the hint's launch it starts from is choose_heads_per_cta's as the step's launcher asks for it.
// or a two-group query:      twogroup batch groups ctas_per_sm by_rule groups_knob heads_knob
//   the values REPLAYSSM_STEP_GROUPS_PER_CTA and REPLAYSSM_STEP_HEADS_PER_CTA are set to, or "-".
// stdout: "sms <n>" first, then for each query the heads per CTA chosen, for a fold-split query
// "<replay heads per CTA> <split> <rows>", for a
// two-group query 1 or 0 (choose_two_group_ctas), one a line.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "families/mamba2/launch_rules.h"

// Sets `name` to `value`, or unsets it for "-".
static void set_knob(const char* name, const char* value) {
  if (std::strcmp(value, "-") == 0) {
    unsetenv(name);
  } else {
    setenv(name, value, 1);
  }
}

int main() {
  constexpr const char* kKnob = "REPLAYSSM_PROBE_HEADS_PER_CTA";
  std::printf("sms %d\n", replayssm::mamba2::multiprocessor_count());
  char first[32];
  while (std::scanf("%31s", first) == 1) {
    long long batch = 0;
    int heads = 0, groups = 0, ctas_per_sm = 0;
    if (std::strcmp(first, "twogroup") == 0) {
      int by_rule = 0;
      char groups_knob[32], heads_knob[32];
      if (std::scanf("%lld %d %d %d %31s %31s", &batch, &groups, &ctas_per_sm, &by_rule, groups_knob, heads_knob) != 6) {
        return 1;
      }
      set_knob("REPLAYSSM_STEP_GROUPS_PER_CTA", groups_knob);
      set_knob("REPLAYSSM_STEP_HEADS_PER_CTA", heads_knob);
      std::printf("%d\n", replayssm::mamba2::choose_two_group_ctas(batch, groups, ctas_per_sm, by_rule != 0) ? 1 : 0);
      continue;
    }
    if (std::strcmp(first, "split") == 0) {
      int buffer_len = 0;
      char heads_knob[32], split_knob[32];
      if (std::scanf("%lld %d %d %d %d %31s %31s", &batch, &heads, &groups, &buffer_len, &ctas_per_sm, heads_knob,
                     split_knob) != 7) {
        return 1;
      }
      set_knob("REPLAYSSM_STEP_HEADS_PER_CTA", heads_knob);
      set_knob("REPLAYSSM_STEP_FOLD_SPLIT", split_knob);
      // The hint's launch, as the step's launcher chooses it (4 waves, no one-wave rule).
      const int hint_heads = replayssm::mamba2::choose_heads_per_cta(batch, heads, groups, ctas_per_sm,
                                                                     "REPLAYSSM_STEP_HEADS_PER_CTA", 4, false);
      const auto s = replayssm::mamba2::choose_fold_split(batch, heads, groups, buffer_len, ctas_per_sm, hint_heads);
      std::printf("%d %d %d\n", s.heads_per_cta, s.split, s.rows);
      continue;
    }
    int waves = 0, one_wave = 0, full_waves = 0, fill_last_wave = 0, half = 0;
    char knob[32];
    batch = std::atoll(first);
    if (std::scanf("%d %d %d %d %d %d %d %d %31s", &heads, &groups, &ctas_per_sm, &waves, &one_wave, &full_waves,
                   &fill_last_wave, &half, knob) != 9) {
      return 1;
    }
    set_knob(kKnob, knob);
    std::printf("%d\n", replayssm::mamba2::choose_heads_per_cta(batch, heads, groups, ctas_per_sm, kKnob, waves,
                                                                one_wave != 0, full_waves != 0, fill_last_wave != 0,
                                                                half != 0));
  }
  return 0;
}
