"""The one registry every pluggable part uses (models, rewards, TAG policies, sync backends)."""

import pytest

from verl_digen.archs import ARCHS
from verl_digen.registry import Registry
from verl_digen.rewards import REWARDS
from verl_digen.schedule.tag_policy import TAG_POLICIES
from verl_digen.workers.sync import SYNC_BACKENDS


def test_register_by_decorator_or_call_refuse_a_different_entry_and_list_names_when_unknown():
    reg: Registry = Registry("widget")

    @reg.register("a")
    def make_a():
        return "a"

    assert reg.register("b", len) is len and sorted(reg) == ["a", "b"] and reg.lookup("a") is make_a
    assert reg.register("a", make_a) is make_a  # the same entry again (a module imported twice)
    with pytest.raises(ValueError, match=r"widget 'a' is already registered by .*make_a"):
        reg.register("a", len)
    reg.register("a", len, overwrite=True)
    assert reg["a"] is len
    with pytest.raises(ValueError, match=r"unknown widget 'c'; registered: a, b"):
        reg.lookup("c")
    reg.unregister("b")
    reg.unregister("b")  # absent: ignored
    assert list(reg) == ["a"] and len(reg) == 1


def test_the_four_registries_are_one_kind():
    for registry, name in ((ARCHS, "flux"), (REWARDS, "latent_mean"), (TAG_POLICIES, "bts"),
                           (SYNC_BACKENDS, "object_store")):
        assert isinstance(registry, Registry) and name in registry
