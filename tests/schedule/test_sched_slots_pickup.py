"""TAG slots (each trainer rank generates on its own), per-worker weight pickup (no global drain), the
colocated baseline as a scheduler, and the one executor loop that checks every run's timeline."""

from __future__ import annotations

import dataclasses
import random

import pytest
from sched_helpers import random_config, random_costs

from verl_digen.schedule.colocated import PHASES, ColocatedScheduler, colocated_costs
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import Affine, CostModel, Hardware, Pool, uniform_stage_costs
from verl_digen.schedule.executor import SimBackend, run
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.simulator import execute, simulate
from verl_digen.schedule.timeline import TimelineError, check_timeline, is_tag_slot


def _records(tl, kind):
    return [r for r in tl.records if r.kind == kind]


def test_trainer_ranks_are_independent_tag_slots():
    # a fast trainer and slow generation: every rank should take a micro-batch of its own at once
    costs = uniform_stage_costs(1.0, 0.05, score=0.05, switch_to_gen=0.1, switch_to_train=0.1)
    cfg = ScheduleConfig(prompts=12, group_size=1, mb_size=1, policy="bts")
    sched = StepScheduler(cfg, costs, 2, trainer_ranks=3)
    tl = execute(sched, costs)
    tags = _records(tl, "tag_generate")
    assert {r.worker for r in tags} == {"tag0", "tag1", "tag2"}
    starts = {}
    for r in tags:
        starts.setdefault(r.start, set()).add(r.worker)
    assert max(len(ws) for ws in starts.values()) == 3  # three slots generating side by side
    assert sum(d.slots for d in sched.decisions) == len(tags)  # every TAG micro-batch was decided
    # three slots beat one: the same step with a single trainer rank is slower
    one = StepScheduler(cfg, costs, 2, trainer_ranks=1)
    assert tl.makespan < execute(one, costs).makespan - 0.5


def test_a_decision_may_use_fewer_slots_than_are_free():
    """BTS's decision space is 0..free: on random instances it sometimes starts fewer than all."""
    rng = random.Random(11)
    partial = 0
    for _ in range(60):
        cfg = random_config(rng, max_mb=10, policy="bts")
        costs = random_costs(rng)
        sched = StepScheduler(cfg, costs, rng.randint(1, 3), trainer_ranks=rng.choice([2, 3]))
        check_timeline(execute(sched, costs))
        partial += any(0 < d.slots < min(d.free_slots, d.undispatched) for d in sched.decisions)
    assert partial > 0


def test_check_timeline_rejects_tag_outside_generation_mode():
    costs = uniform_stage_costs(1.0, 0.05, score=0.05, switch_to_gen=0.1, switch_to_train=0.1)
    cfg = ScheduleConfig(prompts=8, group_size=1, mb_size=1, policy="static:2")
    tl = execute(StepScheduler(cfg, costs, 1, trainer_ranks=2), costs)
    tag = _records(tl, "tag_generate")[0]
    switch = _records(tl, "switch_to_gen")[0]
    early = dataclasses.replace(tag, start=switch.start - 0.05, end=switch.start + 0.95)  # before the switch ends
    broken = dataclasses.replace(tl, records=[early if r is tag else r for r in tl.records])
    with pytest.raises(TimelineError, match="outside the trainer's generation mode"):
        check_timeline(broken)
    # a training action while in generation mode is caught too
    upd = _records(tl, "update")[0]
    inside = dataclasses.replace(upd, start=switch.end + 0.01, end=switch.end + 0.02)
    broken = dataclasses.replace(tl, records=[inside if r is upd else r for r in tl.records])
    with pytest.raises(TimelineError):
        check_timeline(broken)


