"""The 0.1 import paths (``verl_digen.trainer.*``) and ``DigenTrainer`` keep working for one release:
each warns and gives the very object that moved (so patches and isinstance checks still apply)."""

import importlib
import sys
from pathlib import Path

import pytest

import verl_digen.trainer as old_package


def test_every_old_module_is_an_alias_of_its_new_home():
    old_files = {p.stem for p in Path(old_package.__file__).parent.glob("*.py")} - {"__init__"}
    assert old_files == set(old_package.MOVED)
    for name, new in old_package.MOVED.items():
        if name == "config":
            continue  # split in two: see the next test
        old = f"verl_digen.trainer.{name}"
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
            module = importlib.import_module(old)
        assert module is importlib.import_module(new)


def test_the_old_config_module_still_has_the_schema_and_validate():
    from verl_digen import config

    sys.modules.pop("verl_digen.trainer.config", None)
    with pytest.warns(DeprecationWarning, match="verl_digen.trainer.config moved to verl_digen.config"):
        old = importlib.import_module("verl_digen.trainer.config")
    assert (old.RunConfig, old.compose, old.validate, old.ConfigError) == (
        config.RunConfig, config.compose, config.validate, config.ConfigError)


def test_digen_trainer_is_the_runtime_under_its_old_name():
    from verl_digen.driver import runtime

    with pytest.warns(DeprecationWarning, match="DigenTrainer is now DigenRuntime"):
        from verl_digen.driver.runtime import DigenTrainer
    assert DigenTrainer is runtime.DigenRuntime
    with pytest.raises(AttributeError, match="no attribute 'DigenTrainr'"):
        runtime.DigenTrainr  # noqa: B018
