// Conventional Mamba-2 decode (T=1): read the state, update it, write it, output. The kernel moves
// 2 * P * N * sizeof(state) bytes per (row, head) and should run at copy bandwidth.
//
// A persistent grid walks the (row, head) items: CTA c takes items c, c + gridDim.x, ... for its first S
// and, past those, claims the next item from a counter as it becomes ready for one (see item_after). Each CTA
// keeps a ring of S state tiles in shared memory that its producer warp fills by bulk copy (TMA) up to
// S items ahead, so the CTA always has reads in flight while its 8 consumer warps update the current
// tile and store it from registers. A consumer warp hands a stage back as soon as it has read its rows
// (one arrive on the stage's named barrier, which the producer syncs on before it refills the stage),
// before it computes and stores them. The row operands of the next item (x, z, dt, B, C, A, D) are
// loaded one item ahead and decoded when used. (One CTA per (row, head) that loads its tile, computes,
// stores and leaves reads and writes in two bursts per CTA: 82-86% of copy bandwidth at batch 256-512.)
//
// With few (row, head) items (at most half an item per SM) the launch plan splits every item into
// P / kTileP items of one pass of state rows each (kTileP = the rows 256 threads cover at once: 8 at
// N = 128, 16 at N = 64), so that the state's bytes spread over every SM instead of a few SMs streaming
// a whole tile each (launch/mamba2_policy.h, mamba2_update_split). Every state element and output row
// is computed by the same arithmetic either way.
#include "common/bulk_copy.cuh"
#include "common/device_info.h"
#include "common/param_cache.cuh"
#include "common/programmatic_launch.cuh"
#include "diag/cta_timeline.cuh"
#include "families/mamba2/params.h"
#include "families/mamba2/tile.cuh"
#include "families/mamba2/variants.h"
#include "common/stochastic_rounding.cuh"
#include "launch/mamba2_policy.h"
#include "launch/pdl.h"

namespace replayssm {
namespace mamba2 {
namespace {

constexpr int kUpdateThreads = kThreads + 32;  // the consumers (TileShape's 256 threads) + one producer warp
constexpr int kMaxStages = 8;

template <int kP, int kN, DType kState, bool kRound>
struct UpdateTile {
  static constexpr int kRowBytes = kN * dtype_size(kState);
  static constexpr int kBytes = kP * kRowBytes;
  // Two CTAs per SM when two rings of two stages fit in an SM's 228 KB (every tile but fp32 128 x 128).
  // The register cap that follows (96: 18 warps over 4 schedulers) holds every such thread's rows but
  // those of the rounding kernel at 16 rows per thread (P = 128, N = 128), which spilled 156 bytes.
  static constexpr int kMinCtasPerSm = 4 * kBytes <= 220 * 1024 && !(kRound && kP * kN >= 128 * 128) ? 2 : 1;
};

// A thread's 4 state values as one 16-byte (fp32) or 8-byte (bf16 / fp16) store. Vec4::store's plain
// assignment comes out of the compiler as 4 / 2 scalar stores (4x the store instructions, each a
// partial write of 16 sectors). Vec4::store itself is left
// alone: forcing the vector there raised the P = 64, N = 64 step kernels' spills at their 80-register cap.
template <DType T>
__device__ __forceinline__ void store_state4(void* base, int64_t offset, const float (&v)[4]) {
  if constexpr (T == DType::kFloat32) {
    __stwb(reinterpret_cast<float4*>(static_cast<float*>(base) + offset), make_float4(v[0], v[1], v[2], v[3]));
  } else {
    static_assert(T == DType::kBFloat16 || T == DType::kFloat16, "the update's state is fp32, bf16 or fp16");
    uint2 raw;
    if constexpr (T == DType::kBFloat16) {
      __nv_bfloat162* h2 = reinterpret_cast<__nv_bfloat162*>(&raw);
      h2[0] = __floats2bfloat162_rn(v[0], v[1]);
      h2[1] = __floats2bfloat162_rn(v[2], v[3]);
    } else {
      __half* h = reinterpret_cast<__half*>(&raw);
#pragma unroll
      for (int i = 0; i < 4; ++i) h[i] = from_float_fp16(v[i]);
    }
    __stwb(reinterpret_cast<uint2*>(static_cast<uint16_t*>(base) + offset), raw);
  }
}

// The operands of one (row, head) item, loaded one item ahead and kept raw until the item is worked on,
// so no load latency sits in front of the state update. Lane j of a row's lane group loads x and z of
// the row its thread covers in pass j (j < R): one load each instead of R, shuffled out when needed.
template <DType kAct>
struct ItemOperands {
  using Act = typename Storage<kAct>::type;
  using Raw = typename Vec4<kAct>::Raw;
  int64_t slot;   // slots[row] as given (resolved at use)
  uint32_t dt;    // fp32 bits, or a 16-bit activation in the low half
  float A, D, dt_bias;
  Raw B, C;
  Act x, z;

