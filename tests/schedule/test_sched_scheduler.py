"""The two-queue state machine under the simulator: invariants, TCSS, bounds, executor API, errors."""

from __future__ import annotations

import dataclasses
import random

import pytest
from sched_helpers import random_config, random_costs

from verl_digen.schedule.actions import Action
from verl_digen.schedule.bounds import step_bounds
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import CostModel, Hardware, Pool, StageCosts, uniform_stage_costs
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.simulator import execute
from verl_digen.schedule.timeline import Record, TimelineError, check_timeline

POLICIES = ["never", "static:1", "static:3", "adaptive", "bts"]


def _run(cfg, costs, G, noise=0.0, seed=0, R=1):
    sched = StepScheduler(cfg, costs, G, trainer_ranks=R)
    tl = execute(sched, costs, noise=noise, seed=seed)
    return sched, tl


@pytest.mark.parametrize("policy", POLICIES)
def test_invariants_hold_on_random_runs(policy):
    rng = random.Random(POLICIES.index(policy))  # reproducible: hash() of a str is salted per process
    for i in range(25):
        staleness = rng.choice([0.0, 0.25, 0.5, 1.0])
        cfg = random_config(rng, max_mb=12, steps=rng.randint(1, 3), policy=policy, staleness=staleness)
        costs = random_costs(rng, ties=i % 3 == 0)
        _, tl = _run(cfg, costs, rng.randint(1, 4), noise=rng.choice([0.0, 0.2]), seed=i, R=rng.choice([1, 2, 4]))
        check_timeline(tl, staleness)  # once each, scoring first, one version per trajectory, staleness


def test_tcss_generates_stale_work_within_the_bound_and_helps():
    costs = uniform_stage_costs(1.0, 0.6, score=0.1, optimizer_step=0.5, weight_sync=0.3)
    base = ScheduleConfig(prompts=16, group_size=2, mb_size=1, steps=4, policy="never")
    _, tl0 = _run(base, costs, 4)
    for bound in (0.125, 0.25, 0.5):
        cfg = dataclasses.replace(base, staleness=bound)
        _, tl = _run(cfg, costs, 4)
        check_timeline(tl, bound)
        stale = [r for r in tl.records if r.stale]
        assert stale, "TCSS never used its budget"
        per_step = {}
        for r in stale:
            per_step[r.step] = per_step.get(r.step, 0) + 1
            assert r.version == r.step - 1
        assert max(per_step.values()) <= bound * cfg.micro_batches
        assert tl.makespan < tl0.makespan
        with pytest.raises(TimelineError, match="stale"):
            check_timeline(tl, 0.0)


def test_scoring_has_priority_over_generation():
    # a slow score and many generators: every idle generator must take pending scoring first
    costs = uniform_stage_costs(1.0, 0.2, score=0.7, tag_generate=1.0)
    cfg = ScheduleConfig(prompts=6, group_size=2, mb_size=1, policy="static:2")
    _, tl = _run(cfg, costs, 3)
    check_timeline(tl)
    tampered = list(tl.records)
    # swap a score and a later generation on one worker: generation would jump the Scoring Queue
    recs = sorted((r for r in tampered if r.worker == "gen0"), key=lambda r: r.start)
    sc = next(i for i, r in enumerate(recs) if r.kind == "score")
    gen_after = next(r for r in recs[sc:] if r.kind == "generate")
    d = recs[sc].duration
    moved_gen = dataclasses.replace(gen_after, start=recs[sc].start, end=recs[sc].start + gen_after.duration)
    moved_sc = dataclasses.replace(recs[sc], start=moved_gen.end, end=moved_gen.end + d)
    tl.records = [r for r in tampered if r is not recs[sc] and r is not gen_after] + [moved_gen, moved_sc]
    with pytest.raises(TimelineError):
        check_timeline(tl)


