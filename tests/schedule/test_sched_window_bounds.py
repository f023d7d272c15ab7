"""Per-step fraction of ideal: the window bound never exceeds the measured step, TCSS or not."""

from __future__ import annotations

import random

import pytest

from verl_digen.schedule.actions import GENERATE, OPTIMIZER_STEP, SCORE, UPDATE
from verl_digen.schedule.bounds import step_bounds, step_stage_costs, window_bounds
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import StageCosts
from verl_digen.schedule.policies import parse_policy
from verl_digen.schedule.profiler import Profiler
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.simulator import execute
from verl_digen.schedule.timeline import Record


def _random_run(rng: random.Random, staleness: float, noise: float, seed: int):
    """A random small TCSS run on the virtual clock: (scheduler, timeline) or None if the draw is invalid."""
    G, R = rng.randint(1, 3), rng.randint(1, 2)
    prompts, group = rng.randint(1, 4), rng.choice([2, 3, 4])
    batch = prompts * group
    mb = rng.choice([d for d in range(1, batch + 1) if batch % d == 0])
    policy = rng.choice(["never", "bts", "static:1"])
    try:
        cfg = ScheduleConfig(prompts, group, mb, steps=5, staleness=staleness, policy=policy)
    except ValueError:  # GAP needs mb_size to divide the group size or be a multiple of it
        return None
    costs = StageCosts(
        generate=rng.uniform(0.2, 2), tag_generate=rng.uniform(0.2, 2), score=rng.uniform(0, 1),
        update=rng.uniform(0.1, 2), switch_to_gen=rng.uniform(0, 0.5), switch_to_train=rng.uniform(0, 0.5),
        optimizer_step=rng.uniform(0, 0.5), weight_sync=rng.uniform(0, 0.3), publish=rng.uniform(0, 0.3))
    sched = StepScheduler(cfg, costs, G, parse_policy(policy), Profiler(costs, warmup=1), trainer_ranks=R)
    return sched, costs, execute(sched, costs, noise=noise, seed=seed)


def _windows(timeline):
    """(step, window start, window end): the previous optimizer step's end to this one's."""
    ends = sorted((r.step, r.end) for r in timeline.records if r.kind == OPTIMIZER_STEP)
    return [(s, ends[i - 1][1] if i else 0.0, e) for i, (s, e) in enumerate(ends)]


@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_fraction_of_ideal_never_exceeds_one_on_random_tcss_runs(noise):
    rng = random.Random(20261203)
    checked = tcss_windows = 0
    while checked < 60:
        drawn = _random_run(rng, rng.choice([0.0, 0.25, 0.5, 1.0]), noise, seed=checked)
        if drawn is None:
            continue
        sched, costs, tl = drawn
        checked += 1
        for step, start, end in _windows(tl):
            b = window_bounds(tl.records, step, start, costs, sched.M, sched.G, sched.unit_size,
                              sched.update_size, sched.R)
            assert b.ideal / (end - start) <= 1 + 1e-9, (step, sched.config, b)
            gens = [r for r in tl.records if r.step == step and r.kind == GENERATE]
            tcss_windows += any(r.start < start for r in gens)
    assert tcss_windows > 20  # the draw really holds windows whose generation began before them


def test_the_whole_step_bound_overshoots_a_tcss_window_and_the_window_bound_does_not():
    """The pre-fix per-step ideal (all M generations at mean costs) exceeded the measured TCSS step."""
    rng = random.Random(7)
    worst_whole = 0.0
    for seed in range(40):
        drawn = _random_run(rng, 1.0, 0.0, seed)
        if drawn is None:
            continue
        sched, costs, tl = drawn
        for step, start, end in _windows(tl):
            own = [r for r in tl.records if r.step == step]
            whole = step_bounds(step_stage_costs(own, costs), sched.M, sched.G, unit_size=sched.unit_size,
                                update_size=sched.update_size, trainer_ranks=sched.R)
            worst_whole = max(worst_whole, whole.ideal / (end - start))
            win = window_bounds(tl.records, step, start, costs, sched.M, sched.G, sched.unit_size,
                                sched.update_size, sched.R)
            assert win.ideal <= whole.ideal + 1e-12
    assert worst_whole > 1.05


def _rec(kind: str, start: float, end: float, step: int = 0, worker: str = "gen0") -> Record:
    return Record(worker=worker, kind=kind, mb=0, step=step, version=0, start=start, end=end)