  // row0: the item's first state row (its part of the head's rows).
  template <class Shape>
  __device__ static ItemOperands load(const Mamba2Params& p, int row, int head, int row0, int pass) {
    ItemOperands o;
    o.slot = p.slots == nullptr ? row : load_index(p.slots, p.slots_dtype, row, p.slots_stride);
    const int64_t dt_off = row * p.dt_row_stride + head * p.dt_head_stride;
    o.dt = p.dt_dtype == DType::kFloat32 ? __float_as_uint(__ldg(static_cast<const float*>(p.dt) + dt_off))
                                         : static_cast<uint32_t>(__ldg(static_cast<const uint16_t*>(p.dt) + dt_off));
    o.A = __ldg(p.A + head);
    o.D = p.D != nullptr ? __ldg(p.D + head) : 0.0f;
    o.dt_bias = p.dt_bias != nullptr ? __ldg(p.dt_bias + head) : 0.0f;
    const int group = head / (p.heads / p.groups);
    o.B = Vec4<kAct>::load(p.B, row * p.B_row_stride + group * p.B_group_stride + Shape::col0());
    o.C = Vec4<kAct>::load(p.C, row * p.C_row_stride + group * p.C_group_stride + Shape::col0());
    o.x = o.z = Act{};
    if (pass < Shape::kRowsPerThread) {
      const int pr = row0 + Shape::first_row() + pass * Shape::kRowsPerPass;
      o.x = __ldg(static_cast<const Act*>(p.x) + row * p.x_row_stride + head * p.x_head_stride + pr);
      if (p.z != nullptr) o.z = __ldg(static_cast<const Act*>(p.z) + row * p.z_row_stride + head * p.z_head_stride + pr);
    }
    return o;
  }

