// LOCAL LIST, to be merged into families/gdn/variants.h (the family's one table of compiled shapes x
// dtypes, written beside gdn_update / gdn_step) and then deleted: what the GDN speculative kernels
// (verify, commit, flush, materialize) compile, and what spec_api.cpp admits. Host-safe.
//
// (K, V) = (head_k_dim, head_v_dim); activations bf16 or fp16; (checkpoint, read copy) pairs: fp32
// with none / bf16 / fp16 / fp8, bf16 with none / fp8, fp16 with none / fp8; a 16-bit checkpoint pairs
// with activations of its own type (as Mamba-2's replay ops). COPY false: no read copy (READ unused).
#pragma once

#define REPLAYSSM_GDN_SHAPES(X) X(64, 64) X(64, 128) X(128, 64) X(128, 128)
#define REPLAYSSM_GDN_SHAPES_TEXT "(64, 64), (64, 128), (128, 64) or (128, 128)"

#define REPLAYSSM_GDN_CHECKPOINT_READ_COPY(X) \
  X(kFloat32, false, kFloat32)                \
  X(kFloat32, true, kBFloat16)                \
  X(kFloat32, true, kFloat16)                 \
  X(kFloat32, true, kFloat8E4M3)              \
  X(kBFloat16, false, kBFloat16)              \
  X(kBFloat16, true, kFloat8E4M3)             \
  X(kFloat16, false, kFloat16)                \
  X(kFloat16, true, kFloat8E4M3)
