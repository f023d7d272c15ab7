"""``update_units``: several release units packed into one update, in the scheduler, BTS and the costs."""

from __future__ import annotations

import random

import pytest
from sched_helpers import random_costs

from verl_digen.schedule.actions import UPDATE
from verl_digen.schedule.config import ScheduleConfig, ScheduleConfigError
from verl_digen.schedule.costs import uniform_stage_costs
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.simulator import execute


def _run(cfg: ScheduleConfig, costs, gens: int = 2, ranks: int = 2):
    sched = StepScheduler(cfg, costs, gen_workers=gens, trainer_ranks=ranks)
    return sched, execute(sched, costs)


@pytest.mark.parametrize("units", [1, 2, 4])
def test_every_update_trains_whole_packs_of_units(units):
    # 4 prompts x 4, micro-batches of 2: release units of 2 micro-batches, 4 units per step
    cfg = ScheduleConfig(prompts=4, group_size=4, mb_size=2, steps=2, update_units=units, policy="bts",
                         staleness=0.25)
    sched, tl = _run(cfg, uniform_stage_costs(1.0, 0.5, score=0.1, optimizer_step=0.2))
    updates = [r for r in tl.records if r.kind == UPDATE]
    assert sched.update_size == 2 * units
    assert [r.count for r in updates] == [2 * units] * (2 * 4 // units)
    for s in range(2):  # each update starts only once its last unit is scored
        scored = sorted(r.end for r in tl.records if r.kind == "score" and r.step == s)
        for i, r in enumerate(u for u in updates if u.step == s):
            assert r.start >= scored[(i + 1) * 2 * units - 1] - 1e-9


def test_packing_trades_a_later_first_update_for_fewer_updates():
    base = dict(prompts=4, group_size=4, mb_size=2, steps=1)
    costs = uniform_stage_costs(1.0, 0.5, score=0.1)
    first = {}
    for units in (1, 4):
        _, tl = _run(ScheduleConfig(**base, update_units=units), costs)
        first[units] = min(r.start for r in tl.records if r.kind == UPDATE)
    assert first[4] > first[1]


def test_stage_costs_price_the_packed_update():
    from verl_digen.schedule import presets

    model = presets.get("wan2.1-14b-32").model
    one = ScheduleConfig(prompts=32, group_size=16, mb_size=4, tsp_degree=12).stage_costs(model, 16)
    two = ScheduleConfig(prompts=32, group_size=16, mb_size=4, tsp_degree=12, update_units=2).stage_costs(model, 16)
    assert one.update < two.update < 2 * one.update  # one larger update amortizes the per-pass overhead


def test_random_instances_keep_every_invariant():
    # execute() checks the timeline (each micro-batch trained once, after its unit is scored, TCSS bound)
    rng = random.Random(7)
    ran = 0
    for _ in range(150):
        n = rng.choice([2, 4])
        prompts = rng.choice([2, 4, 6])
        mb = rng.choice([d for d in (1, 2, 4) if n % d == 0])
        units = rng.choice([1, 2, 3])
        cfg = ScheduleConfig(prompts=prompts, group_size=n, mb_size=mb, steps=rng.choice([1, 2]),
                             policy=rng.choice(["never", "adaptive", "bts"]), staleness=rng.choice([0.0, 0.5]),
                             update_units=units)
        gens, ranks = rng.choice([1, 2, 3]), rng.choice([1, 2, 4])
        try:
            cfg.check_update_units(gens)
        except ScheduleConfigError:
            continue
        sched, tl = _run(cfg, random_costs(rng), gens, ranks)
        assert sum(r.count for r in tl.records if r.kind == UPDATE) == cfg.micro_batches * cfg.steps
        ran += 1
    assert ran > 60


@pytest.mark.parametrize("kw, match", [
    (dict(update_units=0), "update_units"),
    (dict(update_units=2, update="micro_batch"), "update 'unit'"),
    (dict(update_units=2, mode="separate", partition="gap"), "mode 'digen'"),
])
def test_bad_update_units_are_named(kw, match):
    with pytest.raises(ScheduleConfigError, match=match) as err:
        ScheduleConfig(prompts=4, group_size=4, mb_size=2, **kw)
    assert err.value.field == "update_units"


def test_units_that_do_not_divide_the_step_are_refused_with_the_count():
    cfg = ScheduleConfig(prompts=3, group_size=4, mb_size=2, update_units=2)  # 3 units per step
    with pytest.raises(ScheduleConfigError, match="does not divide the step's 3 release units"):
        StepScheduler(cfg, uniform_stage_costs(1.0, 1.0), gen_workers=2)
