// torch.ops.replayssm.load / reset / copy_slots: the cache slot ops of every family, on the device.
// Validate, describe each cache tensor as per-slot byte ranges, launch on the current stream (kernels:
// kernels/slot_ops.cuh; load also regenerates read copies with the make_read_copy kernel). No
// allocation and no host synchronisation (pad ids and out-of-range ids are skipped on the device), so
// all three are safe under CUDA-graph capture.
//
//   op          tensors (slot-major, any slot stride, contiguous inside a slot)
//   load        checkpoint (S, H, P, N) fp32/bf16/fp16 <- states (batch, H, P, N) fp32 or checkpoint dtype;
//               num_committed (S,) int32 <- 0; read_copy (+ read_scale) regenerated for the named slots
//   reset       checkpoint, read_copy, buffers <- 0; read_scale <- 1; num_committed <- 0
//   stagger_cursors  buffers <- 0 (neutral entries: dt = 0, resp. g = beta = 0); num_committed <- slot % period,
//               so slots started together fold at different steps (staggered flush)
//   copy_slots  every tensor of cache_tensors: slot src_slots[i] -> slot dst_slots[i], gather semantics
//
// The model-level forms take the tensors of all layers at once, described once in a device table
// (slot_table, called at construction: it validates, builds the table on the host and copies it to the
// device once). Each call re-checks its tensors on the host, as the per-layer ops do, and passes their
// fingerprints, which the kernel compares with the table's:
//   fill_slots_table  every tensor of cache_tensors <- fill_values[i] (0, or a float32 tensor's value),
//                     or slot % fill_periods[i] for an int32 cursor tensor: reset + stagger_cursors of
//                     every layer in one launch
//   copy_slots_table  copy_slots of every tensor of every layer in one launch
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "api/checks.h"
#include "api/ops.h"
#include "api/tensor_args.h"
#include "cache/read_copy.cuh"
#include "cache/slot_ops.cuh"
#include "cache/variants.h"

