"""Config defaults live in one place: the dataclasses of ``verl_digen/config/schema.py`` (and their
``MODE_DEFAULTS``). The packaged Hydra YAML is generated from them by ``python -m
verl_digen.config.generate``; these tests fail when the committed YAML was edited by hand or not
regenerated, and when composing a mode gives anything but the dataclass defaults."""

from __future__ import annotations

import shutil
from dataclasses import fields

import pytest

from verl_digen.config import ConfigError, RunConfig, compose, defaults, generate
from verl_digen.config.schema import MODE_DEFAULTS, RolloutConfig


def test_committed_yaml_is_what_the_generator_writes():
    for path, text in generate.generated().items():
        assert path.is_file(), f"{path} is missing: run `{generate.COMMAND}`"
        assert path.read_text() == text, (
            f"{path.relative_to(generate.CONFIG_DIR.parents[1])} differs from the dataclass defaults in "
            f"verl_digen/config/schema.py: run `{generate.COMMAND}` (and do not edit the YAML by hand)")


@pytest.mark.parametrize("mode", list(MODE_DEFAULTS))
def test_a_composed_mode_is_the_dataclass_defaults(mode):
    assert compose([f"trainer={mode}"]) == defaults(mode)


def test_the_plain_run_is_the_bare_dataclass():
    assert compose() == RunConfig()
    assert (RunConfig().rollout.micro_batch_size, RunConfig().model.latent_size) == (2, 16)


def test_every_leaf_has_its_dataclass_comment_in_the_yaml():
    text = (generate.CONFIG_DIR / "digen.yaml").read_text()
    assert "  micro_batch_size: 2  # samples per generation micro-batch (the pipeline unit)\n" in text
    assert "  # memory and precision of the trainer" in text  # a comment line above a field
    assert "  path: null  # local path or hub id of a diffusers pipeline; null = tiny random weights\n" in text
    comments = generate.field_comments(RolloutConfig)
    assert set(comments) == {f.name for f in fields(RolloutConfig)}
    assert comments["n"] == ([], "samples per prompt (the GRPO group)")
    assert comments["num_steps"] == ([], None)


def test_mode_groups_set_only_the_mode_and_its_digen_section():
    colocated = (generate.CONFIG_DIR / "trainer" / "colocated.yaml").read_text()
    assert colocated.startswith("# @package _global_\n")
    assert "  mode: colocated\n" in colocated and "    enable: false\n" in colocated
    main = (generate.CONFIG_DIR / "digen.yaml").read_text()
    assert "\ndigen:" not in main and "  mode:" not in main  # `_self_` would override the group


@pytest.mark.slow
def test_check_names_a_stale_file_and_the_command(tmp_path, monkeypatch, capsys):
    shutil.copytree(generate.CONFIG_DIR, tmp_path / "config", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(generate, "CONFIG_DIR", tmp_path / "config")
    assert generate.main(["--check"]) == 0
    path = tmp_path / "config" / "digen.yaml"
    path.write_text(path.read_text().replace("micro_batch_size: 2", "micro_batch_size: 4"))
    assert generate.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert str(path) in err and generate.COMMAND in err
    assert generate.main([]) == 0 and generate.main(["--check"]) == 0


def test_mode_defaults_name_real_keys_and_modes():
    with pytest.raises(ConfigError, match="trainer.mode"):
        defaults("async")
    for mode, table in MODE_DEFAULTS.items():
        cfg = defaults(mode)
        for dotted, value in table.items():
            node = cfg
            for part in dotted.split("."):
                node = getattr(node, part)
            assert node == value


def test_the_layers_below_the_config_start_from_its_defaults():
    """A default is written once: the loss, the sampler and the single-process loop start where the run
    config does (they used to say clip range 1e-4 and 10 steps against the config's 0.2 and 6)."""
    from verl_digen.algo.loss import LossConfig
    from verl_digen.config.schema import defaults
    from verl_digen.driver.local import LocalRunConfig
    from verl_digen.rollout.sampler import SamplerConfig

    run = defaults()
    assert run.worker_config().loss == LossConfig() == LocalRunConfig().loss
    ours, bare = run.sampler(), SamplerConfig()
    assert (ours.num_steps, ours.validate()) == (bare.num_steps, bare.validate()) == (
        LocalRunConfig().sampler.num_steps, LocalRunConfig().sampler.validate())
