"""``rewards/names.py``: the reward names a config check reads without importing a reward (torch, PIL) are the
registered ones: every reward ``rewards/registry.py`` registers, and a plugin's once it registers."""

from __future__ import annotations

import sys

import pytest

from verl_digen.config import ConfigError, compose, validate
from verl_digen.registry import qualname
from verl_digen.rewards import REWARDS, Reward, register_reward
from verl_digen.rewards.names import BUILTIN, CUSTOM, reward_names


def test_the_builtin_names_are_exactly_what_the_registry_registers():
    ours = {name for name, factory in REWARDS.items() if qualname(factory).startswith("verl_digen.rewards.")}
    assert ours == set(BUILTIN) and CUSTOM in BUILTIN


def test_before_the_registry_is_imported_the_builtin_names_are_read(monkeypatch):
    monkeypatch.delitem(sys.modules, "verl_digen.rewards.registry")  # as in a dry run: no reward imported
    assert reward_names() == tuple(sorted(BUILTIN))


def test_a_registered_plugin_reward_is_accepted_by_name_and_an_unknown_one_lists_them():
    class Plugin(Reward):
        name = "plugin_reward"

    register_reward("plugin_reward", Plugin)
    try:
        assert "plugin_reward" in reward_names()
        with pytest.raises(ConfigError, match="data.train_batch_size"):  # the next check: the name passed
            validate(compose(["reward.name=plugin_reward", "data.train_batch_size=0"]))
    finally:
        REWARDS.unregister("plugin_reward")
    with pytest.raises(ConfigError, match="reward.name.*plugin_reward.*one of brightness, colorfulness, custom"):
        validate(compose(["reward.name=plugin_reward"]))
