// The host side of the layer table (cache/layer_table.h) that every family's *_layer_table builder and
// *_layers ops share: the layer lists checked against layer 0, their fingerprint, the table argument
// and the table itself. A family names its lists in table-record order and fills each layer's record.
// Host-only (torch); kernels never see it. Messages: "<op>: <argument> must <expectation>, got <what>".
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "api/checks.h"
#include "cache/layer_table.h"

namespace replayssm {
namespace layer_table_api {

// One list argument of a layered op: one tensor per layer, or none where `optional` (no layer has one);
// `shared`: read only, so layers may share its tensors (weights).
struct LayerList {
  const char* name;
  at::TensorList tensors;
  bool optional = false;
  bool shared = false;
};

inline uint64_t fnv(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
  return h;
}

// Checks that every list holds one tensor per layer (or none, for the optional ones) and that every
// layer's tensors have layer 0's shapes, strides, dtypes and device; returns the fingerprint of all of
// them and sets num_layers (the first list's length). The fingerprint hashes every tensor's pointer but
// the dtype, shape and strides of layer 0's only: the checks above make every other layer's equal to
// them, so these inputs still determine every tensor's pointer, dtype, shape and strides, and a table
// built for other tensors still gets another fingerprint (its builder hashes the same way). It runs on
// every layered call: hashing every layer's shapes and strides too took ~24 us of host time a call at
// 40 layers x 11 lists, the pointers alone take under 1 us beside the checks' ~6.
inline uint64_t check_layers(const char* op, const std::vector<LayerList>& lists, int64_t& num_layers) {
  num_layers = static_cast<int64_t>(lists.front().tensors.size());
  TORCH_CHECK(num_layers >= 1 && num_layers <= 65535, checks::cat(op, ": ", lists.front().name, " must hold one tensor per layer, 1 to 65535 layers, got ", num_layers));
  uint64_t h = fnv(14695981039346656037ull, static_cast<uint64_t>(num_layers));
  for (const LayerList& f : lists) {
    const at::TensorList& list = f.tensors;
    const int64_t n = static_cast<int64_t>(list.size());
    TORCH_CHECK(n == num_layers || (f.optional && n == 0), checks::cat(op, ": ", f.name, " must hold one tensor per layer (", num_layers, ")", f.optional ? " or none" : "", ", got ", n));
    h = fnv(h, static_cast<uint64_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor& t = list[i];
      const at::Tensor& t0 = list[0];
      if (i > 0) {
        TORCH_CHECK(t.scalar_type() == t0.scalar_type(), checks::cat(op, ": layer ", i, "'s ", f.name, " must have layer 0's dtype ", checks::dtype_str(t0.scalar_type()), ", got ", checks::dtype_str(t.scalar_type())));
        TORCH_CHECK(t.sizes() == t0.sizes(), checks::cat(op, ": layer ", i, "'s ", f.name, " must have layer 0's shape ", checks::shape_str(t0.sizes()), ", got ", checks::shape_str(t.sizes())));
        TORCH_CHECK(t.strides() == t0.strides(), checks::cat(op, ": layer ", i, "'s ", f.name, " must have layer 0's strides ", checks::shape_str(t0.strides()), " (the kernels take one set of strides for all layers), got ", checks::shape_str(t.strides())));
        TORCH_CHECK(t.device() == t0.device(), checks::cat(op, ": layer ", i, "'s ", f.name, " must be on layer 0's device ", t0.device().str(), ", got ", t.device().str()));
      }
      h = fnv(h, reinterpret_cast<uint64_t>(t.data_ptr()));
      if (i > 0) continue;
      h = fnv(h, static_cast<uint64_t>(t.scalar_type()));
      for (int64_t d = 0; d < t.dim(); ++d) h = fnv(fnv(h, static_cast<uint64_t>(t.size(d))), static_cast<uint64_t>(t.stride(d)));
    }
  }
  return h;
}

inline std::optional<at::Tensor> layer0(at::TensorList list) {
  return list.empty() ? std::nullopt : std::optional<at::Tensor>(list[0]);
}

// Layer i's tensor of a list, nullptr where the list is empty (an optional tensor no layer has).
inline void* layer_ptr(at::TensorList list, int64_t i) { return list.empty() ? nullptr : list[i].data_ptr(); }

// The table argument: the contiguous int64 table of num_layers layers on the caches' device, which
// `builder` (replayssm_cuda._C.<family>_layer_table) built.
inline LayerTableArgs table_args(const char* op, const char* builder, const at::Tensor& table, const at::Tensor& ref,
                                 int64_t num_layers, uint64_t fingerprint) {
  checks::cuda(op, "layer_table", table);
  checks::same_device(op, "layer_table", table, "checkpoints[0]", ref);
  checks::dtype_in(op, "layer_table", table, {at::kLong});
  const int64_t len = layer_table_len(num_layers);
  TORCH_CHECK(table.dim() == 1 && table.size(0) == len && table.is_contiguous(), checks::cat(op, ": layer_table must be the contiguous (", len, ",) int64 table that replayssm_cuda._C.", builder, " built for these ", num_layers, " layers, got shape ", checks::shape_str(table.sizes())));
  LayerTableArgs args{};
  args.table = table.data_ptr<int64_t>();
  args.fingerprint = fingerprint;
  args.num_layers = static_cast<int32_t>(num_layers);
  return args;
}

// The table of checked lists: layers write their own tensors in one launch, so no tensor of a list that
// is not `shared` may serve two layers (or two lists); record(i) fills layer i's pointers. Built on the
// host, copied once to ref's device.
template <class Record>
at::Tensor build_table(const char* op, const std::vector<LayerList>& lists, int64_t num_layers, uint64_t fingerprint,
                       const at::Tensor& ref, Record record) {
  std::set<const void*> seen;
  for (const LayerList& f : lists) {
    if (f.shared) continue;
    for (int64_t i = 0; i < static_cast<int64_t>(f.tensors.size()); ++i) {
      TORCH_CHECK(seen.insert(f.tensors[i].data_ptr()).second, checks::cat(op, ": layer ", i, "'s ", f.name, " shares its memory with another tensor of the layers (every layer must own its cache tensors)"));
    }
  }
  at::Tensor host = at::empty({layer_table_len(num_layers)}, at::dtype(at::kLong));
  int64_t* words = host.data_ptr<int64_t>();
  std::memset(words, 0, sizeof(int64_t) * host.numel());
  words[0] = static_cast<int64_t>(fingerprint);
  words[1] = num_layers;
  for (int64_t i = 0; i < num_layers; ++i) {
    LayerPointers r{};
    record(i, r);
    std::memcpy(words + kLayerTableHeader + i * kLayerRecordWords, &r, sizeof(r));
  }
  return host.to(ref.device());
}

}  // namespace layer_table_api
}  // namespace replayssm
