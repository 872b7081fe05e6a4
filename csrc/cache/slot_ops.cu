// Slot copy / fill / load kernels (slot_ops.cuh). All memory-bound byte movers.
//
// copy and fill split every tensor's slot into chunks of `chunk` bytes; CTA b owns one chunk of one
// tensor for every entry of the slot list. Inside a chunk a thread moves `granule` bytes at a time:
// the largest of 16, 8, 4, 2, 1 that divides the tensor's base address, slot stride and slot size,
// so pools of any alignment work and ordinary ones move 16-byte vectors.
#include "cache/slot_ops.cuh"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "cache/slot_map.cuh"
#include "cache/variants.h"
#include "common/convert.cuh"

namespace replayssm {
namespace slot_ops {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kFillChunk = 4096;

struct Chunks {
  int64_t chunk;                                 // bytes per chunk (a multiple of 16)
  int64_t first_block[kSlotOpsMaxTensors + 1];   // blocks of tensor i: [first_block[i], first_block[i+1])
  int32_t granule[kSlotOpsMaxTensors];
};

// The slot of list entry i, or -1 when it is a pad id or out of range.
__device__ __forceinline__ int64_t entry_slot(const void* list, DType dtype, int64_t stride, int64_t i,
                                              int64_t pad, int64_t num_slots) {
  const int64_t s = list == nullptr ? i : load_index(list, dtype, i, stride);
  return (s == pad || s < 0 || s >= num_slots) ? -1 : s;
}

template <int kG> struct Unit;
template <> struct Unit<16> { using T = uint4; };
template <> struct Unit<8> { using T = uint2; };
template <> struct Unit<4> { using T = uint32_t; };
template <> struct Unit<2> { using T = uint16_t; };
template <> struct Unit<1> { using T = uint8_t; };

__device__ __forceinline__ int tensor_of_block(const Chunks& c, int num_tensors, int64_t block) {
  int t = 0;
  while (t + 1 < num_tensors && block >= c.first_block[t + 1]) ++t;
  return t;
}

// Moves one chunk of one tensor for all pairs: sources to shared memory, barrier, destinations. P:
// SlotOpsParams or SlotTableParams (the same slot-list fields).
template <int kG, class P>
__device__ void copy_chunk(const P& p, const SlotTensor& t, int64_t offset, int units,
                           unsigned char* stage, int64_t chunk) {
  using U = typename Unit<kG>::T;
  const int total = static_cast<int>(p.num_entries) * units;
  const char* base = static_cast<const char*>(t.base);
  for (int item = threadIdx.x; item < total; item += kThreads) {
    const int pair = item / units, u = item - pair * units;
    const int64_t src = entry_slot(p.src, p.src_dtype, p.src_stride, pair, p.pad_slot_id, p.num_slots);
    const int64_t dst = entry_slot(p.dst, p.dst_dtype, p.dst_stride, pair, p.pad_slot_id, p.num_slots);
    if (src < 0 || dst < 0) continue;
    *reinterpret_cast<U*>(stage + pair * chunk + u * kG) =
        *reinterpret_cast<const U*>(base + src * t.slot_stride + offset + u * kG);
  }
  // Every source of this byte range is in shared memory (the loads completed: their values were
  // stored) before any thread of the CTA writes a destination of the same range.
  __syncthreads();
  char* out = static_cast<char*>(t.base);
  for (int item = threadIdx.x; item < total; item += kThreads) {
    const int pair = item / units, u = item - pair * units;
    const int64_t src = entry_slot(p.src, p.src_dtype, p.src_stride, pair, p.pad_slot_id, p.num_slots);
    const int64_t dst = entry_slot(p.dst, p.dst_dtype, p.dst_stride, pair, p.pad_slot_id, p.num_slots);
    if (src < 0 || dst < 0) continue;
    *reinterpret_cast<U*>(out + dst * t.slot_stride + offset + u * kG) =
        *reinterpret_cast<const U*>(stage + pair * chunk + u * kG);
  }
}

// A block's len bytes of tensor t from offset, in units of the granule g (16 / 8 / 4 / 2 / 1 bytes) that
// its base, slot stride and slot size all allow: one switch for the per-layer and the table kernels.
template <class P>
__device__ __forceinline__ void copy_range(const P& p, const SlotTensor& t, int64_t offset, int64_t len, int g,
                                           unsigned char* stage, int64_t chunk) {
  const int units = static_cast<int>(len / g);
  switch (g) {
    case 16: copy_chunk<16>(p, t, offset, units, stage, chunk); break;
    case 8: copy_chunk<8>(p, t, offset, units, stage, chunk); break;
    case 4: copy_chunk<4>(p, t, offset, units, stage, chunk); break;
    case 2: copy_chunk<2>(p, t, offset, units, stage, chunk); break;
    default: copy_chunk<1>(p, t, offset, units, stage, chunk); break;
  }
}

__global__ void __launch_bounds__(kThreads) copy_slots_kernel(const SlotOpsParams p, const Chunks c) {
  extern __shared__ uint4 stage_vec[];
  unsigned char* stage = reinterpret_cast<unsigned char*>(stage_vec);
  const int64_t block = blockIdx.x;
  const int ti = tensor_of_block(c, p.num_tensors, block);
  const SlotTensor& t = p.tensors[ti];
  const int64_t offset = (block - c.first_block[ti]) * c.chunk;
  const int64_t len = t.bytes_per_slot - offset < c.chunk ? t.bytes_per_slot - offset : c.chunk;
  const int g = c.granule[ti];
  copy_range(p, t, offset, len, g, stage, c.chunk);
}

template <int kG, class P>
__device__ void fill_chunk(const P& p, const SlotTensor& t, int64_t offset, int units) {
  using U = typename Unit<kG>::T;
  U value;
  if constexpr (kG == 16) {
    value = make_uint4(t.fill, t.fill, t.fill, t.fill);
  } else if constexpr (kG == 8) {
    value = make_uint2(t.fill, t.fill);
  } else {
    value = static_cast<U>(t.fill);  // 2- and 1-byte granules only ever fill zeros (launcher check)
  }
  const int64_t total = p.num_entries * units;
  char* base = static_cast<char*>(t.base);
  for (int64_t item = threadIdx.x; item < total; item += kThreads) {
    const int64_t entry = item / units, u = item - entry * units;
    const int64_t dst = entry_slot(p.dst, p.dst_dtype, p.dst_stride, entry, p.pad_slot_id, p.num_slots);
    if (dst < 0) continue;
    if constexpr (kG == 4) {
      // A staggered flush starts slot s's cursor at s % period (plan() allows it on 4-byte slots only).
      if (t.fill_slot_period != 0) value = static_cast<U>(dst % t.fill_slot_period);
    }
    *reinterpret_cast<U*>(base + dst * t.slot_stride + offset + u * kG) = value;
  }
}

// As copy_range, for fill_chunk.
template <class P>
__device__ __forceinline__ void fill_range(const P& p, const SlotTensor& t, int64_t offset, int64_t len, int g) {
  const int units = static_cast<int>(len / g);
  switch (g) {
    case 16: fill_chunk<16>(p, t, offset, units); break;
    case 8: fill_chunk<8>(p, t, offset, units); break;
    case 4: fill_chunk<4>(p, t, offset, units); break;
    case 2: fill_chunk<2>(p, t, offset, units); break;
    default: fill_chunk<1>(p, t, offset, units); break;
  }
}

__global__ void __launch_bounds__(kThreads) fill_slots_kernel(const SlotOpsParams p, const Chunks c) {
  const int64_t block = blockIdx.x;
  const int ti = tensor_of_block(c, p.num_tensors, block);
  const SlotTensor& t = p.tensors[ti];
  const int64_t offset = (block - c.first_block[ti]) * c.chunk;
  const int64_t len = t.bytes_per_slot - offset < c.chunk ? t.bytes_per_slot - offset : c.chunk;
  const int g = c.granule[ti];
  fill_range(p, t, offset, len, g);
}

int granule_of(const SlotTensor& t) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(t.base) | static_cast<uint64_t>(t.slot_stride) |
                        static_cast<uint64_t>(t.bytes_per_slot);
  for (int g = 16; g > 1; g /= 2) {
    if (bits % g == 0) return g;
  }
  return 1;
}

// Fills `c` for the tensors of `p` with `chunk` bytes per chunk; false when outside the contract.
bool plan(const SlotOpsParams& p, int64_t chunk, Chunks& c, bool fill) {
  c.chunk = chunk;
  c.first_block[0] = 0;
  for (int i = 0; i < p.num_tensors; ++i) {
    const SlotTensor& t = p.tensors[i];
    if (t.base == nullptr || t.bytes_per_slot < 1) return false;
    c.granule[i] = granule_of(t);
    if (fill && t.fill != 0 && c.granule[i] < 4) return false;
    if (t.fill_slot_period != 0 && (!fill || t.bytes_per_slot != 4 || c.granule[i] != 4)) return false;
    c.first_block[i + 1] = c.first_block[i] + (t.bytes_per_slot + chunk - 1) / chunk;
  }
  return c.first_block[p.num_tensors] <= INT_MAX;
}

bool common_ok(const SlotOpsParams& p) {
  if (p.num_tensors < 1 || p.num_tensors > kSlotOpsMaxTensors || p.num_slots < 0 || p.num_entries < 0) return false;
  auto index_ok = [](const void* list, DType d) { return list == nullptr || d == DType::kInt32 || d == DType::kInt64; };
  return index_ok(p.src, p.src_dtype) && index_ok(p.dst, p.dst_dtype);
}

// ---- the table form (all layers in one launch) -----------------------------------------------------

// The tensor whose blocks hold `block`: the last i with first[i] <= block (every tensor of a table has
// at least one block, so first[] rises strictly).
__device__ __forceinline__ int table_tensor_of_block(const int64_t* first, int num_tensors, int64_t block) {
  int lo = 0, hi = num_tensors - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (__ldg(first + mid) <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// granule_of on the device: the lowest set bit of base | stride | size, at most 16.
__device__ __forceinline__ int device_granule(const SlotTensor& t) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(t.base) | static_cast<uint64_t>(t.slot_stride) |
                        static_cast<uint64_t>(t.bytes_per_slot);
  const uint64_t low = bits & (~bits + 1);
  return low >= 16 ? 16 : static_cast<int>(low);
}

// The block's tensor record and byte offset; traps when the table is not the one of the call's tensors.
__device__ __forceinline__ SlotTensor table_block(const SlotTableParams& p, const int64_t* first, int64_t chunk,
                                                  bool fill, int64_t& offset) {
  if (static_cast<uint64_t>(__ldg(p.table)) != p.geometry_fingerprint ||
      (fill && static_cast<uint64_t>(__ldg(p.table + 1)) != p.fill_fingerprint)) {
    __trap();
  }
  const int64_t block = blockIdx.x;
  const int ti = table_tensor_of_block(first, p.num_tensors, block);
  const SlotTensor* records = reinterpret_cast<const SlotTensor*>(p.table + kSlotTableHeader);
  offset = (block - __ldg(first + ti)) * chunk;
  return records[ti];
}

__global__ void __launch_bounds__(kThreads)
    copy_slots_table_kernel(const SlotTableParams p, const int64_t* first, int64_t chunk) {
  extern __shared__ uint4 stage_vec[];
  unsigned char* stage = reinterpret_cast<unsigned char*>(stage_vec);
  int64_t offset;
  const SlotTensor t = table_block(p, first, chunk, false, offset);
  const int64_t len = t.bytes_per_slot - offset < chunk ? t.bytes_per_slot - offset : chunk;
  const int g = device_granule(t);
  copy_range(p, t, offset, len, g, stage, chunk);
}

__global__ void __launch_bounds__(kThreads) fill_slots_table_kernel(const SlotTableParams p, const int64_t* first) {
  int64_t offset;
  const SlotTensor t = table_block(p, first, kFillChunk, true, offset);
  const int64_t len = t.bytes_per_slot - offset < kFillChunk ? t.bytes_per_slot - offset : kFillChunk;
  const int g = device_granule(t);
  fill_range(p, t, offset, len, g);
}

// FNV-1a over 64-bit words.
struct Fingerprint {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t w) {
    for (int i = 0; i < 8; ++i) {
      h ^= (w >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
};

int chunk_index(int64_t chunk) {
  int k = 0;
  while ((int64_t{16} << k) < chunk) ++k;
  return k;
}

// The blocks of `tensors` at `chunk` bytes per block, or -1 past INT_MAX.
int64_t table_blocks(const SlotTensor* tensors, int64_t num_tensors, int64_t chunk) {
  int64_t blocks = 0;
  for (int64_t i = 0; i < num_tensors; ++i) blocks += (tensors[i].bytes_per_slot + chunk - 1) / chunk;
  return blocks <= INT_MAX ? blocks : -1;
}

bool table_common_ok(const SlotTableParams& p) {
  if (p.table == nullptr || p.num_tensors < 1 || p.num_slots < 0 || p.num_entries < 0) return false;
  auto index_ok = [](const void* list, DType d) { return list == nullptr || d == DType::kInt32 || d == DType::kInt64; };
  return index_ok(p.src, p.src_dtype) && index_ok(p.dst, p.dst_dtype);
}

// ---- load ------------------------------------------------------------------------------------------

constexpr int kLoadElemsPerThread = kChunk;  // 8
constexpr int kLoadElemsPerBlock = kThreads * kLoadElemsPerThread;

// torch's fp32 -> fp16 conversion: round-to-nearest-even, overflow to inf (no saturation, unlike the
// read copy's rule).
__device__ __forceinline__ void store_converted(__half* p, const float (&v)[kChunk], int n) {
  if (n == kChunk && is_aligned<16>(p)) {
    uint4 raw;
    __half* h = reinterpret_cast<__half*>(&raw);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) h[i] = __float2half_rn(v[i]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
    for (int i = 0; i < n; ++i) p[i] = __float2half_rn(v[i]);
  }
}
__device__ __forceinline__ void store_converted(__nv_bfloat16* p, const float (&v)[kChunk], int n) {
  if (n == kChunk) {
    store_chunk(p, 0, kChunk, v);  // round-to-nearest-even, 16-byte store when aligned
  } else {
    for (int i = 0; i < n; ++i) p[i] = __float2bfloat16_rn(v[i]);
  }
}

template <DType kIn, DType kOut>
__global__ void __launch_bounds__(kThreads) load_states_kernel(const LoadStatesParams p) {
  using In = typename Storage<kIn>::type;
  using Out = typename Storage<kOut>::type;
  const int64_t e0 = static_cast<int64_t>(blockIdx.x) * kLoadElemsPerBlock + threadIdx.x * kLoadElemsPerThread;
  for (int64_t row = blockIdx.y; row < p.batch; row += gridDim.y) {
    const int64_t slot = p.slots == nullptr ? row : load_index(p.slots, p.slots_dtype, row, p.slots_stride);
    if (slot == p.pad_slot_id || slot < 0 || slot >= p.num_slots) continue;
    if (blockIdx.x == 0 && threadIdx.x == 0) p.num_committed[slot * p.nc_stride] = 0;
    if (e0 >= p.elems_per_slot) continue;
    const int n = p.elems_per_slot - e0 < kChunk ? static_cast<int>(p.elems_per_slot - e0) : kChunk;
    const In* src = static_cast<const In*>(p.states) + row * p.states_row_stride + e0;
    Out* dst = static_cast<Out*>(p.checkpoint) + slot * p.ck_slot_stride + e0;
    if constexpr (kIn == kOut) {
      // Same dtype: the bytes, untouched (NaN payloads included), as torch's copy.
      constexpr int kBytes = kChunk * sizeof(In);
      if (n == kChunk && is_aligned<16>(src) && is_aligned<16>(dst)) {
#pragma unroll
        for (int i = 0; i < kBytes / 16; ++i) reinterpret_cast<uint4*>(dst)[i] = __ldg(reinterpret_cast<const uint4*>(src) + i);
      } else {
        for (int i = 0; i < n; ++i) dst[i] = src[i];
      }
    } else {
      float v[kChunk];
      load_chunk(src, 0, n, v);
      store_converted(dst, v, n);
    }
  }
}

template <DType kIn, DType kOut>
cudaError_t launch_load(const LoadStatesParams& p, cudaStream_t stream) {
  const int64_t chunks = (p.elems_per_slot + kLoadElemsPerBlock - 1) / kLoadElemsPerBlock;
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535));
  load_states_kernel<kIn, kOut><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace
}  // namespace slot_ops

cudaError_t launch_copy_slots(const SlotOpsParams& p, cudaStream_t stream) {
  using namespace slot_ops;
  if (!common_ok(p) || p.src == nullptr || p.dst == nullptr || p.num_entries > kCopySlotsMaxPairs) {
    return cudaErrorInvalidValue;
  }
  if (p.num_entries == 0) return cudaSuccess;
  // The largest power-of-two chunk (16 B .. 4 KB) whose staging for all pairs fits.
  int64_t chunk = 4096;
  while (chunk > 16 && chunk * p.num_entries > kCopySlotsStagingBytes) chunk /= 2;
  Chunks c{};
  if (!plan(p, chunk, c, false)) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(chunk * p.num_entries);
  copy_slots_kernel<<<static_cast<unsigned>(c.first_block[p.num_tensors]), kThreads, smem, stream>>>(p, c);
  return cudaGetLastError();
}

cudaError_t launch_fill_slots(const SlotOpsParams& p, cudaStream_t stream) {
  using namespace slot_ops;
  if (!common_ok(p)) return cudaErrorInvalidValue;
  if (p.num_entries == 0) return cudaSuccess;
  Chunks c{};
  if (!plan(p, kFillChunk, c, true)) return cudaErrorInvalidValue;
  fill_slots_kernel<<<static_cast<unsigned>(c.first_block[p.num_tensors]), kThreads, 0, stream>>>(p, c);
  return cudaGetLastError();
}

int64_t slot_table_len(int64_t num_tensors) {
  return kSlotTableHeader + 4 * num_tensors + kSlotTableChunkSizes * (num_tensors + 1);
}

uint64_t slot_geometry_fingerprint(const SlotTensor* tensors, int64_t num_tensors, int64_t num_slots) {
  slot_ops::Fingerprint f;
  f.add(static_cast<uint64_t>(num_slots));
  f.add(static_cast<uint64_t>(num_tensors));
  for (int64_t i = 0; i < num_tensors; ++i) {
    f.add(reinterpret_cast<uintptr_t>(tensors[i].base));
    f.add(static_cast<uint64_t>(tensors[i].slot_stride));
    f.add(static_cast<uint64_t>(tensors[i].bytes_per_slot));
  }
  return f.h;
}

uint64_t slot_fill_fingerprint(const SlotTensor* tensors, int64_t num_tensors) {
  slot_ops::Fingerprint f;
  for (int64_t i = 0; i < num_tensors; ++i) f.add((uint64_t{tensors[i].fill_slot_period} << 32) | tensors[i].fill);
  return f.h;
}

std::string build_slot_table(const SlotTensor* tensors, int64_t num_tensors, int64_t num_slots, int64_t* out) {
  using namespace slot_ops;
  if (num_tensors < 1 || num_tensors > INT_MAX || num_slots < 0) return "at least one tensor and num_slots >= 0";
  for (int64_t i = 0; i < num_tensors; ++i) {
    const SlotTensor& t = tensors[i];
    const std::string name = "tensor " + std::to_string(i);
    if (t.base == nullptr || t.bytes_per_slot < 1) return name + " owns no bytes";
    const int g = granule_of(t);
    if (t.fill != 0 && g < 4) return name + ": a non-zero fill needs 4-byte aligned slots";
    if (t.fill_slot_period != 0 && (t.bytes_per_slot != 4 || g != 4)) {
      return name + ": a fill_slot_period needs 4-byte slots (an int32 per slot)";
    }
    if (num_slots > 1 && t.slot_stride < t.bytes_per_slot) {
      return name + ": its slots overlap (slot stride < slot size)";
    }
  }
  // No byte may belong to two tensors' slots: sweep the tensors by where their extents start; tensors
  // whose extents overlap (layer views of one pool) are checked slot by slot.
  struct Extent {
    uint64_t begin, end;
    int64_t tensor;
  };
  std::vector<Extent> extents;
  for (int64_t i = 0; i < num_tensors; ++i) {
    const uint64_t begin = reinterpret_cast<uintptr_t>(tensors[i].base);
    const int64_t span = num_slots == 0 ? 0 : (num_slots - 1) * tensors[i].slot_stride + tensors[i].bytes_per_slot;
    extents.push_back({begin, begin + static_cast<uint64_t>(span), i});
  }
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  for (size_t first = 0; first < extents.size();) {
    size_t last = first + 1;
    uint64_t end = extents[first].end;
    while (last < extents.size() && extents[last].begin < end) end = std::max(end, extents[last++].end);
    if (last - first > 1) {
      std::vector<Extent> ranges;
      for (size_t e = first; e < last; ++e) {
        const SlotTensor& t = tensors[extents[e].tensor];
        for (int64_t s = 0; s < num_slots; ++s) {
          const uint64_t b = reinterpret_cast<uintptr_t>(t.base) + static_cast<uint64_t>(s * t.slot_stride);
          ranges.push_back({b, b + static_cast<uint64_t>(t.bytes_per_slot), extents[e].tensor});
        }
      }
      std::sort(ranges.begin(), ranges.end(), [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
      for (size_t r = 1; r < ranges.size(); ++r) {
        if (ranges[r].begin < ranges[r - 1].end) {
          return "tensors " + std::to_string(std::min(ranges[r - 1].tensor, ranges[r].tensor)) + " and " +
                 std::to_string(std::max(ranges[r - 1].tensor, ranges[r].tensor)) + " share slot bytes";
        }
      }
    }
    first = last;
  }
  for (int k = 0; k < kSlotTableChunkSizes; ++k) {
    if (table_blocks(tensors, num_tensors, int64_t{16} << k) < 0) return "more than 2^31 - 1 blocks";
  }
  out[0] = static_cast<int64_t>(slot_geometry_fingerprint(tensors, num_tensors, num_slots));
  out[1] = static_cast<int64_t>(slot_fill_fingerprint(tensors, num_tensors));
  out[2] = num_tensors;
  out[3] = num_slots;
  static_assert(sizeof(SlotTensor) == 4 * sizeof(int64_t), "a table record is 4 words");
  std::memcpy(out + kSlotTableHeader, tensors, static_cast<size_t>(num_tensors) * sizeof(SlotTensor));
  int64_t* first = out + kSlotTableHeader + 4 * num_tensors;
  for (int k = 0; k < kSlotTableChunkSizes; ++k, first += num_tensors + 1) {
    const int64_t chunk = int64_t{16} << k;
    first[0] = 0;
    for (int64_t i = 0; i < num_tensors; ++i) first[i + 1] = first[i] + (tensors[i].bytes_per_slot + chunk - 1) / chunk;
  }
  return "";
}

// The table launches size their grid from the call's records, which the fingerprints tie to the table.
cudaError_t launch_copy_slots_table(const SlotTableParams& p, const SlotTensor* tensors, cudaStream_t stream) {
  using namespace slot_ops;
  if (!table_common_ok(p) || p.src == nullptr || p.dst == nullptr || p.num_entries > kCopySlotsMaxPairs) {
    return cudaErrorInvalidValue;
  }
  if (p.num_entries == 0) return cudaSuccess;
  int64_t chunk = 4096;
  while (chunk > 16 && chunk * p.num_entries > kCopySlotsStagingBytes) chunk /= 2;
  const int64_t blocks = table_blocks(tensors, p.num_tensors, chunk);
  if (blocks < 0) return cudaErrorInvalidValue;
  const int64_t* first = p.table + kSlotTableHeader + 4 * int64_t{p.num_tensors} +
                         chunk_index(chunk) * (int64_t{p.num_tensors} + 1);
  const size_t smem = static_cast<size_t>(chunk * p.num_entries);
  copy_slots_table_kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(p, first, chunk);
  return cudaGetLastError();
}

cudaError_t launch_fill_slots_table(const SlotTableParams& p, const SlotTensor* tensors, cudaStream_t stream) {
  using namespace slot_ops;
  if (!table_common_ok(p)) return cudaErrorInvalidValue;
  if (p.num_entries == 0) return cudaSuccess;
  const int64_t blocks = table_blocks(tensors, p.num_tensors, kFillChunk);
  if (blocks < 0) return cudaErrorInvalidValue;
  const int64_t* first = p.table + kSlotTableHeader + 4 * int64_t{p.num_tensors} +
                         chunk_index(kFillChunk) * (int64_t{p.num_tensors} + 1);
  fill_slots_table_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, first);
  return cudaGetLastError();
}

cudaError_t launch_load_states(const LoadStatesParams& p, cudaStream_t stream) {
  using namespace slot_ops;
  if (p.elems_per_slot < 1 || p.batch < 0 || p.num_slots < 0 || p.num_committed == nullptr) return cudaErrorInvalidValue;
  if (p.slots != nullptr && p.slots_dtype != DType::kInt32 && p.slots_dtype != DType::kInt64) return cudaErrorInvalidValue;
  if ((p.elems_per_slot + kLoadElemsPerBlock - 1) / kLoadElemsPerBlock > INT_MAX) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  // States in fp32 or in the checkpoint's dtype.
  return REPLAYSSM_DTYPE_SWITCH(p.checkpoint_dtype, "checkpoint dtype", REPLAYSSM_CACHE_CHECKPOINT_DTYPES,
                                [&](auto ckpt) {
    constexpr DType kCkpt = decltype(ckpt)::value;
    if (p.states_dtype == DType::kFloat32) return launch_load<DType::kFloat32, kCkpt>(p, stream);
    if (p.states_dtype == kCkpt) return launch_load<kCkpt, kCkpt>(p, stream);
    return unsupported(std::string("states dtype ") + dtype_name(p.states_dtype) + " for a " + dtype_name(kCkpt) +
                           " checkpoint",
                       "float32 or the checkpoint's dtype");
  });
}

}  // namespace replayssm