  // dt after bias and softplus: load_dt's arithmetic on the raw value.
  __device__ float decode_dt(const Mamba2Params& p) const {
    float v;
    if (p.dt_dtype == DType::kFloat32) {
      v = __uint_as_float(dt);
    } else if (p.dt_dtype == DType::kBFloat16) {
      v = __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(dt)));
    } else {
      v = __half2float(__ushort_as_half(static_cast<unsigned short>(dt)));
    }
    if (p.dt_bias != nullptr) v += dt_bias;
    return p.dt_softplus ? softplus(v) : v;
  }
};

// Item k of a launch whose (row, head) items are split into kParts parts of kTileP rows: row, head
// and the part's first state row (kParts = 1: k = row * heads + head).
template <int kParts, int kTileP>
struct UpdateItem {
  int row, head, row0;
  __device__ UpdateItem(int64_t k, int heads) {
    if constexpr (kParts == 1) {
      row = static_cast<int>(k / heads);
      head = static_cast<int>(k % heads);
      row0 = 0;
    } else {
      const int64_t per_row = static_cast<int64_t>(heads) * kParts;
      row = static_cast<int>(k / per_row);
      const int in_row = static_cast<int>(k - row * per_row);
      head = in_row / kParts;
      row0 = (in_row % kParts) * kTileP;
    }
  }
};

// kRound: stochastic rounding of a 16-bit state (p.rounding_seed); false compiles without it. kTileP:
// the state rows of one item (kP: whole heads; fewer: the split).
template <int kP, int kN, DType kState, DType kAct, bool kRound, int kTileP>
__global__ void __launch_bounds__(kUpdateThreads, (UpdateTile<kTileP, kN, kState, kRound>::kMinCtasPerSm))
    update_kernel(const __grid_constant__ Mamba2Params p, const Mamba2UpdateLaunch launch) {
  static_assert(!kRound || kState != DType::kFloat32, "stochastic rounding is for 16-bit states");
  static_assert(kP % kTileP == 0, "an item's rows divide the head's");
  constexpr int kParts = kP / kTileP;
  using Item = UpdateItem<kParts, kTileP>;
  const int stages = launch.stages;
  using Shape = TileShape<kTileP, kN>;
  using Tile = UpdateTile<kTileP, kN, kState, kRound>;
  using V = Vec4<kState>;
  using Ops = ItemOperands<kAct>;
  constexpr int R = Shape::kRowsPerThread;
  constexpr int kLanes = Shape::kLanesPerRow;
  constexpr int kStateBytes = dtype_size(kState);
  static_assert(R <= kLanes, "a row's lane group loads the x and z of its R passes, one per lane");
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[kMaxStages];
  // The item whose tile goes into stage s next (-1: none), written by the producer as it issues the
  // copy before it, S - 1 items ahead of its use, and published on id_ready[s]: the consumers load an
  // item's operands one item ahead, before its tile lands.
  __shared__ int64_t item_of[kMaxStages];
  __shared__ uint64_t id_ready[kMaxStages];
  // Stage s is handed back on named barrier 1 + s: the 8 consumer warps arrive, the producer warp syncs.
  auto stage_read = [](int stage) { return 1 + stage; };

  const int64_t items = static_cast<int64_t>(p.batch) * p.heads * kParts;
  const int64_t grid = gridDim.x;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&id_ready[s], 1);
    }
    fence_barrier_init();
  }
  // Launched with PDL (common/programmatic_launch.cuh), the CTA may have started before the kernel ahead
  // of it ended: the barriers above are shared memory only; every global access (the slots, operands,
  // state, counter, the time line) comes after the wait (none without PDL).
  if (launch.warm_params && threadIdx.x >= kUpdateThreads - 32) warm_param_cache(p);
  wait_for_prior_grids(launch.pdl_wait);
  if (tid == 0) {
    if (launch.pdl_trigger) launch_dependent_grids();
    REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineStart);
  }
  __syncthreads();

  if (tid >= kThreads) {  // the producer warp: one lane fills the ring
    if (tid != kThreads) return;
    const unsigned char* state = static_cast<const unsigned char*>(p.checkpoint);
    auto slot_of = [&](int64_t k) {
      const int64_t row = k / (kParts == 1 ? p.heads : static_cast<int64_t>(p.heads) * kParts);
      return p.slots == nullptr ? row : load_index(p.slots, p.slots_dtype, row, p.slots_stride);
    };
    // This CTA's item i + 1 (-1: none), chosen as item i's copy is issued: the first S round-robin
    // (k = blockIdx.x + i * grid), the rest claimed one at a time from p.work_counter where the launch
    // plan claims (items S * grid, S * grid + 1, ... in claim order), else round-robin too. Claimed items
    // go to the CTAs that are ready for one: CTAs stream at different rates (with equal shares, half the
    // SMs idle for the last ~11 us of a batch-64 update; docs/TUNING.md, "claims").
    auto item_after = [&](int i) -> int64_t {
      const int64_t j = i + 1;
      const int64_t k = j < stages || !launch.claims ? blockIdx.x + j * grid
                                                     : stages * grid + atomicAdd(p.work_counter, 1);
      return k < items ? k : -1;
    };
    int64_t k = static_cast<int64_t>(blockIdx.x) < items ? static_cast<int64_t>(blockIdx.x) : -1;
    item_of[0] = k;
    mbarrier_arrive(&id_ready[0]);
    int64_t slot = k >= 0 ? slot_of(k) : 0;
    int i = 0;
    for (; k >= 0; ++i) {
      const int stage = i % stages;
      if (i >= stages) {
        named_barrier_sync(stage_read(stage), kUpdateThreads);  // every consumer warp has read item i - S
        fence_proxy_async();
      }
      if (slot == p.pad_slot_id || slot < 0 || slot >= p.num_slots) {
        mbarrier_arrive(&full[stage]);  // a row that touches nothing: complete the phase with no bytes
      } else {
        const Item item(k, p.heads);
        bulk_copy_tile_to_shared<kTileP, Tile::kRowBytes>(
            ring + stage * Tile::kBytes,
            state + (slot * p.ck_slot_stride + item.head * p.ck_head_stride + item.row0 * p.ck_row_stride) * kStateBytes,
            p.ck_row_stride * kStateBytes, &full[stage]);
      }
      // The next item's id for the consumers (they read item i + 1 - S's from this entry before item
      // i - S's tile, which the barrier above waited for), and its slot, in flight while it waits.
      const int64_t next = item_after(i);
      const int next_stage = (i + 1) % stages;
      item_of[next_stage] = next;
      mbarrier_arrive(&id_ready[next_stage]);
      slot = next >= 0 ? slot_of(next) : 0;
      k = next;
    }
    // The consumers hand back every item's stage, the last S too: sync on those as well, so that every
    // named-barrier phase completes (none is left half-arrived when the CTA exits).
    const int n = i;  // this CTA's items
    for (int j = n > stages ? n - stages : 0; j < n; ++j) named_barrier_sync(stage_read(j % stages), kUpdateThreads);
    REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineOtherEnd);
    return;
  }

  // ---- the consumers: TileShape's thread mapping, rows r = 0 .. R-1 of the current item's tile ----
  const int lane = tid & 31;
  const int pass = lane % kLanes;  // the pass whose x and z this lane holds (when < R)
  RoundingKey key{};
  if constexpr (kRound) key = RoundingKey::load(p.rounding_seed);
  int64_t k = static_cast<int64_t>(blockIdx.x) < items ? static_cast<int64_t>(blockIdx.x) : -1;  // item 0
  int64_t k_next = -1;
  Ops next{};
  if (k >= 0) {
    const Item first(k, p.heads);
    next = Ops::template load<Shape>(p, first.row, first.head, first.row0, pass);
  }
  for (int i = 0; k >= 0; ++i, k = k_next) {
    const Ops cur = next;
    const int next_stage = (i + 1) % stages;
    mbarrier_wait(&id_ready[next_stage], ((i + 1) / stages) & 1);
    k_next = item_of[next_stage];
    if (k_next >= 0) {
      const Item after(k_next, p.heads);
      next = Ops::template load<Shape>(p, after.row, after.head, after.row0, pass);
    }
    const Item item(k, p.heads);
    const int row = item.row, head = item.head, row0 = item.row0;
    const int stage = i % stages;
    const int64_t slot = cur.slot;
    const bool touches = !(slot == p.pad_slot_id || slot < 0 || slot >= p.num_slots);
    const float dt = cur.decode_dt(p);
    const float decay = expf(dt * cur.A);
    float b[4], c[4];
    Vec4<kAct>::to_float(cur.B, b);
    Vec4<kAct>::to_float(cur.C, c);
    const float x_mine = to_float(cur.x);

    mbarrier_wait(&full[stage], (i / stages) & 1);
    if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineItem0 + i);
    typename V::Raw raw[R];
    if (touches) {
      const unsigned char* tile = ring + stage * Tile::kBytes;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        raw[r] = *reinterpret_cast<const typename V::Raw*>(tile + (Shape::row(r) * kN + Shape::col0()) * kStateBytes);
      }
    }
    // One arrive per warp on the stage's named barrier hands the reads back (with mbarriers, one arrival
    // per warp after a __syncwarp drew racecheck reports on lanes 1-31, and 256 arrivals per item cost
    // ~2 points of copy bandwidth at batch 512).
    named_barrier_arrive(stage_read(stage), kUpdateThreads);
    if (!touches) {
      if constexpr (kParts == 1) {
        write_zero_output<kAct>(p, row, head);
      } else {  // this item's rows of the head
        for (int pr = tid; pr < kTileP; pr += kThreads) {
          store_act<kAct>(p.out, row * p.out_row_stride + head * p.out_head_stride + row0 + pr, 0.0f);
        }
      }
      continue;
    }

    const int64_t tile = slot * p.ck_slot_stride + head * p.ck_head_stride + row0 * p.ck_row_stride;
    RoundingWords words;
    float y_mine = 0.0f;  // the output row of pass `pass`, on the lane that holds its x and z
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int pr = Shape::row(r);
      const float dtx = dt * __shfl_sync(0xffffffffu, x_mine, r, kLanes);
      float s[4];
      V::to_float(raw[r], s);
      float y = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        s[q] = decay * s[q] + dtx * b[q];
        y += s[q] * c[q];  // from the fp32 state, before it is rounded to the storage type
      }
      if constexpr (kRound) {
        uint32_t w[2];
        words.get<R>(key, slot, head, r, [row0](int n) { return row0 + Shape::row(n); }, Shape::col0(), w);
        stochastic_round4<kState>(s, w);
      }
      store_state4<kState>(p.checkpoint, tile + pr * p.ck_row_stride + Shape::col0(), s);
      y = row_sum<kLanes>(y);
      if (pass == r) y_mine = y;
    }
    if (pass < R) {
      float y = y_mine + cur.D * x_mine;
      if (p.z != nullptr) y *= silu(to_float(cur.z));
      const int pr = row0 + Shape::first_row() + pass * Shape::kRowsPerPass;
      store_act<kAct>(p.out, row * p.out_row_stride + head * p.out_head_stride + pr, y);
    }
  }
  if (tid == 0) REPLAYSSM_CTA_TIMELINE_MARK(p, kCtaTimelineConsumerEnd);
}