namespace replayssm {
namespace {

using checks::shape_str;

// True when dims 1.. of `t` are laid out as in a contiguous tensor (size-1 dims excepted), i.e. one
// slot (or one row) is a single contiguous byte range.
bool contiguous_inside_slot(const at::Tensor& t) {
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

void check_inside_slot(const char* op, const std::string& name, const at::Tensor& t, const char* what) {
  TORCH_CHECK(contiguous_inside_slot(t), checks::cat(op, ": ", name, " must be contiguous inside a ", what,
                                                      " (dims 1.. with the strides of a contiguous tensor; the ",
                                                      what, " stride may be anything), got strides ",
                                                      shape_str(t.strides()), " for shape ", shape_str(t.sizes())));
}

// A cache tensor of `num_slots` slots on `ref`'s device, as a per-slot byte range.
SlotTensor slot_tensor(const char* op, const std::string& name, const at::Tensor& t, const at::Tensor& ref,
                       int64_t num_slots, uint32_t fill = 0) {
  checks::cuda(op, name.c_str(), t);
  checks::same_device(op, name.c_str(), t, "the first cache tensor", ref);
  TORCH_CHECK(t.dim() >= 1 && t.size(0) == num_slots,
              checks::cat(op, ": ", name, " must have num_slots = ", num_slots, " slots in dim 0, got shape ",
                          shape_str(t.sizes())));
  check_inside_slot(op, name, t, "slot");
  checks::writable(op, name.c_str(), t);
  const int64_t elem = static_cast<int64_t>(t.element_size());
  return SlotTensor{t.data_ptr(), t.stride(0) * elem, (num_slots == 0 ? 0 : t.numel() / num_slots) * elem, fill};
}

void check_index_list(const char* op, const char* name, const at::Tensor& t, const at::Tensor& ref) {
  checks::cuda(op, name, t);
  checks::same_device(op, name, t, "the cache", ref);
  checks::dims(op, name, t, 1, "(num_entries,)");
  checks::dtype_in(op, name, t, {at::kInt, at::kLong});
}

// fill: the named slots as the destination list (every slot when slots is None). SlotOpsParams and
// SlotTableParams name these fields alike.
template <class Params>
void bind_fill_slots(const char* op, Params& p, const std::optional<at::Tensor>& slots, int64_t num_slots,
                     const at::Tensor& ref) {
  if (slots) {
    check_index_list(op, "slots", *slots, ref);
    p.dst = slots->data_ptr();
    p.dst_dtype = kernel_dtype(slots->scalar_type());
    p.dst_stride = slots->stride(0);
    p.num_entries = slots->size(0);
  } else {
    p.num_entries = num_slots;
  }
}

// copy: src_slots[i] -> dst_slots[i], both lists checked (at most kCopySlotsMaxPairs pairs: the one-launch
// gather stages every source in shared memory).
void check_copy_pairs(const char* op, const at::Tensor& src_slots, const at::Tensor& dst_slots, const at::Tensor& ref) {
  check_index_list(op, "src_slots", src_slots, ref);
  check_index_list(op, "dst_slots", dst_slots, ref);
  checks::same_shape(op, "dst_slots", dst_slots, "src_slots", src_slots.sizes());
  TORCH_CHECK(src_slots.size(0) <= kCopySlotsMaxPairs,
              checks::cat(op, ": src_slots must hold at most ", kCopySlotsMaxPairs,
                          " pairs (the one-launch gather stages every source in shared memory), got ",
                          src_slots.size(0)));
}

template <class Params>
void bind_copy_pairs(Params& p, const at::Tensor& src_slots, const at::Tensor& dst_slots) {
  p.src = src_slots.data_ptr();
  p.src_dtype = kernel_dtype(src_slots.scalar_type());
  p.src_stride = src_slots.stride(0);
  p.dst = dst_slots.data_ptr();
  p.dst_dtype = kernel_dtype(dst_slots.scalar_type());
  p.dst_stride = dst_slots.stride(0);
  p.num_entries = src_slots.size(0);
}

void add_tensor(const char* op, SlotOpsParams& p, const SlotTensor& t) {
  if (t.bytes_per_slot == 0) return;  // an empty tensor owns nothing
  TORCH_CHECK(p.num_tensors < kSlotOpsMaxTensors,
              checks::cat(op, ": at most ", kSlotOpsMaxTensors, " cache tensors per call, got more"));
  p.tensors[p.num_tensors++] = t;
}

uint32_t float_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

// fill_slots over the tensors in p, for the named slots (every slot when slots is None), on ref's device.
void launch_fill(const char* op, SlotOpsParams& p, const std::optional<at::Tensor>& slots, int64_t pad_slot_id,
                 const at::Tensor& ref) {
  bind_fill_slots(op, p, slots, p.num_slots, ref);
  p.pad_slot_id = pad_slot_id;
  const c10::cuda::CUDAGuard device_guard(ref.device());
  checks::launched(op, launch_fill_slots(p, stream_of(ref)));
}

}  // namespace

void copy_slots(at::TensorList cache_tensors, const at::Tensor& src_slots, const at::Tensor& dst_slots,
                int64_t pad_slot_id) {
  constexpr const char* op = "copy_slots";
  TORCH_CHECK(!cache_tensors.empty(), checks::cat(op, ": cache_tensors must hold at least one tensor, got none"));
  TORCH_CHECK(static_cast<int64_t>(cache_tensors.size()) <= kSlotOpsMaxTensors,
              checks::cat(op, ": cache_tensors must hold at most ", kSlotOpsMaxTensors, " tensors, got ",
                          static_cast<int64_t>(cache_tensors.size())));
  const at::Tensor& ref = cache_tensors[0];
  checks::cuda(op, "cache_tensors[0]", ref);
  TORCH_CHECK(ref.dim() >= 1, checks::cat(op, ": cache_tensors[0] must have a slot dim 0, got a 0-D tensor"));
  SlotOpsParams p{};
  p.num_slots = ref.size(0);
  for (size_t i = 0; i < cache_tensors.size(); ++i) {
    const std::string name = "cache_tensors[" + std::to_string(i) + "]";
    add_tensor(op, p, slot_tensor(op, name, cache_tensors[i], ref, p.num_slots));
  }
  check_copy_pairs(op, src_slots, dst_slots, ref);
  bind_copy_pairs(p, src_slots, dst_slots);
  p.pad_slot_id = pad_slot_id;
  if (p.num_tensors == 0) return;
  const c10::cuda::CUDAGuard device_guard(ref.device());
  checks::launched(op, launch_copy_slots(p, stream_of(ref)));
}

namespace {

// The records of the tensors of a model-level call (empty tensors left out), each checked as the
// per-layer ops check theirs; fills from fill_values / fill_periods when given.
std::vector<SlotTensor> table_records(const char* op, at::TensorList cache_tensors, int64_t& num_slots,
                                      const at::ArrayRef<double>* fill_values = nullptr,
                                      const at::IntArrayRef* fill_periods = nullptr) {
  TORCH_CHECK(!cache_tensors.empty(), checks::cat(op, ": cache_tensors must hold at least one tensor, got none"));
  const at::Tensor& ref = cache_tensors[0];
  checks::cuda(op, "cache_tensors[0]", ref);
  TORCH_CHECK(ref.dim() >= 1, checks::cat(op, ": cache_tensors[0] must have a slot dim 0, got a 0-D tensor"));
  num_slots = ref.size(0);
  const int64_t n = static_cast<int64_t>(cache_tensors.size());
  if (fill_values != nullptr) {
    TORCH_CHECK(static_cast<int64_t>(fill_values->size()) == n,
                checks::cat(op, ": fill_values must hold one value per cache tensor (", n, "), got ",
                            static_cast<int64_t>(fill_values->size())));
    TORCH_CHECK(static_cast<int64_t>(fill_periods->size()) == n,
                checks::cat(op, ": fill_periods must hold one period per cache tensor (", n, "), got ",
                            static_cast<int64_t>(fill_periods->size())));
  }
  std::vector<SlotTensor> records;
  records.reserve(cache_tensors.size());
  for (int64_t i = 0; i < n; ++i) {
    const std::string name = "cache_tensors[" + std::to_string(i) + "]";
    const at::Tensor& t = cache_tensors[i];
    SlotTensor record = slot_tensor(op, name, t, ref, num_slots);
    if (fill_values != nullptr) {
      const double value = (*fill_values)[i];
      const int64_t period = (*fill_periods)[i];
      TORCH_CHECK(value == 0.0 || t.scalar_type() == at::kFloat,
                  checks::cat(op, ": fill_values[", i, "] must be 0 for a ", checks::dtype_str(t.scalar_type()), " ",
                              name, " (a non-zero fill needs a float32 tensor), got ", c10::str(value)));
      TORCH_CHECK(period >= 0 && period <= INT32_MAX,
                  checks::cat(op, ": fill_periods[", i, "] must be in [0, 2^31 - 1], got ", period));
      TORCH_CHECK(period == 0 || (t.scalar_type() == at::kInt && t.dim() == 1),
                  checks::cat(op, ": fill_periods[", i, "] = ", period,
                              " needs an int32 (num_slots,) cursor tensor, got ", name, " of dtype ",
                              checks::dtype_str(t.scalar_type()), " and shape ", shape_str(t.sizes())));
      record.fill = float_bits(static_cast<float>(value));
      record.fill_slot_period = static_cast<uint32_t>(period);
    }
    if (record.bytes_per_slot > 0) records.push_back(record);  // an empty tensor owns nothing
  }
  return records;
}

// The device table of a call's tensors: the one slot_table built for them (the kernel checks the
// fingerprints; the host checks what it can without reading it).
void check_table(const char* op, const at::Tensor& table, const at::Tensor& ref, int64_t num_tensors) {
  checks::cuda(op, "slot_table", table);
  checks::same_device(op, "slot_table", table, "cache_tensors[0]", ref);
  checks::dtype_in(op, "slot_table", table, {at::kLong});
  const int64_t len = slot_table_len(num_tensors);
  TORCH_CHECK(table.dim() == 1 && table.size(0) == len && table.is_contiguous(),
              checks::cat(op, ": slot_table must be the contiguous (", len, ",) int64 table that replayssm_cuda._C.",
                          "slot_table built for these ", num_tensors, " non-empty cache tensors, got shape ",
                          shape_str(table.sizes()), " and strides ", shape_str(table.strides())));
}

SlotTableParams table_params(const at::Tensor& table, const std::vector<SlotTensor>& records, int64_t num_slots,
                             int64_t pad_slot_id) {
  SlotTableParams p{};
  p.table = table.data_ptr<int64_t>();
  p.num_tensors = static_cast<int32_t>(records.size());
  p.num_slots = num_slots;
  p.geometry_fingerprint = slot_geometry_fingerprint(records.data(), p.num_tensors, num_slots);
  p.fill_fingerprint = slot_fill_fingerprint(records.data(), p.num_tensors);
  p.pad_slot_id = pad_slot_id;
  return p;
}

}  // namespace

at::Tensor slot_table(at::TensorList cache_tensors, at::ArrayRef<double> fill_values, at::IntArrayRef fill_periods) {
  constexpr const char* op = "slot_table";
  int64_t num_slots = 0;
  const std::vector<SlotTensor> records = table_records(op, cache_tensors, num_slots, &fill_values, &fill_periods);
  TORCH_CHECK(!records.empty(), checks::cat(op, ": cache_tensors must hold a non-empty tensor, got only empty ones"));
  TORCH_CHECK(static_cast<int64_t>(records.size()) <= INT32_MAX,
              checks::cat(op, ": at most 2^31 - 1 cache tensors, got ", static_cast<int64_t>(records.size())));
  at::Tensor host = at::empty({slot_table_len(static_cast<int64_t>(records.size()))}, at::dtype(at::kLong));
  const std::string why = build_slot_table(records.data(), static_cast<int64_t>(records.size()), num_slots,
                                           host.data_ptr<int64_t>());
  // Records count only non-empty tensors; the message names cache_tensors by record index otherwise.
  TORCH_CHECK(why.empty(), checks::cat(op, ": cache_tensors must own disjoint slot bytes with fills the kernel ",
                                       "takes; of the non-empty ones, ", why));
  return host.to(cache_tensors[0].device());
}

void fill_slots_table(at::TensorList cache_tensors, const at::Tensor& slot_table, at::ArrayRef<double> fill_values,
                      at::IntArrayRef fill_periods, const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "fill_slots_table";
  int64_t num_slots = 0;
  const std::vector<SlotTensor> records = table_records(op, cache_tensors, num_slots, &fill_values, &fill_periods);
  const at::Tensor& ref = cache_tensors[0];
  if (records.empty()) return;
  check_table(op, slot_table, ref, static_cast<int64_t>(records.size()));
  SlotTableParams p = table_params(slot_table, records, num_slots, pad_slot_id);
  bind_fill_slots(op, p, slots, num_slots, ref);
  const c10::cuda::CUDAGuard device_guard(ref.device());
  checks::launched(op, launch_fill_slots_table(p, records.data(), stream_of(ref)));
}

void copy_slots_table(at::TensorList cache_tensors, const at::Tensor& slot_table, const at::Tensor& src_slots,
                      const at::Tensor& dst_slots, int64_t pad_slot_id) {
  constexpr const char* op = "copy_slots_table";
  int64_t num_slots = 0;
  const std::vector<SlotTensor> records = table_records(op, cache_tensors, num_slots);
  const at::Tensor& ref = cache_tensors[0];
  check_copy_pairs(op, src_slots, dst_slots, ref);
  if (records.empty()) return;
  check_table(op, slot_table, ref, static_cast<int64_t>(records.size()));
  SlotTableParams p = table_params(slot_table, records, num_slots, pad_slot_id);
  bind_copy_pairs(p, src_slots, dst_slots);
  const c10::cuda::CUDAGuard device_guard(ref.device());
  checks::launched(op, launch_copy_slots_table(p, records.data(), stream_of(ref)));
}

void reset(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
           const std::optional<at::Tensor>& read_scale, at::TensorList buffers, const at::Tensor& num_committed,
           const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "reset";
  checks::cuda(op, "checkpoint", checkpoint);
  checks::dims(op, "checkpoint", checkpoint, 4, "(num_slots, heads, rows, cols)");
  SlotOpsParams p{};
  p.num_slots = checkpoint.size(0);
  add_tensor(op, p, slot_tensor(op, "checkpoint", checkpoint, checkpoint, p.num_slots));
  if (read_copy) add_tensor(op, p, slot_tensor(op, "read_copy", *read_copy, checkpoint, p.num_slots));
  if (read_scale) {
    checks::dtype_in(op, "read_scale", *read_scale, {at::kFloat});
    add_tensor(op, p, slot_tensor(op, "read_scale", *read_scale, checkpoint, p.num_slots, float_bits(1.0f)));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    const std::string name = "buffers[" + std::to_string(i) + "]";
    add_tensor(op, p, slot_tensor(op, name, buffers[i], checkpoint, p.num_slots));
  }
  checks::dims(op, "num_committed", num_committed, 1, "(num_slots,)");
  checks::dtype_in(op, "num_committed", num_committed, {at::kInt});
  add_tensor(op, p, slot_tensor(op, "num_committed", num_committed, checkpoint, p.num_slots));
  launch_fill(op, p, slots, pad_slot_id, checkpoint);
}

void stagger_cursors(at::TensorList buffers, const at::Tensor& num_committed, const std::optional<at::Tensor>& slots,
                     int64_t pad_slot_id, int64_t period) {
  constexpr const char* op = "stagger_cursors";
  checks::cuda(op, "num_committed", num_committed);
  checks::dims(op, "num_committed", num_committed, 1, "(num_slots,)");
  checks::dtype_in(op, "num_committed", num_committed, {at::kInt});
  TORCH_CHECK(period >= 1 && period <= INT32_MAX,
              checks::cat(op, ": period must be in [1, 2^31 - 1] (buffer_len - max_draft_tokens + 1), got ", period));
  SlotOpsParams p{};
  p.num_slots = num_committed.size(0);
  for (size_t i = 0; i < buffers.size(); ++i) {
    const std::string name = "buffers[" + std::to_string(i) + "]";
    const at::Tensor& b = buffers[i];
    // A buffer is (num_slots, heads, buffer_len, ...): the neutral entries a slot starts with (slot %
    // period of them) must fit in it.
    TORCH_CHECK(b.dim() >= 3, checks::cat(op, ": ", name, " must be (num_slots, heads, buffer_len, ...), at least 3-D, ",
                                          "got shape ", shape_str(b.sizes())));
    TORCH_CHECK(period <= b.size(2), checks::cat(op, ": period must be <= the buffer length (", name, ".size(2) = ",
                                                 b.size(2), "), got ", period));
    add_tensor(op, p, slot_tensor(op, name, b, num_committed, p.num_slots));
  }
  SlotTensor cursors = slot_tensor(op, "num_committed", num_committed, num_committed, p.num_slots);
  cursors.fill_slot_period = static_cast<uint32_t>(period);
  add_tensor(op, p, cursors);
  launch_fill(op, p, slots, pad_slot_id, num_committed);
}

void load(const at::Tensor& checkpoint, const std::optional<at::Tensor>& read_copy,
          const std::optional<at::Tensor>& read_scale, const at::Tensor& num_committed, const at::Tensor& states,
          const std::optional<at::Tensor>& slots, int64_t pad_slot_id) {
  constexpr const char* op = "load";
  checks::cuda(op, "checkpoint", checkpoint);
  checks::dims(op, "checkpoint", checkpoint, 4, "(num_slots, heads, rows, cols)");
  checks::dtype_in(op, "checkpoint", checkpoint, torch_dtypes(cache::checkpoint_dtypes()));
  const int64_t S = checkpoint.size(0);
  slot_tensor(op, "checkpoint", checkpoint, checkpoint, S);  // device, slot contiguity, no self-overlap

  checks::cuda(op, "states", states);
  checks::same_device(op, "states", states, "checkpoint", checkpoint);
  TORCH_CHECK(states.dim() == 4 && states.size(1) == checkpoint.size(1) && states.size(2) == checkpoint.size(2) &&
                  states.size(3) == checkpoint.size(3),
              checks::cat(op, ": states must have shape (batch, ", checkpoint.size(1), ", ", checkpoint.size(2), ", ",
                          checkpoint.size(3), ") like the checkpoint's slots, got ", shape_str(states.sizes())));
  if (checkpoint.scalar_type() == at::kFloat) {
    checks::dtype_in(op, "states", states, {at::kFloat});
  } else {
    checks::dtype_in(op, "states", states, {at::kFloat, checkpoint.scalar_type()});
  }
  check_inside_slot(op, "states", states, "row");
  checks::no_overlap(op, "checkpoint", checkpoint, "states", states);
  const int64_t batch = states.size(0);

  checks::cuda(op, "num_committed", num_committed);
  checks::same_device(op, "num_committed", num_committed, "checkpoint", checkpoint);
  checks::shape_is(op, "num_committed", num_committed, "(num_slots,)", {S});
  checks::dtype_in(op, "num_committed", num_committed, {at::kInt});

  if (slots) {
    check_index_list(op, "slots", *slots, checkpoint);
    TORCH_CHECK(slots->size(0) == batch, checks::cat(op, ": slots must have shape (", batch, ",) (one slot per row of states), got ", shape_str(slots->sizes())));
  } else {
    TORCH_CHECK(batch <= S, checks::cat(op, ": without slots, row r uses slot r, so batch (states.size(0) = ", batch, ") must be <= num_slots (", S, ")"));
  }

  // The read copy is validated before anything is written, so a bad one leaves the cache untouched.
  ReadCopyParams rc{};
  if (read_copy) {
    const at::Tensor& r = *read_copy;
    checks::cuda(op, "read_copy", r);
    checks::same_device(op, "read_copy", r, "checkpoint", checkpoint);
    checks::same_shape(op, "read_copy", r, "checkpoint", checkpoint.sizes());
    checks::dtype_in(op, "read_copy", r, torch_dtypes(cache::read_copy_dtypes()));
    checks::last_dim_contiguous(op, "read_copy", r);
    checks::writable(op, "read_copy", r);
    checks::no_overlap(op, "read_copy", r, "checkpoint", checkpoint);
    checks::size_in(op, "checkpoint", checkpoint, 3, "last dim (cols) with a read copy", 1, kReadCopyMaxCols);
    const bool fp8 = r.scalar_type() == at::kFloat8_e4m3fn;
    const std::vector<int64_t> scale_shape{S, checkpoint.size(1), checkpoint.size(2)};
    if (fp8) {
      checks::given(op, "read_scale", read_scale.has_value(), "read_copy is float8_e4m3fn",
                    "a float32 tensor of shape " + shape_str(scale_shape));
      checks::cuda(op, "read_scale", *read_scale);
      checks::same_device(op, "read_scale", *read_scale, "checkpoint", checkpoint);
      checks::shape_is(op, "read_scale", *read_scale, "(num_slots, heads, rows)", scale_shape);
      checks::dtype_in(op, "read_scale", *read_scale, {at::kFloat});
      checks::writable(op, "read_scale", *read_scale);
    } else {
      checks::none(op, "read_scale", read_scale, "read_copy is " + checks::dtype_str(r.scalar_type()),
                   "scales exist only for float8_e4m3fn read copies");
    }
    rc.checkpoint = checkpoint.data_ptr();
    rc.read_copy = r.data_ptr();
    rc.read_scale = fp8 ? read_scale->data_ptr<float>() : nullptr;
    rc.slots = slots ? slots->data_ptr() : nullptr;  // nullptr: entry i is slot i, i < batch
    rc.checkpoint_dtype = kernel_dtype(checkpoint.scalar_type());
    rc.read_copy_dtype = kernel_dtype(r.scalar_type());
    rc.slots_dtype = slots ? kernel_dtype(slots->scalar_type()) : DType::kInt64;
    rc.num_slots = S;
    rc.heads = checkpoint.size(1);
    rc.rows = checkpoint.size(2);
    rc.cols = checkpoint.size(3);
    rc.num_entries = batch;
    rc.pad_slot_id = pad_slot_id;
    rc.checkpoint_slot_stride = checkpoint.stride(0);
    rc.checkpoint_head_stride = checkpoint.stride(1);
    rc.checkpoint_row_stride = checkpoint.stride(2);
    rc.read_copy_slot_stride = r.stride(0);
    rc.read_copy_head_stride = r.stride(1);
    rc.read_copy_row_stride = r.stride(2);
    if (fp8) {
      rc.read_scale_slot_stride = read_scale->stride(0);
      rc.read_scale_head_stride = read_scale->stride(1);
      rc.read_scale_row_stride = read_scale->stride(2);
    }
    rc.slots_stride = slots ? slots->stride(0) : 1;
  } else {
    TORCH_CHECK(!read_scale.has_value(), checks::cat(op, ": read_scale must be None when read_copy is None, got a tensor"));
  }

  LoadStatesParams p{};
  p.states = states.data_ptr();
  p.states_dtype = kernel_dtype(states.scalar_type());
  p.states_row_stride = states.stride(0);
  p.checkpoint = checkpoint.data_ptr();
  p.checkpoint_dtype = kernel_dtype(checkpoint.scalar_type());
  p.ck_slot_stride = checkpoint.stride(0);
  p.elems_per_slot = checkpoint.size(1) * checkpoint.size(2) * checkpoint.size(3);
  p.num_committed = num_committed.data_ptr<int32_t>();
  p.nc_stride = num_committed.stride(0);
  p.slots = slots ? slots->data_ptr() : nullptr;
  p.slots_dtype = slots ? kernel_dtype(slots->scalar_type()) : DType::kInt64;
  p.slots_stride = slots ? slots->stride(0) : 1;
  p.pad_slot_id = pad_slot_id;
  p.num_slots = S;
  p.batch = batch;
  if (batch == 0 || p.elems_per_slot == 0) return;

  const c10::cuda::CUDAGuard device_guard(checkpoint.device());
  const cudaStream_t stream = stream_of(checkpoint);
  checks::launched(op, launch_load_states(p, stream));
  if (read_copy) checks::launched(op, launch_make_read_copy(rc, stream));
}

}  // namespace replayssm
