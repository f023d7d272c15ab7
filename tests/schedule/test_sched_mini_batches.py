"""Mini-batches (``ScheduleConfig.mini_batches``, ``actor.ppo_mini_batch_size``): an optimizer step per
mini-batch, the mini-batches trained in order, TAG only before the first one's optimizer step."""

from __future__ import annotations

import dataclasses
import random

import pytest
from sched_helpers import random_config, random_costs

from verl_digen.schedule.actions import OPTIMIZER_STEP, SCORE, SWITCH_TO_GEN, SWITCH_TO_TRAIN, TAG_GENERATE, UPDATE
from verl_digen.schedule.bounds import step_bounds
from verl_digen.schedule.colocated import ColocatedScheduler, colocated_costs
from verl_digen.schedule.config import ScheduleConfig, ScheduleConfigError
from verl_digen.schedule.costs import uniform_stage_costs
from verl_digen.schedule.executor import SimBackend, run
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.simulator import execute
from verl_digen.schedule.timeline import TRAINER, TimelineError, check_timeline, record_dict, record_of

POLICIES = ["never", "static:2", "adaptive", "bts"]


def _with_mini_batches(cfg: ScheduleConfig, rng: random.Random, gens: int) -> ScheduleConfig | None:
    for mini in rng.sample([2, 3, 4], 3):
        try:
            out = dataclasses.replace(cfg, mini_batches=mini)
            out.check_update_units(gens)
            return out
        except ScheduleConfigError:
            continue
    return None


@pytest.mark.parametrize("policy", POLICIES)
def test_random_runs_train_mini_batches_in_order_within_their_bounds(policy):
    rng = random.Random(POLICIES.index(policy) + 70)
    ran = 0
    while ran < 20:
        staleness = rng.choice([0.0, 0.5])
        G, R = rng.randint(1, 3), rng.choice([1, 2])
        cfg = _with_mini_batches(random_config(rng, max_mb=12, steps=rng.randint(1, 3), policy=policy,
                                               staleness=staleness), rng, G)
        if cfg is None:
            continue
        ran += 1
        costs = random_costs(rng, ties=ran % 3 == 0)
        sched = StepScheduler(cfg, costs, G, trainer_ranks=R)
        tl = execute(sched, costs, noise=rng.choice([0.0, 0.2]), seed=ran)
        assert tl.mini_batches == cfg.mini_batches
        check_timeline(tl, staleness)  # each mini-batch between its neighbours' optimizer steps, TAG before them
        opts = [r for r in tl.records if r.kind == OPTIMIZER_STEP]
        assert len(opts) == cfg.steps * cfg.mini_batches
        if not rng.random() < 0.5:
            continue
        quiet = StepScheduler(cfg, costs, G, trainer_ranks=R)  # no noise: the bounds' costs are the run's
        step_time = execute(quiet, costs).makespan / cfg.steps
        bounds = step_bounds(costs, quiet.M, G, cfg.steps, quiet.unit_size, quiet.update_size, R,
                             mini_batches=cfg.mini_batches)
        for name, v in bounds.as_dict().items():
            assert step_time >= v - 1e-9, (name, v, step_time, cfg, costs)


def _tagged_run():
    costs = uniform_stage_costs(1.0, 0.3, score=0.1, tag_generate=1.1, optimizer_step=0.2)
    cfg = ScheduleConfig(prompts=4, group_size=2, mb_size=1, steps=2, policy="static:2", mini_batches=2)
    sched = StepScheduler(cfg, costs, 1, trainer_ranks=2)
    return cfg, execute(sched, costs)


def test_tag_stops_at_the_first_mini_batch_step_and_later_updates_wait_for_it():
    cfg, tl = _tagged_run()
    check_timeline(tl)
    for s in range(cfg.steps):
        first = next(r for r in tl.records if r.kind == OPTIMIZER_STEP and r.step == s and r.mini_batch == 0)
        tags = [r for r in tl.records if r.kind == TAG_GENERATE and r.step == s]
        assert tags and all(r.start < first.end for r in tags)
        later = [r for r in tl.records if r.kind == UPDATE and r.step == s and r.mb >= cfg.mini_batch_mbs]
        assert later and all(r.start >= first.end - 1e-9 for r in later)


