"""The colocated baselines' memory, priced by the same plan and headroom as this project's own layouts
(config/colocated_memory.py ``baseline_memory``): one that does not fit is no ratio and never the strongest."""

import pytest

from verl_digen import recipes
from verl_digen.config import compose
from verl_digen.config.colocated_memory import MEMORY_USABLE, baseline_memory
from verl_digen.config.plan import resource_plan
from verl_digen.config.planning import colocated_cap


def _recipe(name: str, *overrides: str):
    return compose(list(overrides), config_name=name, config_dir=str(recipes.RECIPES_DIR))


def test_verl_omni_holds_what_trainer_colocated_holds_and_is_refused_by_the_same_rule():
    cfg = _recipe("hunyuanvideo-13b-16")
    fits = baseline_memory(cfg)
    omni, ideal, native = fits["verl-omni"], fits["ideal"], fits["native"]
    # the engine runs hold the generation copy + text encoders + VAE: 46 GiB of a 48 GiB card, over 90 %
    assert omni.gib == ideal.gib == fits["verl-omni-bypass"].gib == pytest.approx(46.0, abs=0.1)
    assert omni.usable_gib == pytest.approx(MEMORY_USABLE * 48) and omni.fits is False
    assert colocated_cap(cfg, cfg.total_workers) == 0 == omni.rows_per_pass  # the planner's own refusal
    assert native.fits and native.gib < omni.gib - 15  # no generation copy
    plan = resource_plan(cfg)
    assert plan.unfit == {"ideal", "verl-omni", "verl-omni-bypass"}
    assert plan.strongest == ("colocated:native", plan.predicted_colocated["native"])
    text = plan.render()
    assert f"{plan.predicted_colocated['verl-omni-bypass']:.2f} s/step colocated:verl-omni-bypass on the same 16 " \
           "workers if it fit: it DOES NOT FIT (46.0 GiB per GPU against 43.2 GiB" in text
    assert "colocated:verl-omni-bypass on the same 16 workers (this run" not in text


def test_more_memory_makes_verl_omni_the_strongest_again():
    plan = resource_plan(_recipe("hunyuanvideo-13b-16", "resources.generator.gpu_memory_gb=80",
                                 "resources.trainer.gpu_memory_gb=80"))
    assert plan.unfit == frozenset()
    assert plan.strongest == ("colocated:verl-omni-bypass", plan.predicted_colocated["verl-omni-bypass"])


def test_baselines_train_with_the_rows_their_memory_holds():
    """wan2.1-14b-16: 32 samples per GPU per timestep, 11 rows per pass fit; verl-omni splits each timestep's
    pass as trainer=colocated does, and is priced so."""
    cfg = _recipe("wan2.1-14b-16")
    fits = baseline_memory(cfg)
    assert fits["verl-omni"].rows_per_pass == colocated_cap(cfg, 16) == 11 and fits["verl-omni"].fits
    capped = resource_plan(cfg).predicted_colocated
    roomy = resource_plan(_recipe("wan2.1-14b-16", "resources.generator.gpu_memory_gb=400",
                                  "resources.trainer.gpu_memory_gb=400")).predicted_colocated
    for b in ("ideal", "verl-omni", "verl-omni-bypass"):
        assert capped[b] > roomy[b], b  # more, smaller passes
    assert capped["native"] == roomy["native"]  # one row per pass already
