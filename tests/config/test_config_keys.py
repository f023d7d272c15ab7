"""A scheduler error names the config key that set the bad field, through one table (``SCHEDULE_KEYS``),
and each constant list of allowed values is written once."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from verl_digen.config import ConfigError, RunConfig, compose, validate
from verl_digen.config.schema import SCHEDULE_KEYS, checked_schedule_config
from verl_digen.schedule.config import ScheduleConfig, ScheduleConfigError

PACKAGE = Path(__file__).resolve().parents[2] / "verl_digen"


def _get(cfg, dotted):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _set(cfg, dotted, value):
    *parents, leaf = dotted.split(".")
    for part in parents:
        cfg = getattr(cfg, part)
    setattr(cfg, leaf, value)


def test_every_field_the_config_sets_has_its_key():
    assert set(SCHEDULE_KEYS) == {f.name for f in fields(ScheduleConfig)} - {"train_loop"}
    cfg = RunConfig()
    for key in SCHEDULE_KEYS.values():
        _get(cfg, key)  # a real config key


#: field -> (config key set to a value the scheduler refuses, that value); validate() checks some of these
#: keys itself first, so the mapping is exercised on RunConfig objects directly
BAD = {
    "prompts": ("data.train_batch_size", 0),
    "group_size": ("rollout.n", 0),
    "mb_size": ("rollout.micro_batch_size", 3),
    "steps": ("trainer.total_steps", 0),
    "mode": ("trainer.mode", "async"),
    "tsp_degree": ("digen.tsp.degree", -1),
    "policy": ("digen.tag.policy", "greedy"),
    "staleness": ("digen.tcss.staleness", 1.5),
    "update": ("digen.update", "batch"),
}


@pytest.mark.parametrize("field", sorted(BAD))
def test_a_scheduler_error_names_the_key_that_set_the_field(field):
    key, value = BAD[field]
    cfg = RunConfig()
    _set(cfg, key, value)
    with pytest.raises(ScheduleConfigError) as raw:
        cfg.schedule_config()
    assert raw.value.field == field
    with pytest.raises(ConfigError) as err:
        checked_schedule_config(cfg)
    assert err.value.key == SCHEDULE_KEYS[field] == key
    assert f"config key '{key}' = {value!r} is invalid: expected {raw.value.expected}" == str(err.value)


def test_partition_layout_errors_are_the_micro_batch_size_s():
    cfg = RunConfig()
    cfg.digen.gap.enable = False  # batch layout: micro-batches of whole prompts (n = 4, micro-batch 2)
    with pytest.raises(ConfigError, match="whole prompts") as err:
        checked_schedule_config(cfg)
    assert err.value.key == "rollout.micro_batch_size"


@pytest.mark.parametrize("overrides, key, expected", [
    (["digen.update=batch"], "digen.update", "one of unit, micro_batch"),
    (["trainer=separate", "digen.tcss.staleness=0.25"], "digen.tcss.staleness", "0 unless the mode is digen"),
    (["digen.tcss.staleness=1.5"], "digen.tcss.staleness", "a fraction in [0, 1]"),
    (["rollout.micro_batch_size=3"], "rollout.micro_batch_size", "does not divide the batch 4 x 4 = 16"),
])
def test_validate_reports_scheduler_errors_under_their_key(overrides, key, expected):
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides))
    assert err.value.key == key and expected in str(err.value)


#: constant lists of allowed values: each is written once in the package (other modules import it)
LISTS = {
    "loggers": r"\(\s*\"console\",\s*\"tensorboard\",\s*\"wandb\"\s*\)",
    "dtypes": r"\(\s*\"float64\",\s*\"float32\",\s*\"bfloat16\",\s*\"float16\"\s*\)"
              r"|\(\s*\"float32\",\s*\"float64\",\s*\"bfloat16\",\s*\"float16\"\s*\)",
    "update granularities": r"\(\s*\"unit\",\s*\"micro_batch\"\s*\)",
    "sync backends": r"\(\s*\"object_store\",\s*\"collective\"\s*\)",
}


@pytest.mark.parametrize("name", sorted(LISTS))
def test_each_constant_list_is_written_once(name):
    where = [str(path.relative_to(PACKAGE.parent)) for path in sorted(PACKAGE.rglob("*.py"))
             for _ in re.finditer(LISTS[name], path.read_text())]
    assert len(where) <= 1, f"the {name} list is written in {where}: import the one definition instead"


def test_an_unknown_key_is_answered_with_ours():
    """verl's name for one of our keys names ours (before Hydra, whose advice to add ``+`` leads nowhere);
    a misspelt key names the nearest keys; both name the value given."""
    from omegaconf import OmegaConf

    from verl_digen.config import ConfigError
    from verl_digen.config.schema import config_keys, load
    from verl_digen.main import verl_name_error

    assert verl_name_error(["trainer.total_training_steps=3"]) == (
        "invalid configuration: trainer.total_training_steps=3 is verl's name; verl-digen reads trainer.total_steps=3")
    assert "trainer.total_steps=7" in verl_name_error(["trainer.dry_run=true", "+trainer.total_training_steps=7"])
    assert verl_name_error(["trainer.total_steps=3", "trainer=colocated"]) is None
    with pytest.raises(ConfigError, match=r"'trainer.total_training_steps' = 3 .*trainer.total_steps") as err:
        load(OmegaConf.create({"trainer": {"total_training_steps": 3}}))
    assert err.value.key == "trainer.total_training_steps"
    with pytest.raises(ConfigError, match=r"'actor.lrr' = 0.1 .*did you mean actor.lr\?"):
        load(OmegaConf.create({"actor": {"lrr": 0.1}}))
    with pytest.raises(ConfigError, match=r"a key of the config \(docs/config.md\)$"):
        load(OmegaConf.create({"trainer": {"zzzzzz": 1}}))
    keys = config_keys()
    assert {"trainer.total_steps", "digen.tcss.staleness", "actor.lr"} <= set(keys) and len(keys) == len(set(keys))


def test_a_preset_on_the_tiny_model_says_whose_costs_it_prices():
    warned = [w for w in validate(compose(["digen.profile=hunyuanvideo-13b-16"])) if "prices" in w]
    assert warned and "HunyuanVideo-13B (13B parameters)" in warned[0] and "tiny random-weight flux" in warned[0]
    assert not [w for w in validate(compose([])) if "prices" in w]  # no preset named: nothing to say
