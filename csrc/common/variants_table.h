// A family's variants table (families/<family>/variants.h) as constexpr rows, and the host-side queries
// over it that the API checks, their messages and _C.capabilities() read. A family's X-macros stay the
// one statement of its variants (dispatch, common/dispatch.h, and tools/generate_instantiations.py read
// them); the family turns each into an array with the row macros below, so the queries are written once
// here for every family. Host-safe: no CUDA, no torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace replayssm {

// ---- keys and texts of the rows (the dispatch switches, common/dispatch.h, switch on the keys) ----

// A shape row (two dims, each < 2^31).
constexpr int64_t shape_key(int64_t a, int64_t b) { return (a << 32) | static_cast<uint32_t>(b); }

// A (checkpoint, read copy) row; without a copy the read copy's dtype is ignored.
constexpr int64_t replay_pair_key(DType checkpoint, bool copy, DType read_copy) {
  return (static_cast<int64_t>(checkpoint) << 33) | (static_cast<int64_t>(copy) << 32) |
         static_cast<uint32_t>(copy ? read_copy : checkpoint);
}

// "(checkpoint, read copy) = (float32, none)"'s value part: "(float32, none)".
inline std::string replay_pair_text(DType checkpoint, bool copy, DType read_copy) {
  return std::string("(") + dtype_name(checkpoint) + ", " + (copy ? dtype_name(read_copy) : "none") + ")";
}

// Appends t to a table's dtype list unless it is there (the lists keep table order, each dtype once).
inline void add_dtype_once(std::vector<DType>& list, DType t) {
  for (DType u : list) {
    if (u == t) return;
  }
  list.push_back(t);
}

// ---- the rows ----

// A shape: the family's two dims in its table's order (Mamba-2 (P, N), GDN (K, V)).
struct ShapeRow {
  int a;
  int b;
};

// A replay ops' (checkpoint, read copy) pair; without a copy read_copy repeats the checkpoint.
struct ReplayPairRow {
  DType checkpoint;
  bool copy;
  DType read_copy;
};

// The rows of one table: a view of a constexpr array.
template <class Row>
struct TableRows {
  const Row* rows;
  size_t count;

  template <size_t N>
  constexpr TableRows(const Row (&array)[N]) : rows(array), count(N) {}
  constexpr const Row* begin() const { return rows; }
  constexpr const Row* end() const { return rows + count; }
};

// A dtype table's dtypes, in table order, each once.
inline std::vector<DType> table_dtypes(TableRows<DType> table) {
  std::vector<DType> out;
  for (DType t : table) add_dtype_once(out, t);
  return out;
}

// ---- a family's tables and the queries over them ----

struct VariantsTable {
  TableRows<ShapeRow> shapes;             // every op compiles every shape
  TableRows<DType> activations;           // the activations' dtypes
  TableRows<DType> states;                // the conventional update's state dtypes
  TableRows<ReplayPairRow> replay_pairs;  // the replay ops' (checkpoint, read copy) pairs

  bool shape_compiled(int64_t a, int64_t b) const {
    for (const ShapeRow& s : shapes) {
      if (a == s.a && b == s.b) return true;
    }
    return false;
  }

  // "(64, 64), (64, 128), ..." in the table's dim order.
  std::string shapes_text() const {
    std::string out;
    for (const ShapeRow& s : shapes) {
      out += (out.empty() ? "(" : ", (") + std::to_string(s.a) + ", " + std::to_string(s.b) + ")";
    }
    return out;
  }

  bool replay_pair_compiled(DType checkpoint, bool copy, DType read_copy) const {
    const int64_t key = replay_pair_key(checkpoint, copy, read_copy);
    for (const ReplayPairRow& r : replay_pairs) {
      if (key == replay_pair_key(r.checkpoint, r.copy, r.read_copy)) return true;
    }
    return false;
  }

  // "(float32, none), (float32, bfloat16), ..."
  std::string replay_pairs_text() const {
    std::string out;
    for (const ReplayPairRow& r : replay_pairs) {
      out += (out.empty() ? "" : ", ") + replay_pair_text(r.checkpoint, r.copy, r.read_copy);
    }
    return out;
  }

  std::vector<DType> activation_dtypes() const { return table_dtypes(activations); }
  std::vector<DType> state_dtypes() const { return table_dtypes(states); }

  // The replay ops' checkpoint dtypes, in table order, each once.
  std::vector<DType> checkpoint_dtypes() const {
    std::vector<DType> out;
    for (const ReplayPairRow& r : replay_pairs) add_dtype_once(out, r.checkpoint);
    return out;
  }

  // The read copies a checkpoint of dtype `checkpoint` may have (none: an empty list).
  std::vector<DType> read_copy_dtypes(DType checkpoint) const {
    std::vector<DType> out;
    for (const ReplayPairRow& r : replay_pairs) {
      if (r.copy && r.checkpoint == checkpoint) add_dtype_once(out, r.read_copy);
    }
    return out;
  }
};

}  // namespace replayssm

// ---- X-macro rows -> array elements: `constexpr DType kActivations[] = {TABLE(REPLAYSSM_DTYPE_ROW)};` ----

#define REPLAYSSM_SHAPE_ROW(A, B) ::replayssm::ShapeRow{A, B},
#define REPLAYSSM_DTYPE_ROW(NAME) ::replayssm::DType::NAME,
#define REPLAYSSM_REPLAY_PAIR_ROW(CK, COPY, RD) \
  ::replayssm::ReplayPairRow{::replayssm::DType::CK, COPY, ::replayssm::DType::RD},
