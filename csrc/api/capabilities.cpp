// _C.capabilities() (capabilities.h): {"<family>": {"ops": [...], ...the family's facts}, "cache": {...}}.
#include "api/capabilities.h"

#include <algorithm>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "api/ops.h"
#include "api/python_api.h"
#include "cache/read_copy.cuh"
#include "cache/slot_ops.cuh"
#include "cache/variants.h"

namespace replayssm {
namespace {

namespace py = pybind11;

struct Family {
  const char* name;  // the key, and the prefix of its ops' names ("mamba2" -> "mamba2_step")
  FamilyCapabilities facts;
};

const Family kFamilies[] = {
    {"mamba2", mamba2_capabilities},
    {"gdn", gdn_capabilities},
    {"kda", kda_capabilities},
};

std::vector<std::string> compiled_ops() {
#define REPLAYSSM_OP_NAME(name, schema) #name,
  return {REPLAYSSM_CUDA_OPS(REPLAYSSM_OP_NAME)};
#undef REPLAYSSM_OP_NAME
}

bool has_prefix(const std::string& name, const std::string& family) {
  return name.compare(0, family.size() + 1, family + "_") == 0;
}

py::dict capabilities() {
  const std::vector<std::string> ops = compiled_ops();
  py::dict out;
  std::vector<std::string> shared(ops);
  for (const Family& family : kFamilies) {
    std::vector<std::string> own;
    for (const std::string& op : ops) {
      if (has_prefix(op, family.name)) own.push_back(op);
    }
    for (const std::string& op : own) shared.erase(std::find(shared.begin(), shared.end(), op));
    py::dict entry;
    entry["ops"] = own;
    for (const auto& item : family.facts()) entry[item.first] = item.second;
    out[family.name] = entry;
  }
  // The cache ops every family's cache uses (read copies, slot loads, resets, copies).
  py::dict shared_entry;
  shared_entry["ops"] = shared;
  auto names = [](const std::vector<DType>& dtypes) {
    std::vector<std::string> out;
    for (DType t : dtypes) out.push_back(dtype_name(t));
    return out;
  };
  shared_entry["checkpoint_dtypes"] = names(cache::checkpoint_dtypes());  // make_read_copy's and load's
  shared_entry["read_copy_dtypes"] = names(cache::read_copy_dtypes());
  shared_entry["read_copy_max_cols"] = kReadCopyMaxCols;
  shared_entry["copy_slots_max_pairs"] = kCopySlotsMaxPairs;
  out["cache"] = shared_entry;
  return out;
}

}  // namespace

void register_capabilities(pybind11::module_& m) {
  m.def("capabilities", &capabilities,
        "what this build compiled: {family: {ops, shapes, dtypes, limits}, 'cache': {ops, limits}}, from the "
        "families' variants tables");
}

}  // namespace replayssm
