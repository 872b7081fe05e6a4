// Launch overrides: the environment is read here and nowhere else in csrc/ (overrides.h).
#include "launch/overrides.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace replayssm {
namespace launch {
namespace {

#define REPLAYSSM_OVERRIDE_ENTRY(name, variable, unset, lowest, highest, doc) \
  OverrideField{#name, variable, unset, lowest, highest, doc, &LaunchOverrides::name},
const OverrideField kFields[] = {REPLAYSSM_LAUNCH_OVERRIDES(REPLAYSSM_OVERRIDE_ENTRY)};
#undef REPLAYSSM_OVERRIDE_ENTRY
constexpr int kFieldCount = static_cast<int>(sizeof(kFields) / sizeof(kFields[0]));

struct State {
  std::once_flag read_once;
  LaunchOverrides value;
};

State& state() {
  static State s;
  return s;
}

}  // namespace

const OverrideField* override_fields(int* count) {
  if (count != nullptr) *count = kFieldCount;
  return kFields;
}

const OverrideField* find_override_field(const std::string& name) {
  for (const OverrideField& field : kFields) {
    if (name == field.name) return &field;
  }
  return nullptr;
}

std::string override_error(const OverrideField& field, int64_t value) {
  if (value >= field.lowest && value <= field.highest) return "";
  return std::string(field.name) + " must be in [" + std::to_string(field.lowest) + ", " +
         std::to_string(field.highest) + "] (" + std::to_string(field.unset) + ": the rule), got " +
         std::to_string(value);
}

LaunchOverrides launch_overrides_from_environment() {
  LaunchOverrides overrides;
  for (const OverrideField& field : kFields) {
    const char* text = std::getenv(field.environment);
    if (text == nullptr) continue;
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(text, &end, 10);
    const bool integer = end != text && *end == '\0' && errno == 0;
    const std::string error = integer ? override_error(field, value) : std::string(field.name) + " must be an integer";
    if (error.empty()) {
      overrides.*field.member = static_cast<int>(value);
    } else {
      std::fprintf(stderr, "replayssm: ignoring %s=%s (%s); the launch rule decides\n", field.environment, text,
                   error.c_str());
    }
  }
  return overrides;
}

const LaunchOverrides& launch_overrides() {
  State& s = state();
  std::call_once(s.read_once, [&s] { s.value = launch_overrides_from_environment(); });
  return s.value;
}

void set_launch_overrides(const LaunchOverrides& overrides) {
  State& s = state();
  std::call_once(s.read_once, [] {});  // once set, the environment is not read any more
  s.value = overrides;
}

}  // namespace launch
}  // namespace replayssm
