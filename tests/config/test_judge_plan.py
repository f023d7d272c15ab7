"""The served judge in the plans (config/judge.py, schedule/costs.py ``with_judge``): its own pool's GPUs in the
resource plan, and its time per image in the predicted step of this run and of every baseline alike."""

from __future__ import annotations

import pytest

from verl_digen.config import compose
from verl_digen.config.plan import resource_plan
from verl_digen.schedule.costs import Affine, CostModel, Hardware, JudgeCost, Pool, with_judge

HW = Hardware("gpu", generate=Affine(1.0, 0.5), score=Affine(0.1, 0.02), train_pass=Affine(0.2, 0.1))


def _model(g: int = 4, r: int = 4) -> CostModel:
    return CostModel(Pool(HW, g), Pool(HW, r), steps_trained=2)


@pytest.mark.parametrize("judge,gen_factor,colo_factor", [
    (JudgeCost(0.3), 1, 1),  # TP 1 on the scoring GPUs: each scorer's own replica
    (JudgeCost(0.3, tensor_parallel_size=2), 2, 2),  # TP 2 there: half as many replicas as scorers
    (JudgeCost(0.3, tensor_parallel_size=2, gpus=4), 2, 4),  # 2 replicas of its own, 4 generators / 8 GPUs share them
])
def test_the_judge_adds_its_time_per_image_to_scoring_on_both_sides(judge, gen_factor, colo_factor):
    base, judged = _model(), with_judge(_model(), judge)
    mb = 3
    assert judged.stage_costs(mb).score - base.stage_costs(mb).score == pytest.approx(mb * 0.3 * gen_factor)
    colo, colo0 = judged.colocated_phases(16), base.colocated_phases(16)
    assert colo["score"] - colo0["score"] == pytest.approx(16 / 8 * 0.3 * colo_factor)
    for kind in ("generate", "update"):  # nothing else changes
        assert colo[kind] == colo0[kind]
        assert getattr(judged.stage_costs(mb), kind) == getattr(base.stage_costs(mb), kind)


def test_a_resized_cluster_reprices_the_judge_for_its_new_pools():
    """The planner's splits (with_workers): a judge of its own is shared by the new number of generators."""
    judged = with_judge(_model(), JudgeCost(0.3, tensor_parallel_size=1, gpus=2))
    six = judged.with_workers(6, 2)
    assert (six.generator.workers, six.trainer.workers) == (6, 2)
    assert six.stage_costs(1).score - _model(6, 2).stage_costs(1).score == pytest.approx(0.3 * 6 / 2)
    assert six.colocated_phases(16)["score"] - _model(6, 2).colocated_phases(16)["score"] == pytest.approx(
        2 * 0.3 * 8 / 2)


def test_judge_cost_refuses_what_cannot_be_a_judge():
    for bad in (dict(seconds_per_image=-1.0), dict(seconds_per_image=1.0, tensor_parallel_size=0),
                dict(seconds_per_image=1.0, tensor_parallel_size=4, gpus=2)):
        with pytest.raises(ValueError):
            JudgeCost(**bad)


QWEN = ["digen.profile=qwen-image-20b-16", "resources.generator.workers=8", "resources.trainer.workers=8",
        "data.train_batch_size=16", "rollout.n=8", "rollout.micro_batch_size=8"]


def test_the_dry_run_counts_the_judges_pool_and_prices_its_images_on_both_sides(tmp_path):
    """A judge of its own (4 GPUs, TP 2, 0.5 s per image): the plan lists its pool apart from the 16 workers, and
    the prediction of this run and of every colocated baseline both grow; without a price it says so."""
    model = tmp_path / "judge"
    model.mkdir()
    judge = [f"reward.served.model_path={model}", "reward.served.tensor_parallel_size=2", "resources.reward.workers=4"]
    plain = resource_plan(compose(QWEN))
    unpriced = resource_plan(compose([*QWEN, *judge]))
    priced = resource_plan(compose([*QWEN, *judge, "reward.served.seconds_per_image=0.5"]))
    assert ("judge", 4, "any cpu node") in priced.pools and (priced.total_workers, priced.judge_gpus) == (16, 4)
    assert unpriced.predicted_step_s == plain.predicted_step_s  # not priced: left out, and said
    assert "not priced (set reward.served.seconds_per_image" in unpriced.render()
    assert priced.predicted_step_s > plain.predicted_step_s
    for b, t in priced.predicted_colocated.items():
        assert t > plain.predicted_colocated[b], b
    text = priced.render()
    assert "2 replica(s) x 2 GPU(s) = 4 GPU(s) on a pool of its own" in text
    assert "on the same 16 workers (+ the judge's 4 GPU(s))" in text
    # on the generator pool: no pool of its own, the baselines' judge on all their GPUs
    gen = resource_plan(compose([*QWEN, f"reward.served.model_path={model}", "reward.served.tensor_parallel_size=2",
                                 "reward.served.seconds_per_image=0.5"]))
    assert gen.judge_gpus == 0 and "4 replica(s) x 2 GPU(s) = 8 GPU(s) on the generator pool's GPUs" in gen.render()
    assert gen.predicted_step_s > plain.predicted_step_s


