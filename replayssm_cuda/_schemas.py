"""The torch.ops.replayssm.* schemas: the one list both the pure-Python package and the compiled
extension build on.

`replayssm_cuda._library` defines these ops with torch.library whether or not `_C` was built, so
`torch.ops.replayssm.*` exists on every install; `_C` only registers CUDA kernels for the ops it
compiled (TORCH_LIBRARY_IMPL). csrc/api/ops.h lists the compiled ops with the same schema text, and
tests/test_library.py checks that the two agree character for character.

Every op writes caller-allocated outputs and cache tensors in place and returns nothing; `(a!)` marks
what an op may write. num_verified (int32 (num_slots,), verify and commit): the entries each slot's
last verify appended, which verify sets and commit clamps num_accepted to, then zeroes. error_word
(int32 (4,) [code, row, value, limit], optional, last): the first misuse verify or commit detected (a
slot id neither in range nor the pad id, a num_accepted outside [0, num_verified[slot]]); see
Mamba2Cache.check. rounding_seed (an int64 (2,) [seed, offset] for stochastic rounding of a bf16 /
fp16 checkpoint's stores, advanced by the op) and staggered_flush (the steps' launch hint) come last
with defaults, so calls written before them stay valid.

GDN and KDA have one op per family (gdn_step, kda_step, ...): a family's CUDA kernels register under
its own names when they land, without touching the other family.
"""

from __future__ import annotations

CACHE_OPS = ("make_read_copy", "load", "reset", "stagger_cursors", "copy_slots", "fill_slots_table",
             "copy_slots_table")
REPLAY_OPS = ("update", "update_snapshots", "step", "verify", "commit", "flush", "materialize")
FAMILIES = ("mamba2", "gdn", "kda")


def _delta_schemas(family: str) -> dict[str, str]:
    """GDN and KDA share one signature; only the gate shapes differ (checked, not typed)."""
    cache_w = ("Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor(d!) k_buf, "
               "Tensor(e!) v_buf, Tensor(f!) g_buf, Tensor(g!) beta_buf, Tensor(h!) u_buf, Tensor(i!) num_committed")
    cache_fold = ("Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor k_buf, "
                  "Tensor v_buf, Tensor g_buf, Tensor beta_buf, Tensor u_buf, Tensor(d!) num_committed")
    inputs = "Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias"
    f = family
    return {
        f"{f}_update": (f"{f}_update(Tensor(a!) state, {inputs}, Tensor(b!) out, float? scale, bool use_qk_l2norm, "
                        "Tensor? slots, int pad_slot_id) -> ()"),
        f"{f}_update_snapshots": (f"{f}_update_snapshots(Tensor state, {inputs}, Tensor(a!) out, "
                                  "Tensor(b!) snapshots, float? scale, bool use_qk_l2norm, Tensor? slots, "
                                  "int pad_slot_id) -> ()"),
        f"{f}_step": (f"{f}_step({cache_w}, {inputs}, Tensor(j!) out, float? scale, bool use_qk_l2norm, "
                      "int max_draft_tokens, Tensor? slots, int pad_slot_id, bool staggered_flush=False) -> ()"),
        f"{f}_verify": (f"{f}_verify(Tensor checkpoint, Tensor? read_copy, Tensor? read_scale, Tensor(a!) k_buf, "
                        "Tensor(b!) v_buf, Tensor(c!) g_buf, Tensor(d!) beta_buf, Tensor(e!) u_buf, "
                        f"Tensor num_committed, Tensor(f!) num_verified, {inputs}, Tensor(g!) out, float? scale, "
                        "bool use_qk_l2norm, Tensor? slots, int pad_slot_id, Tensor(h!)? error_word=None) -> ()"),
        f"{f}_commit": (f"{f}_commit({cache_fold}, Tensor(e!) num_verified, Tensor num_accepted, int max_draft_tokens, "
                        "bool use_qk_l2norm, Tensor? slots, int pad_slot_id, Tensor(f!)? error_word=None) -> ()"),
        f"{f}_flush": f"{f}_flush({cache_fold}, bool use_qk_l2norm, Tensor? slots, int pad_slot_id) -> ()",
        f"{f}_materialize": (f"{f}_materialize(Tensor checkpoint, Tensor k_buf, Tensor v_buf, Tensor g_buf, "
                             "Tensor beta_buf, Tensor u_buf, Tensor num_committed, Tensor(a!) out, "
                             "bool use_qk_l2norm, Tensor? slots, int pad_slot_id) -> ()"),
    }


