"""_C.capabilities() (csrc/api/capabilities.cpp): what the build compiled, read from the families' variants
tables. Every shape and dtype it lists runs; a shape it does not list is refused with the list."""

import pytest
import torch

from replayssm_cuda import _extension, ops


def capabilities():
    return _extension._C.capabilities()


def test_capabilities_lists_every_compiled_op_once():
    caps = capabilities()
    assert set(caps) >= {"mamba2", "cache"}
    listed = [op for entry in caps.values() for op in entry["ops"]]
    assert sorted(listed) == sorted(_extension._C.compiled_ops())
    assert all(op.startswith("mamba2_") for op in caps["mamba2"]["ops"])
    assert caps["cache"]["ops"] == ["make_read_copy", "load", "reset", "stagger_cursors", "copy_slots",
                                    "fill_slots_table", "copy_slots_table"]
    assert caps["cache"]["read_copy_max_cols"] == 256 and caps["cache"]["copy_slots_max_pairs"] == 3072
    assert caps["cache"]["checkpoint_dtypes"] == ["float32", "bfloat16", "float16"]
    assert caps["cache"]["read_copy_dtypes"] == ["bfloat16", "float16", "float8_e4m3fn"]
    assert sorted(caps["gdn"]["ops"]) == sorted(f"gdn_{op}" for op in ("update", "update_snapshots", "step", "verify",
                                                                      "commit", "flush", "materialize",
                                                                      "commit_layers", "flush_layers",
                                                                      "materialize_layers"))
    # KDA runs GDN's kernels: the same facts, its own ops (no layered ones: KDA has no layer table) and fold
    # limits (its fold keeps the window's decays per key channel: a float32 128 x 128 checkpoint takes L <= 63).
    assert sorted(caps["kda"]["ops"]) == sorted(f"kda_{op}" for op in ("update", "update_snapshots", "step", "verify",
                                                                      "commit", "flush", "materialize"))
    own = ("ops", "fold_max_buffer_len")
    facts = {family: {k: v for k, v in caps[family].items() if k not in own} for family in ("gdn", "kda")}
    assert facts["kda"] == facts["gdn"]
    assert caps["gdn"]["fold_max_buffer_len"] == []
    assert caps["kda"]["fold_max_buffer_len"] == [[128, 128, "float32", 63]]


def test_mamba2_capabilities():
    m = capabilities()["mamba2"]
    assert [80, 128] in m["shapes"] and [64, 128] in m["shapes"]
    assert m["activation_dtypes"] == ["bfloat16", "float16"]
    assert m["update_checkpoint_dtypes"] == ["float32", "bfloat16", "float16"]
    assert ["float32", None] in m["checkpoint_read_copy"] and ["bfloat16", "float8_e4m3fn"] in m["checkpoint_read_copy"]
    assert ["bfloat16", "float16"] not in m["checkpoint_read_copy"]
    assert m["max_buffer_len"] == 64 and m["max_draft_tokens"] == 16


def test_gdn_capabilities():
    g = capabilities()["gdn"]
    # The checkpoint's last two dims, [V, K].
    assert sorted(g["shapes"]) == [[64, 64], [64, 128], [128, 64], [128, 128]]
    assert g["activation_dtypes"] == ["bfloat16", "float16"]
    assert g["update_checkpoint_dtypes"] == ["float32", "bfloat16", "float16"]
    assert ["float32", "float8_e4m3fn"] in g["checkpoint_read_copy"] and ["float16", None] in g["checkpoint_read_copy"]
    assert g["max_buffer_len"] == 64 and g["max_draft_tokens"] == 16


def test_every_listed_gdn_shape_and_state_dtype_runs():
    g = capabilities()["gdn"]
    H, HV, batch = 1, 2, 1
    for V, K in g["shapes"]:
        for state_name in g["update_checkpoint_dtypes"]:
            for act_name in g["activation_dtypes"]:
                act, state_dtype = getattr(torch, act_name), getattr(torch, state_name)
                state = torch.zeros(2, HV, V, K, device="cuda", dtype=state_dtype)
                q, k = (torch.randn(batch, H, K, device="cuda").to(act) for _ in range(2))
                v = torch.randn(batch, HV, V, device="cuda").to(act)
                a, b = (torch.randn(batch, HV, device="cuda").to(act) for _ in range(2))
                out = torch.empty_like(v)
                A_log, dt_bias = torch.zeros(HV, device="cuda"), torch.zeros(HV, device="cuda")
                ops.gdn_update(state, q, k, v, a, b, A_log, dt_bias, out, backend="cuda")
                assert torch.isfinite(out.float()).all(), (V, K, state_name, act_name)


def test_every_listed_kda_shape_and_state_dtype_runs():
    g = capabilities()["kda"]
    H, HV, batch = 1, 2, 1
    for V, K in g["shapes"]:
        for state_name in g["update_checkpoint_dtypes"]:
            for act_name in g["activation_dtypes"]:
                act, state_dtype = getattr(torch, act_name), getattr(torch, state_name)
                state = torch.zeros(2, HV, V, K, device="cuda", dtype=state_dtype)
                q, k = (torch.randn(batch, H, K, device="cuda").to(act) for _ in range(2))
                v = torch.randn(batch, HV, V, device="cuda").to(act)
                a = torch.randn(batch, HV, K, device="cuda").to(act)
                b = torch.randn(batch, HV, device="cuda").to(act)
                out = torch.empty_like(v)
                A_log, dt_bias = torch.zeros(HV, device="cuda"), torch.zeros(HV, K, device="cuda")
                ops.kda_update(state, q, k, v, a, b, A_log, dt_bias, out, backend="cuda")
                assert torch.isfinite(out.float()).all(), (V, K, state_name, act_name)


def test_every_listed_shape_and_state_dtype_runs():
    m = capabilities()["mamba2"]
    H, G, batch = 2, 1, 1
    for P, N in m["shapes"]:
        for state_name in m["update_checkpoint_dtypes"]:
            for act_name in m["activation_dtypes"]:
                act, state_dtype = getattr(torch, act_name), getattr(torch, state_name)
                state = torch.zeros(2, H, P, N, device="cuda", dtype=state_dtype)
                x = torch.randn(batch, H, P, device="cuda").to(act)
                B, C = (torch.randn(batch, G, N, device="cuda").to(act) for _ in range(2))
                dt = torch.rand(batch, H, device="cuda").to(act)
                out = torch.empty_like(x)
                A = -torch.ones(H, device="cuda")
                ops.mamba2_update(state, x, dt, A, B, C, out, None, None, None, True, None, -1, backend="cuda")
                assert torch.isfinite(out.float()).all(), (P, N, state_name, act_name)


def test_an_unlisted_shape_is_refused_with_the_list():
    state = torch.zeros(2, 2, 96, 64, device="cuda")
    x = torch.randn(1, 2, 96, device="cuda").bfloat16()
    B = C = torch.randn(1, 1, 64, device="cuda").bfloat16()
    dt = torch.rand(1, 2, device="cuda").bfloat16()
    shapes = ", ".join(f"\\({P}, {N}\\)" for P, N in capabilities()["mamba2"]["shapes"])
    with pytest.raises(RuntimeError, match=rf"must be one of {shapes}, got \(96, 64\)"):
        torch.ops.replayssm.mamba2_update(state, x, dt, -torch.ones(2, device="cuda"), B, C, torch.empty_like(x),
                                          None, None, None, True, None, -1)
