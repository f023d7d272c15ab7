"""What keeps ``digen plan`` fast at large GPU counts without changing its answers: release units computed, not
partitioned; TAG counted in whole waves in the planner's bound; the split grid beyond ``EXACT_SPLITS``."""

import random

import pytest

from verl_digen.schedule import split_search
from verl_digen.schedule.bounds import step_bounds, tag_wave_area
from verl_digen.schedule.config import ScheduleConfig, ScheduleConfigError
from verl_digen.schedule.costs import Affine, CostModel, Hardware, Pool, StageCosts
from verl_digen.schedule.policies import parse_policy
from verl_digen.schedule.profile_io import Workload
from verl_digen.schedule.profiler import Profiler
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.simulator import execute


def test_unit_size_is_the_partitions():
    for prompts, n, mb, g in ((4, 8, 2, 3), (4, 8, 8, 5), (4, 8, 16, 2), (3, 6, 1, 7), (2, 4, 4, 1)):
        cfg = ScheduleConfig(prompts=prompts, group_size=n, mb_size=mb)
        part = cfg.make_partition(g)
        assert cfg.unit_size == part.unit_size and cfg.release_unit(g) == part.unit_size
    with pytest.raises(ScheduleConfigError, match="does not divide the step's 2 release units"):
        ScheduleConfig(prompts=2, group_size=4, mb_size=4, update_units=3).check_update_units(2)


def _random_case(rng: random.Random):
    while True:
        G, R, n, prompts = rng.randint(1, 4), rng.randint(1, 4), rng.choice([2, 4, 8]), rng.randint(1, 4)
        mb = rng.choice([d for d in range(1, 2 * n + 1) if (n % d == 0 or d % n == 0) and (prompts * n) % d == 0])
        policy, staleness = rng.choice(["never", "adaptive", "bts"]), rng.choice([0.0, 0.25, 0.5])
        try:
            cfg = ScheduleConfig(prompts=prompts, group_size=n, mb_size=mb, steps=rng.randint(1, 3), policy=policy,
                                 staleness=staleness, update_units=rng.choice([1, 2]))
            cfg.check_update_units(G)
        except ScheduleConfigError:
            continue
        u = rng.uniform
        costs = StageCosts(generate=u(0.2, 3), tag_generate=u(0.2, 6), score=u(0, 0.5), update=u(0.05, 2),
                           switch_to_gen=u(0, 1), switch_to_train=u(0, 1), optimizer_step=u(0, 0.5),
                           weight_sync=u(0, 0.3), publish=u(0, 0.5))
        return cfg, costs, G, R


def test_tag_wave_area_never_exceeds_a_simulated_step_and_is_often_tighter():
    rng, tighter = random.Random(7), 0
    for _ in range(150):
        cfg, costs, G, R = _random_case(rng)
        sched = StepScheduler(cfg, costs, G, parse_policy(cfg.policy), Profiler(costs, warmup=1), trainer_ranks=R)
        step = execute(sched, costs).makespan / cfg.steps
        sync = sched.stale_budget == 0
        wave = tag_wave_area(costs, sched.M, G, cfg.steps, sched.update_size, R, synchronous=sync,
                             mini_batches=cfg.mini_batches, tag=cfg.policy != "never")
        assert wave <= step + 1e-9, (cfg, costs, G, R)
        ideal = step_bounds(costs, sched.M, G, cfg.steps, sched.unit_size, sched.update_size, R,
                            synchronous=sync, mini_batches=cfg.mini_batches).ideal
        tighter += wave > ideal + 1e-9
    assert tighter > 30  # what prunes the planner's search


def test_tag_wave_area_by_hand():
    # 4 micro-batches, 1 generator (2 s each, scoring free), 2 trainer ranks; one TAG micro-batch takes 6 s on a
    # rank and the switches 1 s in all; 4 updates of 0.5 s, no optimizer step
    c = StageCosts(generate=2.0, tag_generate=6.0, score=0.0, update=0.5, switch_to_gen=0.5, switch_to_train=0.5)
    # no TAG: the generator makes all 4 (8 s) plus the last update (0.5 s)
    assert tag_wave_area(c, 4, 1, tag=False) == pytest.approx(8.5)
    # one wave of 2 TAG micro-batches: generators 2 x 2 + 0.5 = 4.5 s; trainer 4 x 0.5 + 6 + 1 = 9 s; the
    # fractional bound would let TAG take a sliver of a micro-batch and come out below both
    assert tag_wave_area(c, 4, 1) == pytest.approx(8.5)
    assert step_bounds(c, 4, 1, trainer_ranks=2).area < 8.5


def test_split_grid_is_fine_at_the_ends_and_geometric_between():
    assert split_search.split_grid(10, 2) == list(range(1, 9))
    grid = split_search.split_grid(1024, 1, coarse=True)
    assert grid[:8] == list(range(1, 9)) and grid[-8:] == list(range(1016, 1024))
    assert len(grid) < 80 and grid == sorted(set(grid))
    assert max(b / a for a, b in zip(grid, grid[1:], strict=False) if a >= 8) <= 1.34  # 1.25, rounded
    assert list(split_search._between([1, 4, 9], 4)) == [2, 3, 4, 5, 6, 7, 8]  # the search drops the grid
    assert list(split_search._between([1, 4, 9], 9)) == [5, 6, 7, 8]


HW = Hardware(generate=Affine(0.5, 1.0), score=Affine(0.0, 0.1), train_pass=Affine(0.3, 0.4))


def test_coarse_search_refines_to_the_exact_best(monkeypatch):
    model = CostModel(Pool(HW, 20), Pool(HW, 20), steps_trained=2, optimizer_step=0.2)
    wl = Workload(prompts=8, group_size=4, mb_size=2, tsp_degree=2, staleness=0.0, steps=2)
    exact = split_search.search(model, wl, 40, policies=("never", "bts"), keep=2)
    monkeypatch.setattr(split_search, "EXACT_SPLITS", 16)
    monkeypatch.setattr(split_search, "FINE_EDGE", 1)
    monkeypatch.setattr(split_search, "SPLIT_RATIO", 1.6)
    said: list[str] = []
    coarse = split_search.search(model, wl, 40, policies=("never", "bts"), keep=2, progress=said.append)
    assert "on 16 of the 39 splits" in said[0] and any(m.startswith("refining") for m in said)
    assert any("splits searched on a grid of 16" in n for n in coarse.notes)
    assert coarse.candidates < exact.candidates
    assert [r.result.step_time for r in coarse.rows] == [r.result.step_time for r in exact.rows]


def test_equal_steps_rank_bts_before_the_adaptive_threshold():
    """A tie between TAG policies goes to BTS (it follows the workload; the adaptive threshold falls behind when
    the batch or the GPUs change: bench/tag_policy_scaling.py); no TAG at all still comes first."""
    from types import SimpleNamespace

    def row(policy: str, step: float = 10.0) -> split_search.PlanRow:
        return split_search.PlanRow(2, 2, 4, policy, 0.0, SimpleNamespace(step_time=step))

    rows = [row("adaptive"), row("bts"), row("never"), row("adaptive", 9.0)]
    assert [r.policy for r in sorted(rows, key=split_search._rank)] == ["adaptive", "never", "bts", "adaptive"]