def test_check_timeline_names_a_mini_batch_out_of_order_and_a_late_tag():
    _, tl = _tagged_run()
    good = list(tl.records)
    first = next(r for r in good if r.kind == OPTIMIZER_STEP and r.step == 0 and r.mini_batch == 0)
    # mini-batch 0's optimizer step moved after everything: mini-batch 1 then trains before it
    moved_step = dataclasses.replace(first, start=1e6, end=1e6 + 1)
    tl.records = [moved_step if r is first else r for r in good]
    with pytest.raises(TimelineError, match="step 0 mini-batch 1: an update starts before mini-batch 0's optimizer"):
        check_timeline(tl)
    tag = next(r for r in good if r.kind == TAG_GENERATE and r.step == 0)
    moved = dataclasses.replace(tag, start=first.end + 1.0, end=first.end + 2.0)
    opened = [dataclasses.replace(r, start=first.end + 0.5, end=first.end + 0.6)
              for r in good if r.worker == TRAINER and r.kind == SWITCH_TO_GEN][:1]
    tl.records = [moved if r is tag else r for r in good] + opened
    with pytest.raises(TimelineError):
        check_timeline(tl)
    tl.records = [r for r in good if r is not first]
    with pytest.raises(TimelineError, match="mini-batch optimizer steps"):
        check_timeline(tl)


def test_separate_mode_trains_each_mini_batch_after_the_whole_batch_is_scored():
    costs = uniform_stage_costs(1.0, 0.3, score=0.1)
    cfg = ScheduleConfig(prompts=4, group_size=2, mb_size=2, steps=1, mode="separate", mini_batches=2)
    sched = StepScheduler(cfg, costs, 2)
    tl = execute(sched, costs)
    check_timeline(tl)
    last_score = max(r.end for r in tl.records if r.kind == SCORE)
    trainer = [(r.kind, r.mb, r.mini_batch, r.count) for r in sorted(tl.records, key=lambda r: r.start)
               if r.worker == TRAINER]
    assert trainer == [(UPDATE, 0, None, 2), (OPTIMIZER_STEP, None, 0, 1), (UPDATE, 2, None, 2),
                       (OPTIMIZER_STEP, None, None, 1)]
    assert min(r.start for r in tl.records if r.kind == UPDATE) >= last_score


def test_colocated_trains_and_steps_per_mini_batch():
    cfg = ScheduleConfig(prompts=4, group_size=2, mb_size=2, steps=1, mode="colocated", mini_batches=2)
    from verl_digen.schedule.costs import CostModel, Hardware, Pool

    model = CostModel(generator=Pool(Hardware("a"), 1), trainer=Pool(Hardware("a"), 1))
    one = colocated_costs(model, cfg.batch)
    two = colocated_costs(model, cfg.batch, mini_batches=2)
    assert two.update == pytest.approx(one.update / 2)
    tl = run(ColocatedScheduler(cfg, ["w0"]), SimBackend(two))
    phases = [(r.kind, r.mb, r.mini_batch, r.samples) for r in tl.records]
    assert phases[:4] == [(SWITCH_TO_GEN, None, None, 0), ("generate", 0, None, 8), (SCORE, 0, None, 8),
                          (SWITCH_TO_TRAIN, None, None, 0)]
    assert phases[4:] == [(UPDATE, 0, None, 4), (OPTIMIZER_STEP, None, 0, 0), (UPDATE, 0, None, 4),
                          (OPTIMIZER_STEP, None, None, 0)]
    assert tl.step_ends() == [tl.records[-1].end]


@pytest.mark.parametrize(("kw", "match"), [
    ({"prompts": 4, "group_size": 2, "mb_size": 1, "mini_batches": 3}, "3 mini-batches do not cut"),
    ({"prompts": 2, "group_size": 2, "mb_size": 4, "mini_batches": 2}, "2 mini-batches do not cut"),
    ({"prompts": 2, "group_size": 2, "mb_size": 1, "mini_batches": 0}, "mini_batches must be a positive"),
])
def test_mini_batches_that_do_not_cut_the_step_evenly_are_refused(kw, match):
    with pytest.raises(ScheduleConfigError, match=match):
        ScheduleConfig(**kw)


def test_mini_batches_must_hold_whole_updates():
    cfg = ScheduleConfig(prompts=4, group_size=2, mb_size=1, mini_batches=2, update_units=4)
    with pytest.raises(ScheduleConfigError, match="do not hold whole updates of 8"):
        cfg.check_update_units(1)


def test_a_mini_batch_optimizer_step_names_its_mini_batch_not_a_micro_batch():
    """``mb`` is a micro-batch, ``mini_batch`` a mini-batch's optimizer step: one meaning each, in the actions,
    the records and the timeline files; a file of earlier versions (the index in ``mb``) reads back the same."""
    _, tl = _tagged_run()
    opts = [r for r in tl.records if r.kind == OPTIMIZER_STEP and r.step == 0]
    assert [(r.mb, r.mini_batch) for r in opts] == [(None, 0), (None, None)]
    assert {r.mini_batch for r in tl.records if r.kind != OPTIMIZER_STEP} == {None}
    first = opts[0]
    assert record_of(record_dict(first)) == first
    old = {k: v for k, v in record_dict(first).items() if k != "mini_batch"} | {"mb": 0}
    assert record_of(old) == first
    assert tl.step_ends() == sorted(r.end for r in tl.records if r.kind == OPTIMIZER_STEP and r.mini_batch is None)