def test_check_timeline_catches_duplicates_losses_and_version_mixing():
    costs = uniform_stage_costs(1.0, 0.3, score=0.1, weight_sync=0.2)
    cfg = ScheduleConfig(prompts=4, group_size=2, mb_size=1, steps=2, policy="never")
    _, tl = _run(cfg, costs, 2)
    check_timeline(tl)
    good = list(tl.records)
    upd = next(r for r in good if r.kind == "update")
    tl.records = good + [dataclasses.replace(upd, start=1e6, end=1e6 + 1)]
    with pytest.raises(TimelineError, match="updated 2 times"):
        check_timeline(tl)
    tl.records = [r for r in good if r is not upd]
    with pytest.raises(TimelineError, match="updated 0 times"):
        check_timeline(tl)
    gen = next(r for r in good if r.kind == "generate" and r.step == 1)
    tl.records = [r if r is not gen else dataclasses.replace(r, version=0) for r in good]
    with pytest.raises(TimelineError, match="version"):
        check_timeline(tl)
    sync = next(r for r in good if r.kind == "weight_sync" and r.worker == gen.worker)
    straddle = dataclasses.replace(gen, start=sync.start - 0.1, end=sync.start + 0.1)
    tl.records = [r if r is not gen else straddle for r in good]
    with pytest.raises(TimelineError):
        check_timeline(tl)


def test_simulated_step_time_respects_every_lower_bound():
    rng = random.Random(11)
    for i in range(40):
        policy = rng.choice(POLICIES)
        steps = rng.randint(1, 3)
        cfg = random_config(rng, max_mb=12, steps=steps, policy=policy,
                            staleness=rng.choice([0.0, 0.5]))
        costs = random_costs(rng, ties=i % 2 == 0)
        G = rng.randint(1, 4)
        sched, tl = _run(cfg, costs, G)
        step_time = tl.makespan / steps
        for sync in {False, sched.stale_budget == 0}:  # the synchronous bounds hold without TCSS
            b = step_bounds(costs, sched.M, G, steps, sched.unit_size, sched.update_size, synchronous=sync)
            for name, v in b.as_dict().items():
                assert step_time >= v - 1e-9, (name, sync, v, step_time, cfg, costs)


def test_separate_mode_waits_for_the_whole_batch():
    costs = uniform_stage_costs(1.0, 0.3, score=0.1)
    cfg = ScheduleConfig(prompts=4, group_size=2, mb_size=2, mode="separate", partition="batch")
    _, tl = _run(cfg, costs, 2)
    check_timeline(tl)
    last_score = max(r.end for r in tl.records if r.kind == "score")
    first_update = min(r.start for r in tl.records if r.kind == "update")
    assert first_update >= last_score - 1e-12


def test_group_must_be_complete_before_update():
    costs = uniform_stage_costs(1.0, 0.1, score=0.1)
    cfg = ScheduleConfig(prompts=3, group_size=4, mb_size=1)
    sched, tl = _run(cfg, costs, 2)
    score_end = {r.mb: r.end for r in tl.records if r.kind == "score"}
    for r in tl.records:
        if r.kind == "update":
            unit = r.mb // sched.unit_size
            members = range(unit * sched.unit_size, (unit + 1) * sched.unit_size)
            assert r.start >= max(score_end[m] for m in members) - 1e-12


def test_executor_api_with_wall_clock_style_events():
    """The runtime's way: arbitrary durations, one completion at a time, measured durations."""
    costs = uniform_stage_costs(1.0, 0.2, score=0.1, switch_to_gen=0.1, switch_to_train=0.1, weight_sync=0.2)
    cfg = ScheduleConfig(prompts=4, group_size=2, mb_size=1, steps=2, policy="bts", staleness=0.25)
    sched = StepScheduler(cfg, costs, 2)
    rng = random.Random(3)
    running: list[tuple[float, Action]] = []
    now = 100.0  # wall clocks do not start at zero
    for a in sched.start(now):
        running.append((now + rng.uniform(0.5, 1.5) * costs.duration(a.kind), a))
    while not sched.done:
        running.sort(key=lambda x: x[0])
        end, a = running.pop(0)
        now = end
        sched.on_complete(a, end)
        for b in sched.next_actions(now):
            assert b.samples or b.mb is None
            running.append((now + rng.uniform(0.5, 1.5) * costs.duration(b.kind), b))
    check_timeline(sched.timeline, 0.25)
    assert sched.profiler.counts()["generate"] > 0
    with pytest.raises(ValueError, match="not running"):
        sched.on_complete(Action("update", ("trainer",), 0, 0, 0), now)


