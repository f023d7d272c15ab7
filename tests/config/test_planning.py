"""``digen plan`` for a run config (config/planning.py): a search bounded by the config's memory plan, the
overrides that launch its winner, ``digen.plan=auto``, and the command line. Nothing starts Ray."""

import json
import os
import subprocess
import sys

import pytest

from verl_digen import recipes
from verl_digen.cli import main
from verl_digen.config import ConfigError, compose, memory, planning, validate

SMALL = ("data.train_batch_size=4",)  # 64 samples per step: the recipe's model, GPUs and memory, a quick plan


def _recipe(name: str, *overrides: str):
    return compose(list(overrides), config_name=name, config_dir=str(recipes.RECIPES_DIR))


@pytest.fixture(scope="module")
def video_plan():
    cfg = _recipe("hunyuanvideo-13b-16", *SMALL)
    return cfg, planning.plan_config(cfg, keep=3)


@pytest.mark.slow
def test_every_planned_configuration_fits_and_launches_as_printed(video_plan, weights_on_this_machine):
    cfg, planned = video_plan
    assert planned.memory_checked and planned.plan.unfit > 0 and len(planned.plan.rows) == 3
    for row in planned.plan.rows:
        run = planning.apply(cfg, row)
        validate(run)  # the memory check included
        need = memory.memory_need(run)
        for pool in need.values():  # the planner leaves headroom: at most 90 % of each GPU by the plan
            assert pool.gib <= planning.MEMORY_USABLE * pool.capacity_gib + 1e-9, (row.as_dict(), pool)
        # the printed overrides compose to the same run
        again = _recipe("hunyuanvideo-13b-16", *SMALL, *planning.overrides(row))
        assert again.schedule_config() == run.schedule_config()
        assert (again.resources.generator.workers, again.resources.trainer.workers) == (row.generators, row.trainers)
        assert again.digen.tsp.rows_per_pass == row.rows_per_pass and again.actor.activation_checkpointing
    times = [r.result.step_time for r in planned.plan.rows]  # best first (ties within float noise in any order)
    assert all(a <= b + 1e-9 for a, b in zip(times, times[1:])), times


def test_rows_per_pass_are_the_most_the_memory_plan_holds(video_plan):
    cfg, planned = video_plan
    from verl_digen.schedule.rows import row_plan

    bound = 0
    for row in planned.plan.rows:
        run = planning.apply(cfg, row)
        sched = run.schedule_config()
        samples = sched.mb_size * sched.update_size(sched.make_partition(row.generators).unit_size)
        natural = row_plan(samples, cfg.trained_steps(), row.trainers, row.tsp_degree).cap
        assert row.rows_per_pass is not None and row.rows_per_pass <= natural
        if row.rows_per_pass < natural:  # memory bound it: one row more would not fit in 90 % of the GPU
            bound += 1
            over = memory.memory_need(run, rows_per_rank=row.rows_per_pass + 1)["trainer"]
            assert over.gib > planning.MEMORY_USABLE * over.capacity_gib
    assert bound, "the memory plan bounds none of the best rows: this test checks nothing"


def test_the_plan_is_stated_against_the_strongest_baseline_that_fits(video_plan):
    """HunyuanVideo on 48 GB cards: verl-omni's colocated run holds what trainer=colocated holds, over the 90 %
    the planner fills, so the plan is stated against the native loop and says why (config/planning.py)."""
    from verl_digen.schedule.split_search import verdict

    cfg, planned = video_plan
    assert planned.unfit == {"ideal", "verl-omni", "verl-omni-bypass"}
    assert any(n.startswith("colocated:verl-omni-bypass DOES NOT FIT: 46.0 GiB per GPU") for n in planned.plan.notes)
    assert "x colocated:native, " in planning.describe(planned.best, planned)
    said = verdict(planned.best, planned.colocated, planned.model, unfit=planned.unfit)
    assert said[0].endswith("x colocated:native") and "would beat digen if it fit, but it does not fit" in said[1]


@pytest.mark.slow
def test_plan_auto_runs_the_planners_choice(video_plan, weights_on_this_machine):
    cfg, planned = video_plan
    said = []
    auto = planning.resolve_auto(_recipe("hunyuanvideo-13b-16", *SMALL, "digen.plan=auto"), log=said.append)
    best = planned.best
    assert auto.digen.plan is None and auto.schedule_config() == planning.apply(cfg, best).schedule_config()
    assert (auto.resources.generator.workers, auto.resources.trainer.workers) == (best.generators, best.trainers)
    validate(auto)
    text = "\n".join(said)
    assert "planned: " in text and "launch it without the planner: " + " ".join(planning.overrides(best)) in text
    assert planning.resolve_auto(cfg) is cfg  # digen.plan=null: the config as given


@pytest.mark.parametrize("overrides, match", [
    (("digen.plan=auto", "digen.profile=null"), "digen.profile names the costs"),
    (("digen.plan=sometimes",), "null or 'auto'"),
])
def test_bad_plan_settings_are_named(overrides, match):
    cfg = compose(list(overrides))
    with pytest.raises(ConfigError, match=match) as err:
        validate(cfg)
    assert err.value.key == "digen.plan"
    with pytest.raises(ConfigError, match="digen.plan"):
        planning.resolve_auto(cfg)


def test_plan_auto_refuses_a_separate_run():
    cfg = compose(["trainer=separate", "digen.plan=auto", "digen.profile=flux-12b-16"])
    with pytest.raises(ConfigError, match="separate is a baseline"):
        planning.resolve_auto(cfg)


