"""replayssm_cuda.launch_overrides / get_launch_overrides (replayssm_cuda/launch.py) on the CPU: without the
compiled extension they raise a clear RuntimeError; with one (a stand-in for _C here: the C++ side, its
field checks and their ValueErrors are tested by tests/test_launch_policy.py and tests/gpu) the context
manager sets the named fields on top of those in force and restores them on exit."""

import pytest

import replayssm_cuda
from replayssm_cuda import _extension

UNSET = {"step_heads_per_cta": 0, "step_groups_per_cta": 0, "step_order": -1, "step_fold_split": -1,
         "step_staggered_heads_per_cta": 0, "verify_heads_per_cta": 0, "gdn_step_parts": 0, "gdn_step_order": -1, "gdn_step_order_cursor": -1, "gdn_step_fold_parts": 0, "gdn_step_tile_stages": -1, "gdn_update_split": -1, "update_stages": 0, "update_ctas": 0, "update_claims": -1,
         "update_split": -1, "order_pass_pdl": -1, "pdl_warm": -1, "pdl": -1}


class FakeC:
    """The two entry points of _C.set_launch_overrides / get_launch_overrides, with their semantics: set
    replaces every field (those not named are unset; None unsets), get returns them all."""

    def __init__(self):
        self.values = dict(UNSET)

    def get_launch_overrides(self):
        return dict(self.values)

    def set_launch_overrides(self, values):
        for name in values:
            if name not in UNSET:
                raise ValueError(f"set_launch_overrides: unknown field {name}")
        self.values = {k: (UNSET[k] if values.get(k) is None else values[k]) for k in UNSET}


def test_without_extension(monkeypatch):
    monkeypatch.setattr(_extension, "_C", None)
    with pytest.raises(RuntimeError, match="launch overrides need the compiled extension"):
        replayssm_cuda.get_launch_overrides()
    with pytest.raises(RuntimeError, match="launch overrides need the compiled extension"):
        with replayssm_cuda.launch_overrides(step_heads_per_cta=4):
            pass


def test_context_manager_sets_and_restores(monkeypatch):
    fake = FakeC()
    fake.values["update_claims"] = 0  # e.g. from the environment
    monkeypatch.setattr(_extension, "_C", fake)
    with replayssm_cuda.launch_overrides(step_heads_per_cta=4) as inside:
        assert inside["step_heads_per_cta"] == 4 and inside["update_claims"] == 0
        with replayssm_cuda.launch_overrides(update_claims=None, step_order=0):
            now = replayssm_cuda.get_launch_overrides()
            assert (now["step_heads_per_cta"], now["update_claims"], now["step_order"]) == (4, -1, 0)
        assert replayssm_cuda.get_launch_overrides() == inside
    assert replayssm_cuda.get_launch_overrides() == {**UNSET, "update_claims": 0}


def test_context_manager_restores_after_an_error(monkeypatch):
    fake = FakeC()
    monkeypatch.setattr(_extension, "_C", fake)
    with pytest.raises(KeyError):
        with replayssm_cuda.launch_overrides(verify_heads_per_cta=2):
            raise KeyError("inside")
    assert replayssm_cuda.get_launch_overrides() == UNSET
    with pytest.raises(ValueError, match="unknown field step_head_per_cta"):
        with replayssm_cuda.launch_overrides(step_head_per_cta=2):
            pass
    assert replayssm_cuda.get_launch_overrides() == UNSET