_LAYERS = ("Tensor layer_table, Tensor(a!)[] checkpoints, Tensor(b!)[] read_copies, Tensor(c!)[] read_scales, "
           "Tensor(d!)[] x_bufs, Tensor(e!)[] B_bufs, Tensor(f!)[] dt_bufs, Tensor(g!)[] num_committed, "
           "Tensor(h!)[] num_verified, Tensor[] A, Tensor(i!)[] rounding_seeds, Tensor(j!)[] error_words")
_GDN_LAYERS = ("Tensor layer_table, Tensor(a!)[] checkpoints, Tensor(b!)[] read_copies, Tensor(c!)[] read_scales, "
               "Tensor(d!)[] k_bufs, Tensor(e!)[] v_bufs, Tensor(f!)[] g_bufs, Tensor(g!)[] beta_bufs, "
               "Tensor(h!)[] u_bufs, Tensor(i!)[] num_committed, Tensor(j!)[] num_verified, "
               "Tensor(k!)[] error_words")
# The layered ops of each family with a layer table (replayssm_cuda.LayerCaches), in (commit, flush,
# materialize) order.
LAYER_OPS_OF = {family: tuple(f"{family}_{kind}_layers" for kind in ("commit", "flush", "materialize"))
                for family in ("mamba2", "gdn")}
LAYER_OPS = LAYER_OPS_OF["mamba2"] + LAYER_OPS_OF["gdn"]