def test_profiler_estimates_converge_and_drive_bts():
    true = uniform_stage_costs(2.0, 0.2, score=0.1)
    prior = uniform_stage_costs(1.0, 1.0, score=0.1)
    cfg = ScheduleConfig(prompts=8, group_size=2, mb_size=1, steps=2, policy="bts")
    sched = StepScheduler(cfg, prior, 2)
    execute(sched, true)
    est = sched.costs
    assert est.generate == pytest.approx(2.0) and est.update == pytest.approx(0.2)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ScheduleConfig(prompts=3, group_size=2, mb_size=4), "does not divide"),
        (lambda: ScheduleConfig(prompts=2, group_size=2, mb_size=1, staleness=1.5), "staleness"),
        (lambda: ScheduleConfig(prompts=2, group_size=2, mb_size=1, staleness=-0.1), "staleness"),
        (lambda: ScheduleConfig(prompts=2, group_size=2, mb_size=1, policy="greedy"), "unknown TAG policy"),
        (lambda: ScheduleConfig(prompts=2, group_size=2, mb_size=1, policy="static"), "static"),
        (lambda: ScheduleConfig(prompts=2, group_size=2, mb_size=1, mode="hybrid"), "unknown mode"),
        (lambda: ScheduleConfig(prompts=2, group_size=4, mb_size=1, partition="batch"), "whole prompts"),
        (lambda: StepScheduler(ScheduleConfig(prompts=2, group_size=2, mb_size=1), StageCosts(1, 1, 1, 1), 0),
         "at least one worker"),
        (lambda: StageCosts(generate=-1.0, tag_generate=1, score=0, update=1), ">= 0"),
        (lambda: Pool(Hardware(), 0), "at least one worker"),
        (lambda: CostModel(Pool(Hardware(), 1), Pool(Hardware(), 1), optimizer_step=-2), ">= 0"),
    ],
)
def test_invalid_configurations_fail_clearly(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_records_are_immutable_values():
    r = Record("gen0", "generate", 0, 0, 0, 0.0, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.end = 2.0  # type: ignore[misc]


def _view_from_log(sched: StepScheduler, launched: list[Action], completed: list[Action], now: float):
    """The scheduler's neutral view at ``now`` rebuilt only from the actions launched and completed so
    far and the TAG decisions taken (an oracle independent of the scheduler's own bookkeeping)."""
    from collections import Counter

    from verl_digen.schedule.actions import (
        GENERATE,
        OPTIMIZER_STEP,
        PUBLISH,
        SCORE,
        SWITCH_TO_GEN,
        SWITCH_TO_TRAIN,
        TAG_GENERATE,
        UPDATE,
        WEIGHT_SYNC,
    )
    from verl_digen.schedule.tag_policy import GeneratorView, SchedulerView

    done = {id(a) for a in completed}
    busy = {w: a for a in launched if id(a) not in done for w in a.workers}
    ts = sum(a.kind == OPTIMIZER_STEP for a in completed)
    has_next = ts + 1 < sched.config.steps
    published = max((a.version for a in completed if a.kind == PUBLISH), default=0)
    costs, M, unit = sched.costs, sched.M, sched.unit_size
    gens = []
    for w in sched.gens:
        held = max((a.version for a in completed if a.kind == WEIGHT_SYNC and a.worker == w), default=0)
        a = busy.get(w)
        if a is None:
            gens.append(GeneratorView(None, lagging=held < published))
            continue
        sync, current = a.kind == WEIGHT_SYNC, a.step == ts
        gens.append(GeneratorView(a.kind, max(0.0, a.start + costs.duration(a.kind) - now),
                                  next_step=not sync and not current,
                                  micro_batch=a.mb if current and not sync else None,
                                  lagging=(a.version if sync else held) < published))

    def generated(step: int, acts: list[Action]) -> list[Action]:
        return [a for a in acts if a.kind in (GENERATE, TAG_GENERATE) and a.step == step]

    def waiting_to_score(step: int) -> list[int]:
        started = {a.mb for a in launched if a.kind == SCORE and a.step == step}
        return sorted(a.mb for a in generated(step, completed) if a.mb not in started)

    scored = Counter(a.mb // unit for a in completed if a.kind == SCORE and a.step == ts)
    released = unit * sum(n == unit for n in scored.values())
    tag_decided = sum(d.slots for d in sched.decisions if d.step == ts)
    tag_launched = sum(a.kind == TAG_GENERATE for a in generated(ts, launched))
    switches = [a.kind for a in completed if a.kind in (SWITCH_TO_GEN, SWITCH_TO_TRAIN)]
    budget = sched.config.stale_budget()
    ahead = sum(a.stale for a in generated(ts + 1, launched))
    return SchedulerView(
        dispatched=len(generated(ts, launched)) + tag_decided - tag_launched,
        generators=tuple(gens),
        scoring_queue=tuple(waiting_to_score(ts)),
        next_step_scoring=len(waiting_to_score(ts + 1)) if has_next else 0,
        scored_per_unit={u: n for u, n in sorted(scored.items()) if n < unit},
        update_queue=released - sum(a.count for a in launched if a.kind == UPDATE and a.step == ts),
        not_updated=M - sum(a.count for a in completed if a.kind == UPDATE and a.step == ts),
        trainer_generating=bool(switches) and switches[-1] == SWITCH_TO_GEN,
        stale_budget_left=budget - ahead if has_next and budget else 0,
        next_step_undispatched=M - len(generated(ts + 1, launched)) if has_next else 0,
        tag_slots=sched.R,
        busy_slots=tuple((max(0.0, a.start + costs.tag_generate - now), a.mb)
                         for a in (busy.get(w) for w in sched.slots) if a is not None),
    )


def test_scheduler_view_equals_the_view_rebuilt_from_the_action_log():
    """After every round of launches of jittered TCSS runs with TAG (several slots, generators picking up
    new versions, TAG reserved behind a switch): ``snapshot`` equals the view rebuilt from the actions."""
    from verl_digen.schedule.executor import SimBackend

    rng = random.Random(23)
    # (next-step micro-batches never wait to be scored here: generating ahead starts once the step is fully
    # dispatched, so no later current-step output can take the idle generator that finished one first)
    seen = dict.fromkeys(("lagging", "busy_slots", "next_step", "reserved", "generating", "stale_left",
                          "partial_unit"), 0)
    for seed in range(40):
        cfg = random_config(rng, max_mb=10, steps=3, policy=rng.choice(["bts", "static:2", "adaptive:0.5"]),
                            staleness=rng.choice([0.0, 0.5, 1.0]))
        costs = random_costs(rng, ties=rng.random() < 0.5)
        sched = StepScheduler(cfg, costs, rng.randint(1, 3), trainer_ranks=rng.choice([1, 2, 3]))
        backend = SimBackend(costs, noise=0.3, seed=seed)
        launched: list[Action] = []
        completed: list[Action] = []
        for a in sched.start(backend.now()):
            backend.launch(a)
            launched.append(a)
        while not sched.done:
            finished, now = backend.wait()
            for c in finished:
                sched.on_complete(c.action, c.end)
                completed.append(c.action)
            for a in sched.next_actions(now):
                backend.launch(a)
                launched.append(a)
            if sched.train_step >= cfg.steps:
                continue
            view = sched.snapshot(now)
            view = dataclasses.replace(view, scoring_queue=tuple(sorted(view.scoring_queue)))  # a heap
            assert view == _view_from_log(sched, launched, completed, now), (seed, now)
            seen["lagging"] += any(g.lagging for g in view.generators)
            seen["busy_slots"] += bool(view.busy_slots)
            seen["next_step"] += any(g.next_step for g in view.generators)
            seen["reserved"] += view.dispatched > sum(a.step == sched.train_step and a.mb is not None
                                                      and a.kind in ("generate", "tag_generate") for a in launched)
            seen["generating"] += view.trainer_generating
            seen["stale_left"] += 0 < view.stale_budget_left < cfg.stale_budget()
            seen["partial_unit"] += bool(view.scored_per_unit)
    assert min(seen.values()) > 3, seen


@pytest.mark.parametrize("staleness", [0.0, 0.5])
def test_the_scheduler_holds_the_state_of_two_steps_however_long_the_run(staleness):
    """Per-step state is made when a step is first touched and dropped at its optimizer step (a long run's
    driver must not grow with it); a finished step reads as all handed out, so nothing is generated twice."""
    from verl_digen.schedule.executor import SimBackend, run

    cfg = ScheduleConfig(prompts=4, group_size=2, mb_size=2, steps=30, staleness=staleness, policy="bts")
    costs = uniform_stage_costs(1.0, 0.8, score=0.1, optimizer_step=0.2, weight_sync=0.2)
    sched = StepScheduler(cfg, costs, 2, trainer_ranks=2)
    held = []

    def on_complete(c) -> None:
        held.append((len(sched._live), len(sched._sq)))

    run(sched, SimBackend(costs), on_complete)  # check=True: the whole timeline's invariants
    assert max(h[0] for h in held) <= 2 and max(h[1] for h in held) <= 3
    assert sched._live == {} and sched._step(0).next == sched.M