def test_window_bound_counts_only_generation_inside_the_window_at_the_fastest_cost():
    """Hand-computed: M = 2, G = 1, R = 1; one micro-batch generated before the window (stale)."""
    fallback = StageCosts(generate=9.0, tag_generate=100.0, score=9.0, update=9.0, optimizer_step=9.0)
    recs = [
        _rec(GENERATE, 0.0, 1.0),  # before the window: not the window's work
        _rec(GENERATE, 2.0, 5.0), _rec(SCORE, 5.0, 6.0), _rec(SCORE, 6.0, 8.0),
        _rec(UPDATE, 6.0, 7.0, worker="trainer"), _rec(UPDATE, 8.0, 10.0, worker="trainer"),
        _rec(OPTIMIZER_STEP, 10.0, 10.5, worker="trainer"),
        _rec(GENERATE, 3.0, 4.0, step=1),  # the next step's stale generation: not this step's
    ]
    b = window_bounds(recs, 0, 2.0, fallback, micro_batches=2, gen_workers=1)
    # fastest in-window instances: generate 3, score 1, update 1, optimizer step 0.5; one generation
    # gen side (1 - x) x 3 + 1 x 1 + update 1 + opt 0.5 balances the trainer's 100 x + 2 x 1 + 0.5 at
    # x = 3 / 103 of a micro-batch moved to TAG
    assert b.area == pytest.approx(5.5 - 3 * 3 / 103)
    # trainer: 2 updates x 1 + 0.5, no head (a stale micro-batch is ready at the window start)
    assert b.bottleneck == pytest.approx(2.5)
    # chain: min(generate 3, switch 0 + tag 100) + score 1 + update 1 + opt 0.5
    assert b.critical_path == pytest.approx(5.5)
    with pytest.raises(ValueError, match=r"generated micro-batches must lie in \[0, 2\], got 3"):
        step_bounds(fallback, 2, 1, generated=3)


def test_busy_fractions_hand_computed_and_clipped_to_the_window():
    from verl_digen.schedule.bounds import busy_fractions

    recs = [Record("gen0", GENERATE, 0, 0, 0, 0.0, 1.0), Record("gen1", GENERATE, 1, 0, 0, 0.5, 1.0),
            Record("trainer", UPDATE, 0, 0, 0, 0.0, 0.5), Record("tag0", "tag_generate", 1, 0, 0, 0.5, 1.0)]
    gens, trn = ["gen0", "gen1"], ["trainer", "tag0", "tag1"]
    # generators 1.5 of 2 worker-seconds; trainer: the unit holds both ranks for 0.5 s, a slot one rank
    assert busy_fractions(recs, 0.0, 1.0, gens, trn) == {"generator": 0.75, "trainer": 0.75}
    assert busy_fractions(recs, 0.5, 1.0, gens, trn) == {"generator": 1.0, "trainer": 0.5}
    assert busy_fractions(recs, 0.0, 1.0, gens, ["trainer", "tag0"], trainer_ranks=2)["trainer"] == 0.75
    # colocated workers hold one GPU each and are listed as the trainer pool
    assert busy_fractions(recs[:2], 0.0, 1.0, [], ["gen0", "gen1"]) == {"generator": 0.0, "trainer": 0.75}
    assert busy_fractions(recs, 1.0, 1.0, gens, trn) == {"generator": 0.0, "trainer": 0.0}


def test_simulator_and_runtime_share_busy_and_stale_budget_and_stage_costs():
    """pool_busy (the simulator's, whole run) is busy_fractions over the makespan; check_timeline and
    the scheduler read one stale budget; simulate prices a config through ScheduleConfig.stage_costs."""
    from verl_digen.schedule import presets
    from verl_digen.schedule.bounds import busy_fractions, pool_busy
    from verl_digen.schedule.config import stale_budget
    from verl_digen.schedule.simulator import simulate
    from verl_digen.schedule.timeline import TimelineError, check_timeline, gen_worker, tag_slot

    rng = random.Random(3)
    runs = [r for r in (_random_run(rng, 0.5, 0.3, s) for s in range(30)) if r is not None][:8]
    for sched, _, tl in runs:
        gens = [gen_worker(i) for i in range(sched.G)]
        trn = ["trainer", *(tag_slot(j) for j in range(sched.R))]
        assert pool_busy(tl) == pytest.approx(busy_fractions(tl.records, tl.start, tl.makespan, gens, trn, sched.R))
    assert [stale_budget(s, m) for s, m in [(0.5, 3), (1 / 3, 3), (0.25, 8), (0.3, 10), (1.0, 7), (0.0, 9)]] == [
        1, 1, 2, 3, 7, 0]
    # check_timeline holds a run to the budget: a bound whose budget is the run's most stale micro-batches
    # in a step passes, one just under it (a fraction of a micro-batch less) fails
    stale_runs = [(sched, tl) for sched, tl in ((r[0], r[2]) for r in (_random_run(rng, 1.0, 0.3, s)
                                                                          for s in range(60)) if r is not None)
                  if any(rec.stale for rec in tl.records)]
    assert stale_runs
    for sched, tl in stale_runs[:5]:
        per_step: dict[int, int] = {}
        for rec in tl.records:
            if rec.stale and rec.kind in (GENERATE, "tag_generate"):
                per_step[rec.step] = per_step.get(rec.step, 0) + 1
        c, m = max(per_step.values()), sched.M
        check_timeline(tl, staleness_bound=c / m)
        with pytest.raises(TimelineError, match="stale"):
            check_timeline(tl, staleness_bound=(c - 0.5) / m)
    model = presets.get(presets.names()[0]).model
    G = model.generator.workers
    for loop in ("per_sample", "batched"):
        cfg = ScheduleConfig(2, 4, 2, steps=2, tsp_degree=2, train_loop=loop)
        assert simulate(cfg, model).stage_costs == cfg.stage_costs(model, G)
        rows = 2 * cfg.update_size(cfg.make_partition(G).unit_size)
        assert cfg.stage_costs(model, G) == model.stage_costs(2, 2, rows, per_sample=loop == "per_sample")