// Launches the kernel of items of kTileP rows (launch/mamba2_policy.h: ring stages, a persistent grid,
// claims or fixed shares), zeroing the claims' counter first in stream order.
template <int kP, int kN, DType kState, DType kAct, bool kRound, int kTileP>
cudaError_t launch_tiles(const Mamba2Params& p, const launch::DeviceInfo& device,
                         const launch::LaunchOverrides& overrides, cudaStream_t stream) {
  auto kernel = update_kernel<kP, kN, kState, kAct, kRound, kTileP>;
  launch::Mamba2UpdateProblem problem;
  problem.batch = p.batch;
  problem.heads = p.heads;
  problem.parts = kP / kTileP;
  problem.tile_bytes = UpdateTile<kTileP, kN, kState, kRound>::kBytes;
  problem.max_stages = kMaxStages;
  problem.static_bytes = 4 * kMaxStages * 8;  // full, id_ready, item_of: 3 x 8 bytes a stage, rounded up
  problem.work_counter = p.work_counter != nullptr;
  const int stages = launch::plan_mamba2_update_stages(problem, device, overrides);
  if (stages < 1) return cudaErrorInvalidConfiguration;
  const size_t smem = static_cast<size_t>(stages) * problem.tile_bytes;
  int ctas_per_sm = 0;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, kUpdateThreads, smem);
  if (err != cudaSuccess) return err;
  if (ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
  const launch::Mamba2UpdatePlan plan = launch::plan_mamba2_update(problem, stages, ctas_per_sm, device, overrides);
  if (plan.claims) {
    err = cudaMemsetAsync(p.work_counter, 0, sizeof(int32_t), stream);
    if (err != cudaSuccess) return err;
  }
  const launch::ProgrammaticLaunch pdl = launch::programmatic_launch(overrides, p.batch * p.heads, device.sm_count);
  return launch_grid(kernel, dim3(static_cast<unsigned>(plan.grid)), dim3(kUpdateThreads), smem, stream, pdl.wait, p,
                     Mamba2UpdateLaunch{plan.stages, plan.claims, pdl.wait, pdl.trigger, overrides.param_warm == 1});
}

