// The layer table: the per-layer pointers of every layer cache of a model, in device memory, so that
// commit, flush and materialize run for all layers of one family in ONE launch (the layer is a grid
// dimension; a CTA reads its layer's pointers from the table). Host-safe header.
//
// Every layer of a table shares the shapes, strides and dtypes of its cache tensors (the builder checks
// it, naming the layer and the tensor): the kernels take those once, from the params of layer 0 that the
// op fills exactly as the per-layer op fills them, and only the pointers below differ per layer.
//
// The table, int64 words: [0] fingerprint (the pointers, shapes, strides and dtypes of every tensor of
// every layer, api/layer_table_api.h), [1] the number of layers, then one LayerPointers record (16 words) per
// layer. Built once (the API's <family>_layer_table, one host-to-device copy); each op computes the
// fingerprint of the tensors it was called with and the kernels trap when the table's differs (a table
// built for other tensors), like a device-side assert.
#pragma once

#include <cstdint>

namespace replayssm {

constexpr int kLayerTableHeader = 2;
// Buffers and weights a family names per layer: Mamba-2 uses x_buf, B_buf, dt_buf and A; GDN uses
// k_buf, v_buf, g_buf, beta_buf and u_buf (its fold reads no weights and has no rounding seed).
constexpr int kLayerMaxBuffers = 5;
constexpr int kLayerMaxWeights = 2;

// One layer's tensors (nullptr where the layer has none: no read copy, no fp8 scales, no rounding seed,
// no error word).
struct LayerPointers {
  void* checkpoint;
  void* read_copy;
  float* read_scale;
  void* buffers[kLayerMaxBuffers];
  int32_t* num_committed;
  int32_t* num_verified;
  const void* weights[kLayerMaxWeights];
  int64_t* rounding_seed;
  int32_t* error_word;
  void* unused[2];  // the record is 16 words: one 128-byte line
};
static_assert(sizeof(LayerPointers) == 16 * sizeof(int64_t), "a layer record is 16 int64 words");
constexpr int kLayerRecordWords = static_cast<int>(sizeof(LayerPointers) / sizeof(int64_t));

constexpr int64_t layer_table_len(int64_t num_layers) { return kLayerTableHeader + num_layers * kLayerRecordWords; }

// What a layered launch adds to the per-layer params: the table, the fingerprint of the call's tensors,
// and the layer stride (in elements) of the per-call tensor that holds every layer (materialize's out).
struct LayerTableArgs {
  const int64_t* table;  // device
  uint64_t fingerprint;
  int32_t num_layers;
  int64_t out_layer_stride;
};

#ifdef __CUDACC__
// Layer `layer`'s record; traps when the table was built for other tensors than the call's.
__device__ __forceinline__ const LayerPointers& layer_pointers(const LayerTableArgs& t, int layer) {
  if (static_cast<uint64_t>(t.table[0]) != t.fingerprint || t.table[1] != t.num_layers) __trap();
  return reinterpret_cast<const LayerPointers*>(t.table + kLayerTableHeader)[layer];
}
#endif

}  // namespace replayssm
