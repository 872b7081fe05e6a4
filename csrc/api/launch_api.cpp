// replayssm_cuda._C.set_launch_overrides(dict) / get_launch_overrides(): the Python side of the launch
// overrides (launch/overrides.h), used by replayssm_cuda.launch_overrides(**fields).
#include <string>

#include <pybind11/pybind11.h>

#include "api/python_api.h"
#include "launch/overrides.h"

namespace replayssm {
namespace {

namespace py = pybind11;

py::dict get_launch_overrides() {
  const launch::LaunchOverrides& current = launch::launch_overrides();
  int count = 0;
  const launch::OverrideField* fields = launch::override_fields(&count);
  py::dict out;
  for (int i = 0; i < count; ++i) out[fields[i].name] = current.*fields[i].member;
  return out;
}

// Every field the dict names takes its value (None: unset); the others are unset. Nothing changes
// unless every entry is good.
void set_launch_overrides(const py::dict& values) {
  launch::LaunchOverrides next;
  for (const auto& item : values) {
    const std::string name = py::str(item.first);
    const launch::OverrideField* field = launch::find_override_field(name);
    if (field == nullptr) {
      std::string known;
      int count = 0;
      const launch::OverrideField* fields = launch::override_fields(&count);
      for (int i = 0; i < count; ++i) known += (i ? ", " : "") + std::string(fields[i].name);
      throw py::value_error("set_launch_overrides: unknown field " + name + " (the fields: " + known + ")");
    }
    if (item.second.is_none()) {
      next.*field->member = field->unset;
      continue;
    }
    if (!py::isinstance<py::int_>(item.second) || py::isinstance<py::bool_>(item.second)) {
      throw py::value_error("set_launch_overrides: " + name + " must be an int or None, got " +
                            std::string(py::str(py::type::of(item.second).attr("__name__"))));
    }
    long long value = 0;
    try {
      value = item.second.cast<long long>();
    } catch (const py::cast_error&) {
      throw py::value_error("set_launch_overrides: " + name + " must be in [" + std::to_string(field->lowest) +
                            ", " + std::to_string(field->highest) + "], got " + std::string(py::str(item.second)));
    }
    const std::string error = launch::override_error(*field, value);
    if (!error.empty()) throw py::value_error("set_launch_overrides: " + error);
    next.*field->member = static_cast<int>(value);
  }
  launch::set_launch_overrides(next);
}

py::list describe_launch_overrides() {
  int count = 0;
  const launch::OverrideField* fields = launch::override_fields(&count);
  py::list out;
  for (int i = 0; i < count; ++i) {
    py::dict entry;
    entry["name"] = fields[i].name;
    entry["environment"] = fields[i].environment;
    entry["unset"] = fields[i].unset;
    entry["lowest"] = fields[i].lowest;
    entry["highest"] = fields[i].highest;
    entry["description"] = fields[i].description;
    out.append(entry);
  }
  return out;
}

}  // namespace

void register_launch_api(pybind11::module_& m) {
  m.def("get_launch_overrides", &get_launch_overrides,
        "the launch overrides in force: {field: value}, an unset field at its unset value (0 or -1)");
  m.def("set_launch_overrides", &set_launch_overrides, pybind11::arg("overrides"),
        "replaces the launch overrides: the dict's fields take its values (None: unset), the others are "
        "unset; ValueError names an unknown field or a bad value. A CUDA graph keeps the launch chosen "
        "when it was captured.");
  m.def("describe_launch_overrides", &describe_launch_overrides,
        "every launch override: name, environment variable, unset value, range and description");
}

}  // namespace replayssm