@pytest.mark.slow
def test_plan_auto_from_a_colocated_recipe_may_choose_digen(weights_on_this_machine):
    """A colocated default planned for another workload: the planner may pick a disaggregated split, and the
    config it returns is a real digen run (GAP on, as ``trainer=digen`` composes), not colocated's knobs."""
    cfg = _recipe("flux-12b-32", "data.train_batch_size=2", "digen.plan=auto")
    assert cfg.trainer.mode == "colocated" and not cfg.digen.gap.enable
    planned = planning.plan_config(cfg, keep=1)
    auto = planning.resolve_auto(cfg, log=lambda m: None)
    assert auto.trainer.mode == planned.best.mode
    if auto.trainer.mode == "digen":
        assert auto.digen.gap.enable and auto.digen.tag.policy == planned.best.policy
    validate(auto)
    # and the split of a digen row applied to the colocated recipe keeps digen's defaults for colocated's keys
    row = next(r for r in planning.plan_config(cfg, keep=1, colocated=False).plan.rows)
    applied = planning.apply(cfg, row)
    assert applied.trainer.mode == "digen" and applied.digen.gap.enable


@pytest.mark.slow
def test_cli_plans_a_recipe_with_prices_and_prints_the_launch(capsys):
    args = ["plan", "--recipe", "hunyuanvideo-13b-hetero", *SMALL, "--top", "2", "--gpu-price", "A=1,C=2.5", "--json"]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = json.loads(out.strip().splitlines()[-1])
    assert len(rows) == 2 and {(r["generators"], r["trainers"]) for r in rows} == {(8, 8)}
    for r in rows:  # 64 samples per step over (8 x 1 + 8 x 2.5) per hour
        assert r["samples_per_cost"] == pytest.approx(64 / (r["step_time"] / 3600 * 28.0))
    launch = next(line for line in out.splitlines() if line.startswith("launch: "))
    assert launch.startswith("launch: recipes/launch/hunyuanvideo-13b-hetero.sh data.train_batch_size=4 trainer=digen")
    assert f"rollout.micro_batch_size={rows[0]['mb_size']}" in launch
    assert "ceiling: none from colocated:ideal (" in out and "on mixed hardware" in out
    # the strongest baseline is a run on the 96 GB cards alone: its cost is theirs (8 x 2.5/hour), not all 16's
    strong = rows[0]["step_time"] * rows[0]["vs_strongest"]
    cost = next(line for line in out.splitlines() if line.startswith("cost: "))
    assert cost.endswith(f" {strong / 3600 * 20.0:.3f} on its 8 GPUs at 20/hour"), cost
    assert rows[0]["strongest_baseline"].startswith("best-subset colocated:verl-omni")
    assert "so the cheapest per sample is the fastest" in out
    assert main(["plan", "--recipe", "hunyuanvideo-13b-hetero", *SMALL, "--gpu-price", "A=1"]) == 2
    assert "no price for GPU 'C: 96GB" in capsys.readouterr().err
    assert main(["plan", "--preset", "flux-12b-16", "--gpu-price", "A=cheap"]) == 2
    assert "expected <hardware>=<price per GPU-hour>" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_plan_of_a_preset_says_memory_was_not_checked(capsys):
    assert main(["plan", "--preset", "flux-12b-16", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "note: memory not checked" in out and "launch:" not in out
    assert "ceiling: " in out and "of it, colocated:verl-omni" in out


@pytest.mark.slow
def test_dry_run_with_plan_auto_prints_the_planned_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-m", "verl_digen.main", "--config-dir", str(recipes.RECIPES_DIR),
                          "--config-name", "hunyuanvideo-13b-hetero", *SMALL, "digen.plan=auto",
                          "trainer.dry_run=true", f"hydra.run.dir={tmp_path / 'hydra'}"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "digen.plan=auto: planning 64 samples per step on 16 GPUs" in out.stdout
    planned = next(line for line in out.stdout.splitlines() if line.startswith("planned: "))
    mb = int(planned.split("micro-batch ")[1].split(",")[0])
    assert f"micro_batch_size: {mb}" in out.stdout and "plan: null" in out.stdout
    assert "ceiling    none from colocated:ideal" in out.stdout


@pytest.mark.slow
def test_a_colocated_winner_is_recommended_and_launches_as_printed(weights_on_this_machine):
    """wan2.1-14b-32 at its 512 samples: the runtime's own colocated mode on all 32 GPUs is the fastest layout
    (issue 41); the planner says so, and its overrides compose to a config the runtime accepts, fits memory
    and the dry run predicts at the planner's figure."""
    from verl_digen.config.plan import resource_plan

    cfg = _recipe("wan2.1-14b-32")
    planned = planning.plan_config(cfg, keep=2)
    best = planned.best
    assert (best.mode, best.generators, best.trainers) == ("colocated", 0, 32)
    assert all(best.result.step_time < r.result.step_time for r in planned.plan.rows if r.mode == "digen")
    run = planning.apply(cfg, best)
    validate(run)
    assert run.trainer.mode == "colocated" and run.total_workers == 32
    for pool in memory.memory_need(run).values():
        assert pool.gib <= planning.MEMORY_USABLE * pool.capacity_gib + 1e-9
    over = planning.overrides(best, cfg)
    assert over[0] == "trainer=colocated"
    again = _recipe("wan2.1-14b-32", *over)
    assert again.schedule_config() == run.schedule_config()
    assert resource_plan(again).predicted_step_s == pytest.approx(best.result.step_time, rel=1e-9)
    assert "trainer=colocated on all 32 GPUs" in planning.describe(best, planned)
    # without the colocated layout the best disaggregated split is slower
    split = planning.plan_config(cfg, keep=1, colocated=False).best
    assert split.mode == "digen" and split.result.step_time > best.result.step_time