def test_the_memory_plan_gives_a_judge_on_the_generating_gpus_its_share(tmp_path):
    """vLLM takes reward.served.gpu_memory_utilization of each GPU it shares with generation (the generator pool,
    or every colocated GPU); on a pool of its own it takes nothing of theirs."""
    from verl_digen.config import memory

    model = tmp_path / "judge"
    model.mkdir()
    gib = 80.0
    base = [*QWEN, "model.dtype=bfloat16", f"resources.generator.gpu_memory_gb={gib}",
            f"resources.trainer.gpu_memory_gb={gib}"]
    judge = [f"reward.served.model_path={model}", "reward.served.gpu_memory_utilization=0.4"]

    def parts(over, pool):
        plan = memory.memory_plan(compose([*base, *over]))
        return next(p for p in plan.pools if p.pool == pool).parts.get("reward model", 0.0)

    assert parts(judge, "generator") - parts([], "generator") == pytest.approx(0.4 * gib * 2**30)
    assert parts([*judge, "resources.reward.workers=2"], "generator") == parts([], "generator")
    assert parts([*judge, "trainer=colocated"], "colocated") - parts(["trainer=colocated"], "colocated") == \
        pytest.approx(0.4 * gib * 2**30)


def test_digen_plan_names_the_judge_and_prices_it_in_every_row(tmp_path, capsys):
    """`digen plan` with a config: the judge's line (its GPUs, its price on both sides), and every configuration's
    predicted step grows with the judge's time per image."""
    from verl_digen.cli import main

    model = tmp_path / "judge"
    model.mkdir()
    common = ["plan", "--top", "1", "--policies", "never", "--stalenesses", "0", *QWEN]
    assert main(common) == 0
    plain = capsys.readouterr().out
    judged = [*common, f"reward.served.model_path={model}", "resources.reward.workers=2",
              "reward.served.seconds_per_image=2"]
    assert main(judged) == 0
    out = capsys.readouterr().out
    assert "judge: 2 replica(s) x 1 GPU(s) = 2 GPU(s) on a pool of its own" in out and "judge:" not in plain
    assert "priced at 2 s per image per replica, both sides" in out

    def colocated(text: str) -> float:
        line = next(x for x in text.splitlines() if x.startswith("colocated, all GPUs: "))
        return float(line.split("ideal ")[1].split(" s")[0])

    assert colocated(out) > colocated(plain)


def test_a_measured_profile_already_holds_the_judge_in_its_scoring(tmp_path):
    """A profile a run measured prices scoring as the run's score actions took (the judge's time included when
    it served one): seconds_per_image is not added on top, and the plan says why."""
    from verl_digen.schedule.profile_io import dump_profile

    profile = tmp_path / "measured.json"
    dump_profile(_model(8, 8), profile, name="measured")
    model = tmp_path / "judge"
    model.mkdir()
    shape = [f"digen.profile={profile}", *QWEN[1:]]
    judged = [*shape, f"reward.served.model_path={model}", "reward.served.seconds_per_image=0.5"]
    plan = resource_plan(compose(judged))
    assert plan.predicted_step_s == resource_plan(compose(shape)).predicted_step_s
    assert "priced as the measured profile's scoring" in plan.render()


def test_the_plans_price_the_judges_start_up_once_per_run_and_per_restart_on_both_sides(tmp_path, capsys):
    """reward.served.startup_s (measured): the dry run and `digen plan` say its GPU-seconds for this run and for a
    colocated baseline (its judge on the same pool of its own, or on all its GPUs); unset, they say it is not
    priced."""
    from verl_digen.cli import main
    from verl_digen.config import judge

    model = tmp_path / "judge"
    model.mkdir()
    own = [f"reward.served.model_path={model}", "resources.reward.workers=4", "reward.served.startup_s=40"]
    assert "start-up 40 s (measured), paid once per run and again per restart, both sides: 160 GPU-s here " \
           "(4 GPU(s)), 160 GPU-s for a colocated baseline (4 GPU(s))" in resource_plan(compose([*QWEN, *own])).render()
    gen = compose([*QWEN, f"reward.served.model_path={model}", "reward.served.startup_s=40"])
    assert "320 GPU-s here (8 GPU(s)), 640 GPU-s for a colocated baseline (16 GPU(s))" in resource_plan(gen).render()
    place = judge.placement(gen)
    assert place.startup_gpu_s(8, restarts=2) == 3 * 40 * 8
    unset = resource_plan(compose([*QWEN, f"reward.served.model_path={model}"])).render()
    assert "start-up not priced (set reward.served.startup_s" in unset
    assert main(["plan", "--top", "1", "--policies", "never", "--stalenesses", "0", *QWEN, *own]) == 0
    assert "160 GPU-s here (4 GPU(s)), 160 GPU-s for a colocated baseline" in capsys.readouterr().out
