"""The dry run's baselines for a run config (config/plan.py): colocated:verl-omni-bypass on every cluster, and
on mixed pools the best single-type subset, memory-checked by the config's memory plan."""

from verl_digen import recipes
from verl_digen.config import compose
from verl_digen.config.plan import resource_plan, subset_fits


def _recipe(name: str, *overrides: str):
    return compose(list(overrides), config_name=name, config_dir=str(recipes.RECIPES_DIR))


def test_hetero_dry_run_prints_bypass_and_the_best_subset_that_fits():
    cfg = _recipe("hunyuanvideo-13b-hetero")
    fits = subset_fits(cfg)
    # 48 GB cards cannot hold a colocated run (generation copy + text encoders + sharded state); 96 GB ones can
    assert (fits("generator"), fits("trainer")) == (False, True)
    plan = resource_plan(cfg)
    head = plan.best_subset["verl-omni"]
    assert head.pool == "trainer" and head.memory_checked and head.result.step_time > plan.predicted_step_s
    assert plan.strongest_subset == plan.best_subset["verl-omni-bypass"].result.step_time
    text = plan.render()
    assert f"{plan.predicted_colocated['verl-omni']:.2f} s/step colocated:verl-omni on" in text  # kept
    assert f"{plan.predicted_colocated['verl-omni-bypass']:.2f} s/step colocated:verl-omni-bypass on" in text
    assert f"{head.result.step_time:.2f} s/step best-subset: colocated:verl-omni on the trainer pool's 8" in text
    assert "generator pool's 8 GPUs alone (A: 48GB, 155 TF dense) does not fit their memory" in text


def test_declared_memory_decides_the_subset():
    cfg = _recipe("hunyuanvideo-13b-hetero", "resources.generator.gpu_memory_gb=141")
    assert subset_fits(cfg)("generator") is True
    assert subset_fits(_recipe("hunyuanvideo-13b-hetero", "resources.trainer.gpu_memory_gb=24"))("trainer") is False


def test_homogeneous_dry_run_has_bypass_and_no_subset():
    plan = resource_plan(_recipe("wan2.1-14b-32"))
    assert plan.best_subset == {} and "best-subset" not in plan.render()
    assert "s/step colocated:verl-omni-bypass on the same 32 workers" in plan.render()


def test_a_subset_is_held_to_the_planners_headroom():
    """Colocated on the 8 generator cards alone needs 49.0 GiB per GPU: it fits a 52 GiB card by the plan alone but
    not 90 % of it, the share the planner lets any layout fill: the same rule for the baselines as for verl-digen's
    own layouts."""
    assert subset_fits(_recipe("hunyuanvideo-13b-hetero", "resources.generator.gpu_memory_gb=52"))("generator") is False
    assert subset_fits(_recipe("hunyuanvideo-13b-hetero", "resources.generator.gpu_memory_gb=56"))("generator") is True