// Whole heads, or the split into items of one pass of rows (mamba2_update_split).
template <int kP, int kN, DType kState, DType kAct, bool kRound>
cudaError_t launch_kernel(const Mamba2Params& p, cudaStream_t stream) {
  launch::DeviceInfo device;
  cudaError_t err = current_device_info(&device);
  if (err != cudaSuccess) return err;
  const launch::LaunchOverrides& overrides = launch::launch_overrides();
  constexpr int kPassRows = TileShape<kP, kN>::kRowsPerPass;
  if (launch::mamba2_update_split(p.batch, p.heads, kP / kPassRows, device.sm_count, overrides)) {
    return launch_tiles<kP, kN, kState, kAct, kRound, kPassRows>(p, device, overrides, stream);
  }
  return launch_tiles<kP, kN, kState, kAct, kRound, kP>(p, device, overrides, stream);
}

template <int kP, int kN, DType kState, DType kAct>
cudaError_t launch(const Mamba2Params& p, cudaStream_t stream) {
  if constexpr (kState != DType::kFloat32) {
    if (p.rounding_seed != nullptr) return launch_kernel<kP, kN, kState, kAct, true>(p, stream);
  }
  return launch_kernel<kP, kN, kState, kAct, false>(p, stream);
}

// The variants table's shapes x state dtypes x activation dtypes.
cudaError_t dispatch(const Mamba2Params& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (p.heads < 1 || p.groups < 1 || p.heads % p.groups != 0) return cudaErrorInvalidValue;
  return REPLAYSSM_MAMBA2_SHAPE_SWITCH(p.head_dim, p.state_dim, [&](auto P, auto N) {
    return REPLAYSSM_MAMBA2_STATE_SWITCH(p.checkpoint_dtype, [&](auto state) {
      return REPLAYSSM_MAMBA2_ACTIVATION_SWITCH(p.act_dtype, [&](auto act) {
        return launch<decltype(P)::value, decltype(N)::value, decltype(state)::value, decltype(act)::value>(p, stream);
      });
    });
  });
}

}  // namespace
}  // namespace mamba2

cudaError_t launch_mamba2_update(const Mamba2Params& p, cudaStream_t stream) {
  if (p.rounding_seed != nullptr && p.checkpoint_dtype == DType::kFloat32) return cudaErrorInvalidValue;
  const cudaError_t err = mamba2::dispatch(p, stream);
  // Every launch with a seed moves the offset, even one with no rows: the reference does the same.
  if (err != cudaSuccess || p.rounding_seed == nullptr) return err;
  return launch_rounding_offset_advance(p.rounding_seed, stream);
}

}  // namespace replayssm