SCHEMAS: dict[str, str] = {
    "make_read_copy": (
        "make_read_copy(Tensor checkpoint, Tensor(a!) read_copy, Tensor(b!)? read_scale, Tensor? slots, "
        "int pad_slot_id) -> ()"),
    "mamba2_update": (
        "mamba2_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor(b!) out, "
        "Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, Tensor? slots, int pad_slot_id, "
        "Tensor(c!)? rounding_seed=None) -> ()"),
    "mamba2_step": (
        "mamba2_step(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor(d!) x_buf, "
        "Tensor(e!) B_buf, Tensor(f!) dt_buf, Tensor(g!) num_committed, Tensor x, Tensor dt, Tensor A, Tensor B, "
        "Tensor C, Tensor(h!) out, Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, int max_draft_tokens, "
        "Tensor? slots, int pad_slot_id, Tensor(i!)? rounding_seed=None, bool staggered_flush=False) -> ()"),
    "mamba2_verify": (
        "mamba2_verify(Tensor checkpoint, Tensor? read_copy, Tensor? read_scale, Tensor(a!) x_buf, "
        "Tensor(b!) B_buf, Tensor(c!) dt_buf, Tensor num_committed, Tensor(d!) num_verified, Tensor x, Tensor dt, "
        "Tensor A, Tensor B, Tensor C, Tensor(e!) out, Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, "
        "Tensor? slots, int pad_slot_id, Tensor(f!)? error_word=None) -> ()"),
    "mamba2_commit": (
        "mamba2_commit(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor x_buf, "
        "Tensor B_buf, Tensor dt_buf, Tensor(d!) num_committed, Tensor(e!) num_verified, Tensor num_accepted, "
        "Tensor A, int max_draft_tokens, Tensor? slots, int pad_slot_id, Tensor(f!)? rounding_seed=None, "
        "Tensor(g!)? error_word=None) -> ()"),
    "mamba2_flush": (
        "mamba2_flush(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor x_buf, "
        "Tensor B_buf, Tensor dt_buf, Tensor(d!) num_committed, Tensor A, Tensor? slots, int pad_slot_id, "
        "Tensor(e!)? rounding_seed=None) -> ()"),
    "mamba2_materialize": (
        "mamba2_materialize(Tensor checkpoint, Tensor x_buf, Tensor B_buf, Tensor dt_buf, Tensor num_committed, "
        "Tensor A, Tensor(a!) out, Tensor? slots, int pad_slot_id) -> ()"),
    "mamba2_update_snapshots": (
        "mamba2_update_snapshots(Tensor state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor(a!) out, "
        "Tensor(b!) snapshots, Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, Tensor? slots, "
        "int pad_slot_id) -> ()"),
    "load": (
        "load(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor(d!) num_committed, "
        "Tensor states, Tensor? slots, int pad_slot_id) -> ()"),
    "reset": (
        "reset(Tensor(a!) checkpoint, Tensor(b!)? read_copy, Tensor(c!)? read_scale, Tensor(d!)[] buffers, "
        "Tensor(e!) num_committed, Tensor? slots, int pad_slot_id) -> ()"),
    "stagger_cursors": (
        "stagger_cursors(Tensor(a!)[] buffers, Tensor(b!) num_committed, Tensor? slots, int pad_slot_id, "
        "int period) -> ()"),
    "copy_slots": (
        "copy_slots(Tensor(a!)[] cache_tensors, Tensor src_slots, Tensor dst_slots, int pad_slot_id) -> ()"),
    # The slot ops of many layers in one launch (replayssm_cuda.LayerCaches): slot_table is the device
    # table of the tensors, built once by replayssm_cuda._C.slot_table; the reference ignores it.
    "fill_slots_table": (
        "fill_slots_table(Tensor(a!)[] cache_tensors, Tensor slot_table, float[] fill_values, int[] fill_periods, "
        "Tensor? slots, int pad_slot_id) -> ()"),
    "copy_slots_table": (
        "copy_slots_table(Tensor(a!)[] cache_tensors, Tensor slot_table, Tensor src_slots, Tensor dst_slots, "
        "int pad_slot_id) -> ()"),
    # Every Mamba-2 layer of a model in one launch each (replayssm_cuda.LayerCaches): the layers' cache
    # tensors as lists, one entry per layer (read_copies, read_scales, rounding_seeds, error_words empty
    # where the layers have none), and layer_table, the device table of their pointers built once by
    # replayssm_cuda._C.mamba2_layer_table; the reference loops over the layers and ignores the table.
    **{f"mamba2_{kind}_layers": f"mamba2_{kind}_layers({_LAYERS}, {tail}) -> ()" for kind, tail in (
        ("commit", "Tensor num_accepted, int max_draft_tokens, Tensor? slots, int pad_slot_id"),
        ("flush", "Tensor? slots, int pad_slot_id"),
        ("materialize", "Tensor(k!) out, Tensor? slots, int pad_slot_id"))},
    # The same for every GDN layer (replayssm_cuda._C.gdn_layer_table builds the table): GDN's fold reads no
    # weights and has no rounding seed; use_qk_l2norm is every layer's.
    **{f"gdn_{kind}_layers": f"gdn_{kind}_layers({_GDN_LAYERS}, {tail}) -> ()" for kind, tail in (
        ("commit", "Tensor num_accepted, int max_draft_tokens, bool use_qk_l2norm, Tensor? slots, int pad_slot_id"),
        ("flush", "bool use_qk_l2norm, Tensor? slots, int pad_slot_id"),
        ("materialize", "Tensor(l!) out, bool use_qk_l2norm, Tensor? slots, int pad_slot_id"))},
    **_delta_schemas("gdn"),
    **_delta_schemas("kda"),
}

ALL_OPS: tuple[str, ...] = tuple(SCHEMAS)