def test_weight_pickup_is_per_generator_and_nobody_drains():
    # generators out of phase (scores of uneven length): each picks up at its own boundary
    costs = uniform_stage_costs(1.0, 0.3, score=0.1, optimizer_step=0.2, weight_sync=0.4, publish=0.1)
    cfg = ScheduleConfig(prompts=6, group_size=2, mb_size=1, steps=3, staleness=0.5)
    sched = StepScheduler(cfg, costs, 3)
    tl = execute(sched, costs, noise=0.3, seed=2)
    pickups = _records(tl, "weight_sync")
    publishes = {r.version: r for r in _records(tl, "publish")}
    assert set(publishes) == {1, 2}  # the final version is never published: nobody generates with it
    assert pickups and all(r.worker.startswith("gen") for r in pickups)
    for r in pickups:
        assert r.start >= publishes[r.version].end - 1e-9
    # no drain: while a generator picks up, another one keeps working
    busy_elsewhere = [p for p in pickups
                      if any(o.worker != p.worker and o.worker.startswith("gen") and o.start < p.end and o.end > p.start
                             and o.kind in ("generate", "score") for o in tl.records)]
    assert busy_elsewhere
    # and the trainer goes on after publishing without waiting for any pickup
    trainer = sorted((r for r in tl.records if r.worker == "trainer"), key=lambda r: r.start)
    after_publish = [b for a, b in zip(trainer, trainer[1:]) if a.kind == "publish"]
    assert any(b.start < max(p.end for p in pickups if p.version == b.step) for b in after_publish)


def test_a_generator_never_generates_with_an_old_version_once_a_new_one_is_published():
    rng = random.Random(4)
    for _ in range(30):
        cfg = random_config(rng, max_mb=8, steps=3, policy=rng.choice(["never", "bts"]),
                            staleness=rng.choice([0.0, 0.5, 1.0]))
        costs = random_costs(rng)
        tl = execute(StepScheduler(cfg, costs, rng.randint(1, 3), trainer_ranks=rng.choice([1, 2])), costs)
        published = sorted((r.end, r.version) for r in _records(tl, "publish"))
        for r in _records(tl, "generate"):
            newest = max((v for end, v in published if end <= r.start + 1e-12), default=0)
            assert r.version >= newest, (r, newest)


def test_colocated_scheduler_runs_its_phases_on_every_worker():
    hw = Hardware(generate=Affine(0.5, 1.0), score=Affine(0.0, 0.1), train_pass=Affine(0.2, 0.3))
    model = CostModel(Pool(hw, 2), Pool(hw, 2), steps_trained=2, switch_to_gen=0.3, switch_to_train=0.2,
                      optimizer_step=0.1)
    cfg = ScheduleConfig(prompts=4, group_size=2, mb_size=2, steps=2, mode="colocated", partition="batch")
    workers = ["col0", "col1", "col2", "col3"]
    tl = run(ColocatedScheduler(cfg, workers), SimBackend(colocated_costs(model, cfg.batch)))
    phases = model.colocated_phases(cfg.batch)
    assert tl.makespan == pytest.approx(2 * sum(phases.values()))
    for w in workers:
        kinds = [r.kind for r in sorted(tl.by_worker()[w], key=lambda r: r.start)]
        assert kinds == list(PHASES) * 2
    assert simulate(cfg, model).step_time == pytest.approx(sum(phases.values()))
    with pytest.raises(ValueError, match="colocated"):
        ColocatedScheduler(dataclasses.replace(cfg, mode="digen", partition="gap"), workers)


class _Mislabel(StepScheduler):
    """A broken scheduler: claims its TAG output came from an older policy version."""

    def next_actions(self, now):
        out = super().next_actions(now)
        for a in out:
            if a.kind == "tag_generate":
                a.version -= 1
        return out


def test_the_executor_loop_checks_every_run():
    costs = uniform_stage_costs(1.0, 0.05, score=0.05)
    cfg = ScheduleConfig(prompts=6, group_size=1, mb_size=1, steps=2, policy="static:2")
    with pytest.raises(TimelineError, match="version"):
        run(_Mislabel(cfg, costs, 1, trainer_ranks=2), SimBackend(costs))
    tl = run(_Mislabel(cfg, costs, 1, trainer_ranks=2), SimBackend(costs), check=False)
    assert any(is_tag_slot(r.worker) for r in tl.records)


def test_free_tag_generation_at_time_zero_is_not_a_scoring_violation():
    """A TAG slot whose generation costs nothing finishes at the instant the generators are dispatched;
    it was not there to be scored first (this used to fail check_timeline)."""
    m = CostModel(Pool(Hardware(generate=Affine(0, 0.014), score=Affine(0, 0.0015)), 1),
                  Pool(Hardware(train_pass=Affine(0, 0.0015)), 1), steps_trained=6)
    cfg = ScheduleConfig(prompts=4, group_size=4, mb_size=4, tsp_degree=6, policy="bts", steps=3)
    r = simulate(cfg, m)
    assert r.step_time > 0 and any(rec.kind == "tag_generate" for rec in r.timeline.records)
