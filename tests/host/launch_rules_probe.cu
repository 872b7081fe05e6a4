// Host-only probe of the kernels' launch rules (tests/test_launch_rules.py). It launches nothing: it
// calls the header's rule functions on the lines of stdin and prints their answers, so the rules are
// tested on machines without a GPU (CI), where multiprocessor_count() falls back to the H200's 132.
//
// stdin, one query a line:  batch heads groups ctas_per_sm waves one_wave knob
//   knob: the value REPLAYSSM_PROBE_HEADS_PER_CTA is set to for this query, or "-" for unset.
// stdout: "sms <n>" first, then the heads per CTA chosen for each query, one a line.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/mamba2_tile.cuh"

int main() {
  constexpr const char* kKnob = "REPLAYSSM_PROBE_HEADS_PER_CTA";
  std::printf("sms %d\n", replayssm::mamba2::multiprocessor_count());
  long long batch = 0;
  int heads = 0, groups = 0, ctas_per_sm = 0, waves = 0, one_wave = 0;
  char knob[32];
  while (std::scanf("%lld %d %d %d %d %d %31s", &batch, &heads, &groups, &ctas_per_sm, &waves, &one_wave, knob) == 7) {
    if (std::strcmp(knob, "-") == 0) {
      unsetenv(kKnob);
    } else {
      setenv(kKnob, knob, 1);
    }
    std::printf("%d\n", replayssm::mamba2::choose_heads_per_cta(batch, heads, groups, ctas_per_sm, kKnob, waves,
                                                                one_wave != 0));
  }
  return 0;
}
